import pytest
import subprocess
import sys


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cute_kernels", *args], capture_output=True, text=True, timeout=600)


def test_info():
    r = _run("info")
    assert r.returncode == 0, r.stderr
    assert "sm_90a" in r.stdout and "nvidia-cutlass-dsl 4.8.1" in r.stdout
    assert "NOT SUPPORTED" not in r.stdout
    import os

    import cute_kernels  # (which checkout runs: a clone beside an editable install; a newcomer's finding)
    assert f"({os.path.dirname(os.path.abspath(cute_kernels.__file__))})" in r.stdout.splitlines()[0], r.stdout


def test_compile_reports_each_target_as_it_finishes(monkeypatch, tmp_path, capsys):
    """Each target's line is out before the next target builds (session 71: they were all printed at the end)."""
    import dataclasses

    from cute_kernels import cli
    from cute_kernels.kernels import scale
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    printed_before_build = []

    def watched(build):
        def run():
            printed_before_build.append(capsys.readouterr().out)
            return build()
        return run

    targets = [dataclasses.replace(t, build=watched(t.build)) for t in scale.compile_targets()[:2]]
    monkeypatch.setattr(scale, "compile_targets", lambda: targets)
    assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
    assert len(printed_before_build) == 2 and "ok   scale" not in printed_before_build[0]
    assert printed_before_build[1].count("ok   scale") == 1, printed_before_build


