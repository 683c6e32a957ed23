"""The GPU tests in N pytest processes at once on one GPU (``gpu_run.sh OUTDIR tests --jobs N``).

    python3 scripts/pytest_shards.py OUTDIR --jobs N [--alone TEXT ...] TESTS...

Collects TESTS once, deals the tests round-robin into N shards run at the same time (most of a cold run is
compiling kernels on the CPU), then runs in one process of its own every test whose node id contains an
``--alone`` TEXT (timing-sensitive tests), and once more, away from the shards (in one process, one after
another), every test that failed only with ``torch.OutOfMemoryError`` beside the other shards (the float64
references of the big cases: session 62 ran 12 shards on an 80 GB H100 and three of them ran out of memory;
all passed alone). Any other failure keeps the run red: a test that failed another way, a shard that exited
2-5 or was killed, a shard that did not run every test it was given (``-x``, ``--maxfail``, ``pytest.exit``)
or never reached its end, a collection error or no test collected.

Every shard runs the same random inputs: one ``CUTE_KERNELS_SEED`` (the environment's, else one drawn here)
for all of them and the reruns. The processes run in the current folder, which must be pytest's rootdir
(gpu_run.sh runs it from the repository root).

Writes into OUTDIR (made if missing; this script's earlier files there are removed first):
``gpu-tests-collect.log``, per shard ``gpu-tests-I.log`` / ``.xml`` (junit) / ``.jsonl`` (this script's
record: failures, whether each was out of memory, the test it started last, the shard's end), the same for
``alone`` and ``oom-rerun``, and ``gpu-tests.log``: one summary line per shard and its FAILED / SUBFAILED / ERROR
lines, the out-of-memory ones marked as run again (a shard killed mid-test is named with that test). Prints the
shards' failures other than out of memory before the runs after them start (``the shards' other failures:
...``), so a run cut by a time limit there still says them (session 78's was cut during its reruns). Exit 0
when green, 1 when red, 2 for bad arguments.

Also a pytest plugin (``-p pytest_shards`` with this folder on ``sys.path``): with ``PYTEST_SHARDS_REPORT``
set it appends JSON lines there: ``{"collected": [ids]}``, ``{"failed": id, "when": phase, "oom": bool}``
per failure, ``{"started": id}`` and ``{"done": id}`` per test as it starts and when it has run to its end, and
``{"finished": exit status}`` at the end.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPORT_ENV = "PYTEST_SHARDS_REPORT"
SELECT_ENV = "PYTEST_SHARDS_SELECT"
PREFIX = "gpu-tests"


# ---- the plugin, inside each pytest process ---------------------------------------------------------------

def _record(**fields) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def is_out_of_memory(exc: BaseException | None) -> bool:
    """True for ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``) and its subclasses, also when it
    is the cause or (unsuppressed) context of the exception raised."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__name__ == "OutOfMemoryError" and c.__module__.split(".")[0] == "torch"
               for c in type(exc).__mro__):
            return True
        # (``raise ... from None`` suppresses the context: the error raised is then not an out-of-memory one)
        exc = exc.__cause__ if exc.__cause__ is not None else None if exc.__suppress_context__ else exc.__context__
    return False


def pytest_collection_modifyitems(config, items):
    # a shard's tests: the node ids listed in the file SELECT_ENV names (not on the command line, which refuses
    # paths with brackets and has a length limit), out of the collected TESTS
    path = os.environ.get(SELECT_ENV)
    if path:
        keep = set(Path(path).read_text().splitlines())
        deselected = [item for item in items if item.nodeid not in keep]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.nodeid in keep]


def pytest_collection_finish(session):
    _record(collected=[item.nodeid for item in session.items])


_oom_phases: set[tuple[str, str]] = set()  # (node id, phase) whose exception was out of memory


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    # the phase's exception (whether the phase failed is for the final report to say, below)
    if call.excinfo is not None and is_out_of_memory(call.excinfo.value):
        _oom_phases.add((item.nodeid, call.when))


