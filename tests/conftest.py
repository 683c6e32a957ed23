import os

# The DSL reads CUTE_DSL_ARCH once, at the first `import cutlass`.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
# One seed for the whole run (tests/seeding.py), drawn here so that pytest-xdist's workers, started later from this
# process's environment, draw the cases of the seed the summary prints
if not os.environ.get("CUTE_KERNELS_SEED"):  # (unset or empty)
    os.environ["CUTE_KERNELS_SEED"] = str(int.from_bytes(os.urandom(4), "little"))

import cute_kernels  # noqa: E402,F401


def pytest_terminal_summary(terminalreporter):
    from seeding import RUN_SEED

    terminalreporter.write_line(f"random inputs of the tests: seed {RUN_SEED} (CUTE_KERNELS_SEED={RUN_SEED} replays them)")
