import os

# The DSL reads CUTE_DSL_ARCH once, at the first `import cutlass`.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cute_kernels  # noqa: E402,F401


def pytest_terminal_summary(terminalreporter):
    from seeding import RUN_SEED

    terminalreporter.write_line(f"random inputs of the GPU tests: seed {RUN_SEED} (CUTE_KERNELS_SEED={RUN_SEED} replays them)")