def pytest_runtest_logstart(nodeid, location):
    _record(started=nodeid)


def pytest_runtest_logreport(report):
    # pytest's final report of each phase (xfail, strict xpass and other plugins' hook wrappers decided)
    if report.failed:
        _record(failed=report.nodeid, when=report.when, oom=(report.nodeid, report.when) in _oom_phases)
    if report.when == "teardown":  # (every test that started ends here, passed, failed or skipped)
        _record(done=report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    _record(finished=int(exitstatus))


# ---- the runner ---------------------------------------------------------------------------------------------

def read_report(path: Path) -> dict:
    """A shard's record: collected ids, failures (id -> out of memory), the ids of the tests that ran to their
    end, the id of the test started last, finished exit status or None."""
    rep = {"collected": [], "failures": {}, "done": set(), "started": None, "finished": None}
    if not path.is_file():
        return rep
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "collected" in r:
            rep["collected"] = r["collected"]
        elif "failed" in r:
            # a test whose call and teardown both fail is out of memory only if both were
            rep["failures"][r["failed"]] = rep["failures"].get(r["failed"], True) and bool(r["oom"])
        elif "done" in r:
            rep["done"].add(r["done"])
        elif "started" in r:
            rep["started"] = r["started"]
        elif "finished" in r:
            rep["finished"] = r["finished"]
    return rep


def _pytest(out: Path, name: str, args: list[str], env: dict, ids: list[str] | None = None) -> subprocess.Popen:
    env = dict(env, **{REPORT_ENV: str(out / f"{PREFIX}-{name}.jsonl")})
    if ids is not None:
        (out / f"{PREFIX}-{name}.ids").write_text("".join(f"{i}\n" for i in ids))
        env[SELECT_ENV] = str(out / f"{PREFIX}-{name}.ids")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-p", "pytest_shards",
           f"--rootdir={os.getcwd()}", *args]
    if name != "collect":
        cmd.append(f"--junitxml={out / f'{PREFIX}-{name}.xml'}")
    log = open(out / f"{PREFIX}-{name}.log", "w")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        log.close()


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return {2: "exit 2 (interrupted or usage error)", 3: "exit 3 (pytest internal error)",
            4: "exit 4 (pytest usage error)", 5: "exit 5 (no test ran)"}.get(rc, f"exit {rc}")


def judge(name: str, rc: int, rep: dict, given: list[str]) -> tuple[list[str], list[str]]:
    """(out-of-memory node ids to run again alone, reasons this process makes the run red); ``given``: the
    node ids the process was to run, every one of which must have run (``-x``, ``--maxfail`` or ``pytest.exit``
    in a test stop a session early with exit 0 or 1)."""
    if rep["finished"] is None:
        running = rep["started"] if rep["started"] not in rep["done"] else None
        return [], [f"shard {name}: {_exit_reason(rc)} before the end of its session (crashed or killed)"
                    + (f" while running {running}" if running else "")]
    missing = [nid for nid in given if nid not in rep["done"]]
    if missing:
        return [], [f"shard {name}: {len(missing)} of its {len(given)} tests never ran ({missing[0]}, ...; "
                    f"{_exit_reason(rc)})"]
    if rc == 0:
        return [], []
    if rc != 1:
        return [], [f"shard {name}: {_exit_reason(rc)}"]
    oom = [nid for nid, is_oom in rep["failures"].items() if is_oom]
    other = [f"shard {name}: {nid} failed" for nid, is_oom in rep["failures"].items() if not is_oom]
    if not rep["failures"]:
        other.append(f"shard {name}: exit 1 with no failure recorded")
    return oom, other


