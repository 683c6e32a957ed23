"""CPU checks of scripts/tp_qknorm_multigpu.py (the multi-GPU launcher of issue 6; its GPU cases need >= 2 GPUs).

What is checked here: the script imports and ``--help`` works, multicast is switched off in the
environment before any process is spawned, the N sequences every rank derives are identical across
processes, record merging / summary / exit status, the real spawn + file-store + watchdog machinery
(gloo self-test cases, no CUDA), and the clear exit 2 without GPUs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tp_qknorm_multigpu.py"
sys.path.insert(0, str(SCRIPT.parent))

import tp_qknorm_multigpu as tp  # noqa: E402

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _run(args, timeout=120, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=str(ROOT))


def test_imports_with_the_cases_of_the_issue():
    assert tp.NO_MULTICAST_ENV == MULTICAST_OFF
    assert set(tp.CASES) == {"correctness", "stress", "late_rank", "missing_rank", "latency"}
    assert set(tp.CASES) <= set(tp.CASE_FUNCS)
    assert tp.SHAPES == ((6144, 1024), (4096, 1024))
    assert tp.LATENCY_NS == (1, 8, 64, 512, 4096, 8192)
    assert set(tp.DTYPE_NAMES) == {"float16", "bfloat16", "float32"}
    assert "nvidia-h200-x4" in tp.__doc__ and '".devkit"' in tp.__doc__
    assert "source .devkit/prelude.sh && python3 scripts/tp_qknorm_multigpu.py --out $OUT" in tp.__doc__


def test_help():
    proc = _run(["--help"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    for opt in ("--out", "--world", "--quick", "--cases", "nvidia-h200-x4"):
        assert opt in proc.stdout


def test_build_env_forces_multicast_off_and_puts_checkout_on_path():
    base = {"NCCL_NVLS_ENABLE": "1", "PYTHONPATH": "/elsewhere", "KEEP": "x"}
    env = tp.build_env(base)
    for k, v in MULTICAST_OFF.items():
        assert env[k] == v
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert env["KEEP"] == "x" and env["CUTE_DSL_ARCH"]
    assert base == {"NCCL_NVLS_ENABLE": "1", "PYTHONPATH": "/elsewhere", "KEEP": "x"}  # not mutated


def test_apply_env_sets_os_environ(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.delenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", raising=False)
    monkeypatch.delenv("NVSHMEM_DISABLE_NVLS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    assert tp.env_problems()
    got = tp.apply_env()
    for k, v in MULTICAST_OFF.items():
        assert os.environ[k] == v and got[k] == v
    assert tp.env_problems() == []


def test_sequences_are_deterministic_across_rank_processes():
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import tp_qknorm_multigpu as tp; "
            "p = tp.plan(4, quick=False, seed=0); s = p['stress']; "
            "print(json.dumps([p, tp.n_sequence(s['seed'], s['launches'], p['capacity']), "
            "tp.bucket_sequence(s['graph_seed'], s['launches'], len(s['graph_buckets']))]))")
    outs = []
    for rank, hashseed in ((0, "1"), (3, "12345")):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), PYTHONHASHSEED=hashseed)
        proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT.parent)], capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    p, seq, order = json.loads(outs[0])
    assert len(seq) == 10000 and min(seq) == 1 and max(seq) == p["capacity"] == 8192
    assert seq[:4] == [1, 8192, 1, 8192]
    assert len(set(seq)) > 3000  # varying N
    assert len(order) == 10000 and set(order) == set(range(len(p["stress"]["graph_buckets"])))
    assert tp.n_sequence(5, 100) != tp.n_sequence(6, 100)
    assert tp.n_sequence(5, 100) == tp.n_sequence(5, 100)


@pytest.mark.parametrize("quick", [False, True])
def test_case_lists(quick):
    ns = tp.correctness_ns(8192, quick)
    assert ns == sorted(ns) and ns[0] == 1 and ns[-1] == 8192
    assert sum(n % 2 for n in ns) >= 3  # odd values
    assert tp.graph_buckets(8192, quick)[-1] == 8192
    p = tp.plan(8, quick)
    assert p["stress"]["launches"] == (1000 if quick else 10000)
    assert p["latency"]["ns"] == [1, 8, 64, 512, 4096, 8192]
    assert p["missing"]["timeout_s"] < p["late"]["sleep_s"] < p["late"]["timeout_s"]
    for q, k in p["shapes"]:
        assert q % 8 == 0 and k % 8 == 0


def test_parse_worlds():
    assert tp.parse_worlds(None, 4) == [4]
    assert tp.parse_worlds(None, 8) == [8] and tp.parse_worlds(None, 6) == [4]
    assert tp.parse_worlds("2,4,8", 8) == [2, 4, 8]
    assert tp.parse_worlds("two", 8) == []


def test_without_gpus_exits_2_with_a_clear_message():
    proc = _run(["--out", "/tmp/tp_launcher_test_nogpu"], CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs at least 2 CUDA GPUs" in proc.stderr and "found 0" in proc.stderr
    proc = _run(["--out", "/tmp/tp_launcher_test_nogpu", "--world", "4", "--quick"], CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2 and "needs at least 2 CUDA GPUs" in proc.stderr


def test_bad_usage_exits_2():
    assert _run(["--out", "/tmp/x", "--cases", "nonsense"], timeout=60).returncode == 2
    assert _run([], timeout=60).returncode == 2  # --out is required (argparse)


def _fake_case_runner(captured, fail_case=None):
    """Stands in for run_case: remembers the environment at spawn time and writes rank records."""
    def fake(world, case, cfg, timeout_s):
        captured.append(dict(env={k: os.environ.get(k) for k in MULTICAST_OFF}, case=case, world=world,
                             timeout_s=timeout_s))
        for rank in range(world):
            w = tp.RecordWriter(tp._part_path(cfg["parts"], world, case, rank))
            if rank == 0:
                w.write(kind="meta", meta=dict(date="2026-11-29", gpu="fake", commit="abc"))
            w.write(kind="check", case=case, impl="cute_kernels_fused", rank=rank,
                    shape=dict(world=world, n=64, q=4096, k=1024, dtype="bfloat16"), passed=case != fail_case,
                    max_excess=0.001)
            w.write(kind="done", case=case, rank=rank, wall_s=0.1)
        return tp.CaseOutcome(world, case, [0] * world, None, 0.1)
    return fake


def test_main_sets_env_before_spawning_and_writes_records(monkeypatch, tmp_path, capsys):
    for k in MULTICAST_OFF:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setattr(tp, "gpu_count", lambda: 4)
    captured = []
    monkeypatch.setattr(tp, "run_case", _fake_case_runner(captured))
    rc = tp.main(["--out", str(tmp_path), "--world", "2,4", "--quick", "--cases", "late_rank,missing_rank"])
    assert rc == 0
    assert [(c["world"], c["case"]) for c in captured] == [(2, "late_rank"), (2, "missing_rank"),
                                                           (4, "late_rank"), (4, "missing_rank")]
    for c in captured:
        assert c["env"] == MULTICAST_OFF
    recs = json.loads((tmp_path / "tp_qknorm.json").read_text())
    assert len(recs) == 4
    for r in recs:
        assert r["kernel"] == "qknorm_tp" and r["passed"] and r["gpu"] == "fake" and "time_us" in r
        assert set(r["shape"]) >= {"world", "n", "q", "k", "dtype"}
        assert r["ranks"] == list(range(r["shape"]["world"]))
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "OVERALL: PASS"
    assert (tmp_path / "summary.txt").read_text().strip().splitlines()[-1] == "OVERALL: PASS"


def test_main_fails_on_a_failed_record_and_rejects_too_many_ranks(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tp, "gpu_count", lambda: 2)
    monkeypatch.setattr(tp, "run_case", _fake_case_runner([], fail_case="stress"))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    for k, v in MULTICAST_OFF.items():
        monkeypatch.setenv(k, v)
    assert tp.main(["--out", str(tmp_path), "--cases", "correctness,stress"]) == 1
    out = capsys.readouterr().out
    assert "FAIL    G=2 stress" in out and out.strip().splitlines()[-1] == "OVERALL: FAIL"
    assert tp.main(["--out", str(tmp_path), "--world", "4"]) == 2
    assert tp.main(["--out", str(tmp_path), "--world", "3"]) == 2
    assert tp.main(["--out", str(tmp_path), "--deadline-s", "20"]) == 1  # nothing fits: reported as not run
    assert "NOT RUN G=2 correctness" in capsys.readouterr().out


def test_merge_marks_a_missing_rank_result_and_a_crash():
    shape = dict(world=2, n=1, q=4096, k=1024, dtype="float16")
    recs = [dict(kind="check", case="correctness", impl="f", rank=0, shape=shape, passed=True, max_excess=0.0),
            dict(kind="error", case="correctness", rank=1, error="RuntimeError: boom"),
            dict(kind="done", case="correctness", rank=0)]
    outcome = tp.CaseOutcome(2, "correctness", [0, 1], "process exit codes [0, 1]", 1.0)
    merged, meta = tp.merge_records(2, "correctness", recs, outcome)
    assert meta is None
    check = [r for r in merged if r["impl"] == "f"][0]
    assert not check["passed"] and check["ranks"] == [0]  # rank 1's result is missing
    crash = [r for r in merged if r["impl"] == "process"][0]
    assert not crash["passed"] and crash["rank_errors"] == {1: "RuntimeError: boom"}


def test_spawned_ranks_see_the_env_and_agree_on_sequences(tmp_path):
    """The real launcher path (spawn, file store, gloo, part files), without CUDA."""
    proc = _run(["--out", str(tmp_path), "--world", "2", "--cases", "_selftest_ok"], timeout=180,
                NCCL_NVLS_ENABLE="1")  # the parent must override it
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "OVERALL: PASS"
    rec = json.loads((tmp_path / "tp_qknorm.json").read_text())[0]
    assert rec["passed"] and rec["ranks"] == [0, 1] and all(r["env_ok"] for r in rec["per_rank"])
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"w2__selftest_ok.rank{rank}.log").read_text()
        assert "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" in log


def test_watchdog_kills_a_hung_case_and_reports_it(tmp_path):
    proc = _run(["--out", str(tmp_path), "--world", "2", "--cases", "_selftest_hang"], timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "HANG: watchdog fired" in proc.stdout
    assert "in _selftest_hang" in proc.stdout  # the hung rank's stack, dumped before the kill
    rec = json.loads((tmp_path / "tp_qknorm.json").read_text())[0]
    assert rec["impl"] == "process" and not rec["passed"] and "HANG" in rec["error"]


DRYRUN = ROOT / "tests" / "tp_launcher_dryrun.py"


def _dryrun(out, cases=None, **env):
    args = [sys.executable, str(DRYRUN), str(out)] + ([cases] if cases else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=dict(os.environ, **env), cwd=str(ROOT))


def test_every_gpu_case_runs_on_cpu_through_an_emulated_norm(tmp_path):
    """The cases' own code (data, gather, reference, checks, timing, records), two gloo ranks."""
    proc = _dryrun(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for case in tp.CASES:
        assert f"PASS    G=2 {case}" in proc.stdout, proc.stdout
    assert "fused/graph" in proc.stdout  # the latency table


def test_cases_catch_wrong_results_and_writes_outside_the_shards(tmp_path):
    proc = _dryrun(tmp_path / "scale", "correctness,stress", DRYRUN_BUG="scale")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAIL    G=2 correctness" in proc.stdout and "FAIL    G=2 stress" in proc.stdout
    proc = _dryrun(tmp_path / "pad", "correctness", DRYRUN_BUG="pad")
    assert proc.returncode == 1 and "false: padding_untouched" in proc.stdout, proc.stdout[-3000:]