def test_compile_list_names_targets_and_compiles_nothing(monkeypatch, tmp_path, capsys):
    """`compile --list` (a newcomer asked how to see what `compile` builds): one line per target with whether the
    disk cache holds it, then the count; nothing compiled or written."""
    from cute_kernels import cli, registry
    from cute_kernels.kernels import scale
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    assert cli.main(["compile", "--kernel", "scale", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    labels = [t.label for t in scale.compile_targets()]
    assert [line.split("  ")[1] for line in out[:-1]] == labels
    assert all(line.endswith("(not cached)") for line in out[:-1]), out
    assert out[-1] == f"{len(labels)} compile targets for sm_90a, 0 in the disk cache"
    assert not any(tmp_path.iterdir())  # (nothing compiled into the empty cache)
    scale.compile_targets()[0].build()  # one entry on disk: listed as cached
    assert cli.main(["compile", "--kernel", "scale", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("(cached)") and out[1].endswith("(not cached)") and out[-1].endswith(", 1 in the disk cache")
    total = sum(len(registry.module(n).compile_targets()) for n in registry.names())
    assert cli.main(["compile", "--list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{total} compile targets for sm_90a")


def test_output_is_line_buffered_when_piped():
    """Piped or logged, each line comes as it is printed (session 71: `compile`'s lines all came at its end, so a
    CI log looked hung), and a bare `cute-kernels` names what is missing as COMMAND, not argparse's `cmd`."""
    code = ("import sys; from cute_kernels.cli import main; main(['info']); "
            "print(sys.stdout.line_buffering, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "True", r.stderr
    r = _run()
    assert r.returncode == 2 and "the following arguments are required: COMMAND" in r.stderr, r.stderr


def test_info_flags_an_unsupported_target_arch():
    import os

    r = subprocess.run([sys.executable, "-m", "cute_kernels", "info"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, CUTE_DSL_ARCH="sm_100a"))
    assert r.returncode == 0, r.stderr
    assert "sm_100a (CUTE_DSL_ARCH)  NOT SUPPORTED" in r.stdout


def test_warnings_print_their_message_only():
    """A warning on the command line is one line with its message, not the library's source line."""
    import os

    r = subprocess.run([sys.executable, "-m", "cute_kernels", "info"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, CUTE_KERNELS_CACHE="maybe"))
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["cute-kernels: UserWarning: CUTE_KERNELS_CACHE='maybe' is not one of 0/false/no/off/(empty) or "
                     "1/true/yes/on: taken as on"], r.stderr


def test_compile_one_kernel():
    r = _run("compile", "--kernel", "scale", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3/3 configs compiled for sm_90a" in r.stdout
    assert "ld.global.v4" in r.stdout


@pytest.mark.parametrize("cmd", ["compile", "check", "bench"])
def test_unknown_kernel_is_an_error(cmd):
    r = _run(cmd, "--kernel", "nope")  # bench too, before it looks for a GPU; status 2 as configs/tune/layouts
    assert r.returncode == 2 and "unknown kernel" in r.stderr
    assert "no CUDA GPU" not in r.stdout  # the bad name is the first thing said (check without a GPU)


def test_kernel_help_names_every_registered_kernel():
    from cute_kernels import registry
    from cute_kernels.cli import KERNEL_HELP

    assert sorted(KERNEL_HELP.split(": ", 1)[1].split(", ")) == sorted(registry.names())
    r = _run("compile", "--help")
    assert r.returncode == 0 and "ranker_bwd" in r.stdout


def test_compile_into_an_unwritable_cache_folder_is_an_error(tmp_path):
    """compile exists to fill the disk cache: a folder it cannot write is exit status 1 (was 0 with a
    warning); info says the cache is not usable (newcomer review)."""
    import os

    blocker = tmp_path / "file"
    blocker.write_text("")
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(blocker / "cache"))  # below a file: cannot be created
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "compile", "--kernel", "scale", "--quiet"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 1 and f"is not writable ({blocker} is not a folder)" in r.stderr, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "info"], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0 and "NOT USABLE" in r.stdout, r.stdout + r.stderr


def test_info_reports_a_folder_where_nothing_can_be_created_and_leaves_no_trace(tmp_path, monkeypatch):
    """info's cache report must not trust os.access (as root it says yes to /proc, where mkdir fails), and
    its probe must leave nothing behind."""
    import os

    from cute_kernels.runtime import cache

    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR="/proc/cute_kernels_cache")
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "info"], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0 and "NOT USABLE" in r.stdout, r.stdout + r.stderr
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path / "a" / "b"))
    assert cache.disk_cache_problem(probe=False) is None
    assert list(tmp_path.iterdir()) == []  # the temporary folder was removed, nothing created


def test_check_without_gpu_compiles_and_exits_zero():
    import torch

    if torch.cuda.is_available():
        return
    r = _run("check", "--kernel", "scale", "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no CUDA GPU" in r.stdout


def test_unsupported_arch_is_refused():
    r = _run("compile", "--kernel", "scale", "--arch", "sm_80a")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_layouts_config_values_are_typed(tmp_path):
    r = _run("layouts", "--kernel", "ranker_fwd", "--config", "stages=abc", "--out", str(tmp_path))
    assert r.returncode == 2 and "'stages' takes an integer" in r.stderr
    r = _run("layouts", "--kernel", "ranker_fwd", "--config", "persistent=maybe", "--out", str(tmp_path))
    assert r.returncode == 2 and "true or false" in r.stderr


def test_unknown_kernel_that_is_a_launch_of_a_registered_one_gets_a_hint():
    """`compile` lists rows by launch (hc_mix_tma, ranker_bwd_preprocess); --kernel takes the registry name."""
    for cmd in (("compile",), ("configs",), ("layouts", "--out", "/tmp/cute_kernels_cli_hint")):
        r = _run(*cmd, "--kernel", "hc_mix_tma")
        assert r.returncode == 2 and "'hc_mix_tma' is a launch of 'hc_mix': use --kernel hc_mix" in r.stderr, cmd


def test_layouts_config_with_a_space_instead_of_a_comma_says_so(tmp_path):
    r = _run("layouts", "--kernel", "hc_mix", "--config", "tile_m=256 stages=5", "--out", str(tmp_path))
    assert r.returncode == 2 and "separated by commas" in r.stderr and "'tile_m=256 stages=5'" in r.stderr



@pytest.mark.parametrize("args,msg", [
    (("--kernel", "ranker_fwd", "--shapes", "headlne"), "unknown 'headlne'"),
    (("--kernel", "ranker_bwd", "--shapes", "headline+peer"), "unknown 'peer'"),
    (("--kernel", "hc_mix", "--shapes", "headline"), "row counts 1 <= M <= 104857"),
    (("--kernel", "hc_mix", "--shapes", "0,4"), "row counts 1 <= M <= 104857"),
    (("--kernel", "qknorm", "--shapes", "64"), "qknorm takes none"),
    (("--shapes", "headline"), "give --kernel NAME"),
])
def test_bench_shapes_are_checked_before_anything_runs(args, msg):
    """A --shapes spec a kernel does not understand is refused on any machine (exit 2, what it accepts),
    instead of being ignored, matched by substring, or failing after other kernels' timings."""
    r = _run("bench", *args)
    assert r.returncode == 2 and msg in r.stderr


def test_bench_shapes_accepted_specs():
    from cute_kernels import registry
    from cute_kernels.kernels import ranker_bench

    assert registry.module("ranker_fwd").bench_shapes(None) == {"all", "peers"}
    assert registry.module("ranker_bwd").bench_shapes("headline+deterministic") == {"headline", "deterministic"}
    assert registry.module("ranker_bwd").bench_shapes("short+peers") == {"short", "peers"}
    for name in ("ranker_fwd", "ranker_bwd"):  # "short" = the short, candidate-heavy shapes
        mod = registry.module(name)
        assert [c[1:3] for c in mod.SHORT_CASES] == [(1024, 256), (2048, 2048)]
        pick = ranker_bench.bench_cases  # (what both benches run for a spec)
        assert pick({"short", "peers"}, mod.BENCH_CASES) == mod.SHORT_CASES
        assert pick({"headline", "short"}, mod.BENCH_CASES) == mod.BENCH_CASES[:2] + mod.SHORT_CASES
        assert pick({"all"}, mod.BENCH_CASES) == mod.BENCH_CASES
        mid = pick({"mid", "peers"}, mod.BENCH_CASES)  # GQA 16/4, D=64, B=1 16K: neither headline nor short
        assert [(c[0], c[4], c[5]) for c in mid] == [(4, 4, 128), (4, 16, 64), (1, 16, 128)]
        assert pick({"short", "mid", "headline"}, mod.BENCH_CASES) == mod.BENCH_CASES
    assert registry.module("ranker_bwd").bench_shapes("mid+peers") == {"mid", "peers"}
    assert registry.module("hc_mix").bench_shapes("1,4096") == [1, 4096]
    assert registry.module("scale").bench_shapes(None) is None
    for name in registry.names():  # every registered kernel has one (the CLI calls it)
        assert callable(registry.module(name).bench_shapes)


def test_layouts_optional_bool_fields(tmp_path):
    """Fields whose default is None (gqa_group_per_cta) take true/false/none; another value is a clean
    error (exit 2), not a TypeError traceback."""
    from cute_kernels.layouts.kernel_layouts import ranker_bwd_config

    assert ranker_bwd_config("gqa_group_per_cta=true").gqa_group_per_cta is True
    assert ranker_bwd_config("gqa_group_per_cta=None").gqa_group_per_cta is None
    r = _run("layouts", "--kernel", "ranker_bwd", "--config", "gqa_group_per_cta=yes", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "true, false or none" in r.stderr and "Traceback" not in r.stderr


def test_layouts_optional_int_fields(tmp_path):
    """walk_stagger (None or an int, its metadata says so) takes an integer or none through --config, as the
    docs/notes.md's advice (walk_stagger=0) needs; true is a clean error (exit 2), not a TypeError traceback."""
    from cute_kernels.layouts.kernel_layouts import ranker_bwd_config

    assert ranker_bwd_config("walk_stagger=0").walk_stagger == 0
    assert ranker_bwd_config("walk_stagger=3").walk_stagger == 3
    assert ranker_bwd_config("walk_stagger=none").walk_stagger is None
    for value, msg in (("true", "an integer or none"), ("65", "walk_stagger=65")):
        r = _run("layouts", "--kernel", "ranker_bwd", "--config", f"walk_stagger={value}", "--out", str(tmp_path / "x"))
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_layouts_without_matplotlib_says_what_is_missing(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.figure'] = None\n"
            "from cute_kernels.cli import main\n"
            f"sys.exit(main(['layouts', '--kernel', 'ranker_fwd', '--out', {str(tmp_path / 'x')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "not installed" in r.stderr and "Traceback" not in r.stderr


def test_bench_precheck_skips_a_broken_kernel_module(monkeypatch, capsys):
    """The --shapes pre-check must not let one kernel module that fails to import stop the others (its
    bench reports FAIL later); on a CPU the command then ends with 'bench needs a CUDA GPU'."""
    from cute_kernels import cli, registry

    monkeypatch.setitem(registry.KERNELS, "broken", "cute_kernels.kernels.does_not_exist")
    assert cli.main(["bench"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_layouts_refuses_another_target_arch_with_a_message(tmp_path):
    """With CUTE_DSL_ARCH=sm_100a, layouts printed the DSL's ANSI-coloured arch diagnostic and exited 1;
    now the package's message and exit status 2, as compile does (newcomer review, session 20)."""
    import os

    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a")
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "layouts", "--kernel", "hc_mix", "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2 and "sm_90a (Hopper) only" in r.stderr and "\x1b[" not in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("arch", ["sm_100a", ""])
def test_compile_refuses_another_target_arch_up_front(arch):
    """A CUTE_DSL_ARCH the kernels do not support (set, or set empty) is one message and exit status 2 before any
    config, as `layouts` does (until session 83 every config failed with it, then "0/3 configs compiled", 1)."""
    import os

    env = dict(os.environ, CUTE_DSL_ARCH=arch)
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "compile", "--kernel", "scale", "--quiet"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2 and r.stderr.count("sm_90a (Hopper) only") == 1, r.stdout + r.stderr
    assert "FAIL" not in r.stdout + r.stderr and "compiled" not in r.stdout


def test_gpu_run_script_without_a_gpu_stops_with_a_message(tmp_path):
    """scripts/gpu_run.sh where torch sees no CUDA GPU (hidden here even on a GPU machine): exit 3 and say
    why, before any test, check or bench runs (nothing written into OUTDIR)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), str(out), "tests"], capture_output=True,
                       text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "no CUDA GPU" in r.stderr
    assert not any(out.iterdir())


@pytest.mark.parametrize("args,ok", [(["--jobs", "0"], False), (["--jobs", "x"], False), (["--jobs"], False),
                                     (["--jobs", "1000"], False), (["--jobs", "2", "--jobs", "3"], False),
                                     (["--kernel", "nope"], False), (["--kernel", "ranker_fwd", "--kernel", "scale"], False),
                                     (["--bogus", "1"], False),
                                     (["--kernel", "ranker_fwd", "--jobs", "4"], True), (["--jobs", "2"], True)])
def test_gpu_run_script_arguments(tmp_path, args, ok):
    """scripts/gpu_run.sh's options: ``--kernel NAME`` once (a kernel with a GPU test file), ``--jobs N`` once
    (1 <= N <= 999, the GPU tests in N pytest shards) in any order; anything else exits 2 with a message
    before the GPU check (which exits 3 here)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), str(tmp_path / "out"), "tests", *args],
                       capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert r.returncode == (3 if ok else 2), (r.returncode, r.stdout, r.stderr)
    assert ("gpu_run.sh: " in r.stderr and "no CUDA GPU" not in r.stderr) != ok


@pytest.mark.parametrize("mode,kernel,ok", [("all", "ranker_fuzz", False), ("bench", "large_offsets", False),
                                             ("check", "multi_device", False), ("tests", "ranker_fuzz", True),
                                             ("sanitize", "scale", False), ("sanitize", "qknorm_tp", True),
                                             ("bench", "qknorm", True)])
def test_gpu_run_script_kernel_per_mode(tmp_path, mode, kernel, ok):
    """check / bench / all take a registered kernel, not any GPU test file's name, and sanitize a kernel with a
    sanitizer script: else exit 2 with a message before the GPU check (session 61: ranker_fuzz passed and
    failed after the tests; sanitize --kernel scale ran nothing and exited 0)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(["bash", str(root / "scripts" / "gpu_run.sh"), str(tmp_path / "out"), mode, "--kernel", kernel],
                       capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert r.returncode == (3 if ok else 2), (r.returncode, r.stdout, r.stderr)


def test_compile_counts_a_module_that_cannot_list_its_configs_apart(monkeypatch, tmp_path, capsys):
    """A module that cannot list its configs is reported on its own line and in the total, not subtracted from
    the compiled configs (session 61: 3 of 3 compiled printed as 2/3)."""
    from cute_kernels import cli, registry

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "KERNELS", {"scale": registry.KERNELS["scale"],
                                               "broken": "cute_kernels.kernels.no_such_module"})
    assert cli.main(["compile", "--quiet"]) == 1
    out = capsys.readouterr()
    assert "FAIL broken: cannot list configs" in out.err
    assert "3/3 configs compiled for sm_90a; 1 module could not list its configs" in out.out


def test_info_reports_cache_usage_and_prune_cache(tmp_path):
    """info shows the entries of this fingerprint and the older folders; prune-cache removes those."""
    import os

    old = tmp_path / "fedcba9876543210" / "scale"
    old.mkdir(parents=True)
    (old / "x.o").write_bytes(b"12")
    os.utime(old / "x.o", (0, 0))  # (not used in the last hour)
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "info"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and "1 folder of other sources" in r.stdout and "lineinfo=False" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "prune-cache"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("removed 1 folder of other sources"), r.stdout
    assert not old.parent.exists()
    r = _run("tune", "--kernel", "bogus", "--shape", "M=1", "--list")
    assert r.returncode == 2 and "unknown kernel 'bogus'" in r.stderr


_SHARD_TESTS = """
import os, pathlib, signal, torch, pytest

HERE = pathlib.Path(__file__).parent

def once(name):
    # True the first time any process asks (the shards share this folder), False after
    try:
        (HERE / f"{name}.seen").open("x").close()
        return True
    except FileExistsError:
        return False

def record_seed(name):
    (HERE / f"{name}.seed").write_text(os.environ["CUTE_KERNELS_SEED"])

@pytest.fixture
def oom_on_setup_once():
    if once("setup"):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.31 GiB.")

@pytest.mark.parametrize("i", range(6))
def test_ok(i):
    record_seed(f"ok{i}")

@pytest.mark.parametrize("case", ["default wait", "x - y"])
def test_call_oom_once(case):
    record_seed("call" + case)
    if once("call" + case):
        raise torch.OutOfMemoryError("CUDA out of memory")

def test_setup_oom_once(oom_on_setup_once):
    pass

class TestK:
    def test_oom_as_cause_once(self):
        if once("cause"):
            try:
                raise torch.OutOfMemoryError("CUDA out of memory")
            except torch.OutOfMemoryError as e:
                raise RuntimeError("wrapped") from e

def test_timing_sensitive():
    record_seed("alone")

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False

def test_assert_fails():
    if os.environ.get("SHARDS_CASE") == "assert":
        print("FAILED tests/test_shards.py::test_imaginary - captured output, not pytest's summary")
        assert 3 == 4

import unittest

class TestSub(unittest.TestCase):
    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertFalse(os.environ.get("SHARDS_CASE") == "assert" and i == 1)

def test_stops_the_session():
    if os.environ.get("SHARDS_CASE") == "exit":
        pytest.exit("stopped early", returncode=0)

def test_crash():
    if os.environ.get("SHARDS_CASE") == "crash":
        os.kill(os.getpid(), signal.SIGKILL)

def test_oom_always():
    if os.environ.get("SHARDS_CASE") == "oom_always":
        raise torch.OutOfMemoryError("CUDA out of memory")

def test_oom_context_suppressed():
    if os.environ.get("SHARDS_CASE") == "from_none" and once("from_none"):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError:
            raise ValueError("a real bug") from None

def test_leaky():
    pass
"""

_SHARD_CONFTEST = """
import os, pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # as a leak check after each test might
    rep = (yield).get_result()
    if os.environ.get("SHARDS_CASE") == "leak" and call.when == "call" and item.name == "test_leaky":
        rep.outcome, rep.longrepr = "failed", "leak"
"""


@pytest.mark.parametrize("case", ["green", "assert", "crash", "oom_always", "nothing", "exit", "maxfail", "leak",
                                  "from_none"])
def test_pytest_shards_reruns_only_out_of_memory_failures(tmp_path, case):
    """scripts/pytest_shards.py (gpu_run.sh --jobs N): tests that failed with torch.OutOfMemoryError beside the
    other shards (in the call, in a fixture's setup, or as the cause of another exception) run again alone,
    with ``--alone`` tests, and the run is green when they pass there; any other failure (an assertion, a shard
    killed by a signal, a test out of memory alone too, nothing collected, a shard that stops before running
    all of its tests, through ``pytest.exit`` or ``--maxfail``, a failure another plugin's hook wrapper makes,
    an error raised ``from None`` over an out-of-memory one, a failed ``unittest`` subtest, listed as pytest's
    SUBFAILED line) is red; a test folder whose name holds brackets
    runs (pytest refuses such paths on its command line: the shards select their ids at collection). Every shard and rerun gets
    one seed; the script's earlier files in OUTDIR are removed first (a stale shard XML once stood for a
    crashed shard's); the shards' other failures are printed before the reruns (a time limit cut session 78's
    run there, before its summary)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "pytest.ini").write_text("[pytest]\n")
    if case != "nothing":
        (proj / "tests" / "test_shards.py").write_text(_SHARD_TESTS)
        (proj / "tests" / "conftest.py").write_text(_SHARD_CONFTEST)
        (proj / "tests" / "a[1]").mkdir()  # (a path pytest refuses on its command line)
        (proj / "tests" / "a[1]" / "test_brackets.py").write_text("def test_in_a_bracketed_folder():\n    pass\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "gpu-tests-7.xml").write_text("<testsuites/>")
    (out / "gpu-tests-oom-rerun.jsonl").write_text('{"finished": 0, "ran": 1}\n')
    env = {k: v for k, v in os.environ.items() if k != "CUTE_KERNELS_SEED"}
    env["SHARDS_CASE"] = case
    if case == "maxfail":
        env["PYTEST_ADDOPTS"] = "--maxfail=1"
    r = subprocess.run([sys.executable, str(root / "scripts" / "pytest_shards.py"), "../out", "--jobs", "3",
                        "--alone", "test_timing_sensitive", "tests"], cwd=proj, env=env, capture_output=True,
                       text=True, timeout=300)
    log = r.stdout + r.stderr
    assert not (out / "gpu-tests-7.xml").exists(), log
    assert (out / "gpu-tests.log").read_text() in r.stdout, log
    if case == "nothing":
        assert r.returncode == 1 and "found no test" in log, log
        return
    if case == "crash":  # the killed shard leaves no XML and its failures unknown: red, whatever the others did
        assert r.returncode == 1 and "killed by SIGKILL before the end of its session" in log, log
        # and names the test it was running (its log may hold nothing to say so: pytest -q prints a test's mark
        # after the test)
        assert "(crashed or killed) while running tests/test_shards.py::test_crash" in log, log
        return
    if case in ("exit", "maxfail"):  # (exit 0 / exit 1 with out-of-memory failures only: green before)
        assert r.returncode == 1 and "tests never ran (tests/test_shards.py::" in log, log
        return
    assert sorted(p.name for p in out.glob("gpu-tests-[0-9].xml")) == ["gpu-tests-0.xml", "gpu-tests-1.xml",
                                                                        "gpu-tests-2.xml"], log
    assert f"{4 + (case == 'oom_always')} tests failed with torch.OutOfMemoryError" in log, log
    rerun = (out / "gpu-tests-oom-rerun.log").read_text()
    for name in ("test_call_oom_once[default wait]", "test_call_oom_once[x - y]", "test_setup_oom_once",
                 "TestK::test_oom_as_cause_once"):
        assert any(f"::{name} - " in ln and ln.endswith("  [out of memory beside the other shards: run again alone]")
                   for ln in log.splitlines()), (name, log)
    seeds = {p.read_text() for p in (proj / "tests").glob("*.seed")}
    assert len(seeds) == 1 and "alone.seed" in {p.name for p in (proj / "tests").glob("*.seed")}, seeds
    assert f"seed {seeds.pop()} for all" in log, log
    if case == "green":
        assert r.returncode == 0 and "green: every test passed or skipped (4 after running again alone)" in log, log
        # (printed before the reruns run; their output goes to files, so stdout can only show it before the summary)
        assert log.index("the shards' other failures: none\n") < log.index("green: "), log
        assert "4 passed" in rerun, rerun
    elif case == "assert":
        assert r.returncode == 1 and "red: shard" in log and "test_assert_fails failed" in log, log
        early = next(ln for ln in log.splitlines() if ln.startswith("the shards' other failures: "))
        assert "test_assert_fails failed" in early and log.index(early) < log.index("red: shard"), log
        assert "test_imaginary" not in (out / "gpu-tests.log").read_text(), log
        # (a failed unittest subtest: pytest 9's summary line is SUBFAILED, once missing from gpu-tests.log)
        assert "TestSub::test_subtests failed" in log, log
        assert any(ln.startswith("SUBFAILED(i=1) tests/test_shards.py::TestSub::test_subtests")
                   for ln in (out / "gpu-tests.log").read_text().splitlines()), log
    elif case == "leak":  # (another plugin's hook wrapper failed it after ours looked: green before)
        assert r.returncode == 1 and "test_leaky failed" in log, log
    elif case == "from_none":  # (a ValueError raised "from None" counted as out of memory: green before)
        assert r.returncode == 1 and "test_oom_context_suppressed failed" in log, log
    else:
        assert r.returncode == 1 and "test_oom_always ran out of memory again" in log, log


def test_gpu_run_script_help_is_the_whole_header():
    """``gpu_run.sh --help`` prints the header comment to its last line (it once stopped a line short), then
    the usage line."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    lines = script.read_text().splitlines()[1:]  # after the shebang: the header is the comment block on top
    header = [ln.removeprefix("#").removeprefix(" ") for ln in lines[:next(i for i, ln in enumerate(lines)
                                                                               if not ln.startswith("#"))]]
    assert len(header) > 10 and r.returncode == 0, r
    assert r.stdout.splitlines() == header + [next(ln for ln in lines if ln.startswith("usage="))[7:-1]]


def test_compile_checks_a_read_only_pre_filled_cache(monkeypatch, tmp_path, capsys):
    """A cache folder that exists but cannot be written (a shared cache filled beforehand) is checked, not an
    error: every config found there is exit 0 (was exit 1 before anything was looked at, session 61); a config
    missing from it is a MISS line and exit 1, and nothing is compiled; the cache's own "caching in memory
    only" warning is not repeated per config."""
    import warnings

    from cute_kernels import cli
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()  # (an earlier test's compile would be served from memory: nothing written here)
    assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
    capsys.readouterr()

    class ReadOnlyLock:  # as the entry lock fails in a folder this user cannot write
        def __init__(self, *a, **k):
            pass

        def acquire(self):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "FileLock", ReadOnlyLock)
    monkeypatch.setattr(cache, "disk_cache_problem", lambda probe=True: f"{tmp_path} is not writable (test)")
    cache.clear_memory_cache()
    cache._warn_no_disk_cache.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
    out = capsys.readouterr()
    assert "3/3 configs found in the read-only cache for sm_90a" in out.out and "load" in out.out, out
    assert "checking that it already holds every config" in out.err
    assert not [w for w in seen if "compile cache folder" in str(w.message)]

    victim = next(tmp_path.glob("*/scale/*.o"))
    victim.unlink()
    cache.clear_memory_cache()
    compiled = []
    monkeypatch.setattr(cache, "_compile", lambda *a: compiled.append(a) or (_ for _ in ()).throw(AssertionError))
    assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 1
    out = capsys.readouterr()
    assert out.out.count("MISS scale") == 1 and "missing or incomplete in the read-only cache" in out.out
    assert "2/3 configs found in the read-only cache" in out.out and not compiled


def test_compile_table_columns_fit_the_longest_names(monkeypatch, tmp_path, capsys):
    """The compile table's kernel and label columns are as wide as the longest of this run, so every row's
    status text starts in one column (fixed widths of 11 and 48 shifted the rows of ranker_bwd_postprocess and
    of hc_mix_tma's long labels)."""
    import types

    from cute_kernels import cli, registry
    from cute_kernels.registry import CompileTarget

    def fail():
        raise RuntimeError("no such config")

    fake = types.SimpleNamespace(compile_targets=lambda: [
        CompileTarget("a_rather_long_kernel_name", "a label longer than forty-eight characters, for the test", 1,
                      build=fail)])
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "KERNELS", {"scale": registry.KERNELS["scale"], "fake": "fake"})
    real_module = registry.module
    monkeypatch.setattr(registry, "module", lambda name: fake if name == "fake" else real_module(name))
    assert cli.main(["compile", "--quiet"]) == 1
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("ok ", "FAIL "))]
    assert len(rows) == 4
    # the status text (a compile time right-aligned in 6 characters, or the error) starts one column after
    # "KIND " + the longest kernel name + " " + the longest label, whatever the compile took
    col = len("FAIL ") + len("a_rather_long_kernel_name") + 1 + len("a label longer than forty-eight characters, "
                                                                     "for the test") + 1
    import re

    for ln in rows:
        assert ln[col - 1] == " " and re.match(r" *\d+\.\d\ds  |RuntimeError: ", ln[col:]), (col, rows)


def _scale_targets_that_record_builds(monkeypatch, built):
    """scale as the only registered kernel, its targets' build() recording their label in ``built``."""
    import dataclasses
    import types

    from cute_kernels import registry

    real = registry.module("scale")
    targets = [dataclasses.replace(t, build=lambda t=t: built.append(t.label) or t.build())
               for t in real.compile_targets()]
    monkeypatch.setattr(registry, "KERNELS", {"scale": registry.KERNELS["scale"]})
    monkeypatch.setattr(registry, "module", lambda name: types.SimpleNamespace(compile_targets=lambda: targets))


def test_compile_into_a_read_only_cache_builds_nothing(monkeypatch, tmp_path, capsys):
    """In a cache it cannot write, compile only loads the entries there: no target's build() runs (it compiled an
    entry that did not load in memory before saying MISS), a broken entry is a MISS left as it is, and a check
    that raises is that config's FAIL line (it escaped the command)."""
    from cute_kernels import cli
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
    capsys.readouterr()
    built = []
    _scale_targets_that_record_builds(monkeypatch, built)
    monkeypatch.setattr(cache, "disk_cache_problem", lambda probe=True: f"{tmp_path} is not writable (test)")
    cache.clear_memory_cache()
    assert cli.main(["compile", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3/3 configs found in the read-only cache" in out and out.count("ms load") == 3 and not built, out

    broken = sorted(tmp_path.glob("*/scale/*.o"))[0]
    broken.write_bytes(b"not an object file")
    cache.clear_memory_cache()
    assert cli.main(["compile", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert out.count("MISS scale") == 1 and "its entry in the read-only cache did not load" in out, out
    assert "2/3 configs found in the read-only cache" in out and not built
    assert broken.read_bytes() == b"not an object file"  # (not removed: nothing is written or removed here)

    def entry_on_disk(kernel, key):
        raise RuntimeError("cannot tell")

    monkeypatch.setattr(cache, "entry_on_disk", entry_on_disk)
    assert cli.main(["compile", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL scale") == 3 and "RuntimeError: cannot tell" in out and not built, out


@pytest.mark.parametrize("left_over", [None, "broken"])
def test_compile_fails_a_config_whose_entry_was_not_written(monkeypatch, tmp_path, capsys, left_over):
    """A writable cache folder whose kernel subfolder cannot be written (here: its entry locks cannot be taken)
    compiles in memory only: that config is a FAIL saying its entry is not on disk, exit 1 (was ok, exit 0),
    also where another user's broken entries are there (``broken``: their files exist, so a check of the files
    alone passed them)."""
    from cute_kernels import cli
    from cute_kernels.runtime import cache

    class ReadOnlyLock:  # as the entry lock fails in a subfolder this user cannot write
        def __init__(self, *a, **k):
            pass

        def acquire(self):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    if left_over == "broken":
        assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
        objs = list(tmp_path.glob("*/scale/*.o"))
        assert len(objs) == 3
        for o in objs:
            o.write_bytes(b"not an object file" * 10)
        capsys.readouterr()
    monkeypatch.setattr(cache, "FileLock", ReadOnlyLock)
    cache.clear_memory_cache()
    cache._warn_no_disk_cache.cache_clear()
    with pytest.warns(RuntimeWarning, match="caching in memory only"):
        assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL scale") == 3 and "compiled, but its entry on disk is missing or does not load" in out, out
    assert "0/3 configs compiled" in out


def test_prune_cache_says_what_it_kept_and_why(tmp_path, monkeypatch, capsys):
    """prune-cache (and --dry-run) names the folders of other fingerprints it removes (since session 83) and the ones
    it keeps, with the reason."""
    import os
    import time

    from cute_kernels import cli

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    for name, age in (("00000000000000b1", 7200), ("00000000000000b2", 60)):
        (tmp_path / name / "scale").mkdir(parents=True)
        (tmp_path / name / "scale" / "x.o").write_bytes(b"12")
        os.utime(tmp_path / name / "scale" / "x.o", (time.time() - age,) * 2)
    (tmp_path / "00000000000000b3").mkdir()
    for argv, verb in ((["prune-cache", "--dry-run"], "would remove"), (["prune-cache"], "removed")):
        assert cli.main(argv) == 0
        out = capsys.readouterr().out.splitlines()
        assert out == [f"{verb} 1 folder of other sources (0 MiB) from {tmp_path}", f"{verb} 00000000000000b1",
                       "kept 00000000000000b2: used 1 min ago (folders used in the last hour are kept)",
                       "kept 00000000000000b3: not a compile cache folder (files other than kernel folders of cache "
                       "entries, or none)"], out
    assert not (tmp_path / "00000000000000b1").exists() and (tmp_path / "00000000000000b2").exists()


def test_compile_without_the_disk_cache_says_so(monkeypatch, tmp_path, capsys):
    """``CUTE_KERNELS_CACHE=0``: compile compiles in memory and its total says that nothing was written (it
    read like a filled cache)."""
    from cute_kernels import cli
    from cute_kernels.runtime import cache

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_KERNELS_CACHE", "0")
    cache.clear_memory_cache()
    assert cli.main(["compile", "--kernel", "scale", "--quiet"]) == 0
    assert "3/3 configs compiled in memory only (CUTE_KERNELS_CACHE=0: nothing written)" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())


def test_info_and_prune_on_a_cache_folder_that_cannot_be_listed(monkeypatch, tmp_path, capsys):
    """A cache folder this user may not list (mode 711, another user's): ``info`` says so and exits 0 (it ended
    in a PermissionError traceback); ``prune-cache --dry-run`` says it cannot list, not that it cannot remove."""
    from pathlib import Path

    # (cutlass imported before iterdir is denied: its import lists a folder, where this test failed when run alone)
    import cutlass  # noqa: F401
    from cute_kernels import cli
    from cute_kernels.runtime import cache

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(Path, "iterdir", denied)
    monkeypatch.setattr(cache, "_folder_bytes", lambda p: denied(p))
    assert cli.main(["info"]) == 0
    assert "its contents cannot be listed: Permission denied" in capsys.readouterr().out
    assert cli.main(["prune-cache", "--dry-run"]) == 1
    assert f"prune-cache: cannot list the folders of {tmp_path}: Permission denied" in capsys.readouterr().err


def test_readme_counts_the_compile_targets():
    """README's set-up text gives the number of compile targets `cute-kernels compile` builds; it went stale once
    (108 where there were 110): pinned to the registry's count."""
    import os
    import re

    from cute_kernels import registry

    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    said = re.search(r"for the (\d+) targets, as\s+`cute-kernels compile` counts them", readme)
    assert said, "README no longer states the compile-target count in the form this test reads"
    assert int(said.group(1)) == sum(len(registry.module(n).compile_targets()) for n in registry.names())