def summary_lines(out: Path, name: str, oom: set[str]) -> list[str]:
    log = out / f"{PREFIX}-{name}.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    last = next((ln for ln in reversed(lines) if ln.strip()), "(empty log)")
    result = [f"== shard {name}: {last}"]
    head = next((i for i, ln in enumerate(lines) if "short test summary info" in ln), len(lines))
    for ln in lines[head + 1:]:  # (pytest's short summary only: a test's captured output may print "FAILED ...")
        if ln.startswith(("FAILED ", "ERROR ", "SUBFAILED")):  # (SUBFAILED(i=1) ID: a failed unittest subtest)
            rest = ln.split(" ", 1)[1]
            rerun = any(rest == nid or rest.startswith(nid + " - ") for nid in oom)
            result.append(ln + ("  [out of memory beside the other shards: run again alone]" if rerun else ""))
    return result


def run(out: Path, jobs: int, alone_texts: list[str], tests: list[str]) -> int:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob(f"{PREFIX}-*"), out / f"{PREFIX}.log", out / f"{PREFIX}.xml"]:
        if stale.is_file():
            stale.unlink()
    env = dict(os.environ)
    if not env.get("CUTE_KERNELS_SEED"):
        env["CUTE_KERNELS_SEED"] = str(int.from_bytes(os.urandom(4), "little"))
    env["PYTHONUNBUFFERED"] = "1"  # (a shard killed mid-run keeps in its log what it printed up to then)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    red = []
    collect = _pytest(out, "collect", ["--collect-only", *tests], env)
    rc = collect.wait()
    ids = read_report(out / f"{PREFIX}-collect.jsonl")["collected"]
    if rc != 0 or not ids:
        red.append(f"collecting {' '.join(tests)} failed ({_exit_reason(rc)}) or found no test; see "
                   f"{PREFIX}-collect.log")
        ids = []
    alone = [i for i in ids if any(t in i for t in alone_texts)]
    sharded = [i for i in ids if i not in set(alone)]
    print(f"{len(sharded)} tests in {min(jobs, len(sharded))} shards, then {len(alone)} on their own; "
          f"seed {env['CUTE_KERNELS_SEED']} for all (CUTE_KERNELS_SEED replays it)", flush=True)

    names = [str(i) for i in range(jobs) if sharded[i::jobs]]
    procs = {n: _pytest(out, n, tests, env, sharded[int(n)::jobs]) for n in names}
    oom = []
    for n, p in procs.items():
        o, r = judge(n, p.wait(), read_report(out / f"{PREFIX}-{n}.jsonl"), sharded[int(n)::jobs])
        oom += o
        red += r
    if oom:
        print(f"{len(oom)} tests failed with torch.OutOfMemoryError beside the other shards: run again alone",
              flush=True)
    if oom or alone:  # (the runs after the shards may outlast a caller's time limit: their verdict first)
        print("the shards' other failures: " + ("; ".join(red) if red else "none"), flush=True)
    for name, group in (("alone", alone), ("oom-rerun", oom)):
        if group:
            rc = _pytest(out, name, tests, env, group).wait()
            rep = read_report(out / f"{PREFIX}-{name}.jsonl")
            o, r = judge(name, rc, rep, group)
            red += r + [f"shard {name}: {nid} ran out of memory again (the shards' out-of-memory tests run one "
                        "after another in one process)" for nid in o]
            names.append(name)

    lines = [ln for n in names for ln in summary_lines(out, n, set(oom) if n.isdigit() else set())]
    lines += [f"red: {r}" for r in red] or ["green: every test passed or skipped"
                                            + (f" ({len(oom)} after running again alone)" if oom else "")]
    text = "\n".join(lines) + "\n"
    (out / f"{PREFIX}.log").write_text(text)
    print(text, end="")
    return 1 if red else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="pytest_shards.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--jobs", type=int, required=True, help="pytest processes at once (1-999)")
    ap.add_argument("--alone", action="append", default=[], metavar="TEXT",
                    help="tests whose node id contains TEXT run after the shards, in one process")
    ap.add_argument("tests", nargs="+")
    args = ap.parse_args(argv)
    if not 1 <= args.jobs <= 999:
        ap.error(f"--jobs takes 1 to 999 processes, got {args.jobs}")
    return run(args.outdir, args.jobs, args.alone, args.tests)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
