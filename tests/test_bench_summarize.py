"""bench/summarize.py: the markdown tables written next to the bench records."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("summarize", Path(__file__).parents[1] / "bench" / "summarize.py")
summarize = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summarize)


def test_attention_records_compare_with_the_fa4_peer():
    shape = {"b": 4, "h": 16}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="graph", time_us=100.0, tflops=600),
                            dict(impl="fa4_mask_mod", shape=shape, mode="graph", time_us=120.0, tflops=500),
                            dict(impl="flex", shape=shape, mode="graph", time_us=None, error="boom")])
    assert "| b=4,h=16 | cute_kernels | graph | 100.0 | 600 | 1.20x |" in text
    assert "error: boom" in text
    assert "settled" not in text.splitlines()[0]  # (records from before session 82: no settle_s)


def test_header_says_when_the_times_were_settled():
    shape = {"b": 4}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="graph", time_us=100.0, tflops=600,
                                 settle_s=1.0, gpu="H100", commit="abc"),
                            dict(impl="cute_kernels", shape=shape, mode="isolated", time_us=130.0, tflops=460)])
    assert text.splitlines()[0].endswith("; graph and eager times taken after 1 s of calls (settled clocks)")


def test_eager_rows_compare_with_the_peers_eager_time():
    shape = {"b": 4, "h": 16}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="graph", time_us=100.0, tflops=600),
                            dict(impl="fa4_mask_mod", shape=shape, mode="graph", time_us=120.0, tflops=500),
                            dict(impl="cute_kernels", shape=shape, mode="eager", time_us=110.0, tflops=545),
                            dict(impl="fa4_mask_mod", shape=shape, mode="eager", time_us=220.0, tflops=273)])
    assert "| b=4,h=16 | cute_kernels | graph | 100.0 | 600 | 1.20x |" in text
    assert "| b=4,h=16 | cute_kernels | eager | 110.0 | 545 | 2.00x |" in text
    assert "| b=4,h=16 | fa4_mask_mod | eager | 220.0 | 273 | 1.00x |" in text


def test_isolated_rows_show_the_host_speed_they_were_taken_at():
    shape = {"b": 4}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="isolated", time_us=1000.0, tflops=400,
                                 torch_mul_us=12.46),
                            dict(impl="fa4_mask_mod", shape=shape, mode="isolated", time_us=1300.0, tflops=300,
                                 torch_mul_us=8.0)])
    assert "| b=4 | cute_kernels | isolated (torch.mul 12.5 us) | 1000.0 | 400 | 1.30x |" in text
    assert "| b=4 | fa4_mask_mod | isolated (torch.mul 8.0 us) | 1300.0 | 300 | 1.00x |" in text


def test_graph_rows_fall_back_to_fa4_eager_and_error_rows_keep_their_mode():
    shape = {"b": 4}
    text = summarize.table([dict(impl="cute_kernels", shape=shape, mode="graph", time_us=100.0, tflops=600),
                            dict(impl="fa4_mask_mod", shape=shape, mode="eager", time_us=150.0, tflops=400),
                            dict(impl="cute_kernels", shape=shape, mode="isolated", error="boom")])
    assert "| b=4 | cute_kernels | graph | 100.0 | 600 | 1.50x (FA4 eager) |" in text
    assert "| b=4 | cute_kernels | isolated | error: boom | | |" in text


def test_one_table_per_kernel():
    text = summarize.table([dict(kernel="ranker_fwd", impl="cute_kernels", shape={"b": 1}, mode="graph", time_us=10.0,
                                 tflops=600),
                            dict(kernel="qknorm", impl="cute_kernels", shape={"n": 1}, mode="graph", time_us=2.0,
                                 gbps=12.0, copy_bw_frac=0.01)])
    fwd, qk = text.split("### qknorm")
    assert "### ranker_fwd" in fwd and "useful TFLOP/s" in fwd and "GB/s" not in fwd
    assert "| b=1 | cute_kernels | graph | 10.0 | 600 |  |" in fwd
    assert "GB/s" in qk and "| n=1 | cute_kernels | graph | 2.0 | 12 | 1.0% |" in qk


def test_bandwidth_records_show_gbps_and_copy_fraction():
    text = summarize.table([dict(impl="cute_kernels", shape={"m": 4096, "k": 20480}, mode="graph", time_us=74.0,
                                 gbps=2267.4, copy_bw_frac=0.534)])
    assert "GB/s" in text and "useful TFLOP/s" not in text
    assert "| m=4096,k=20480 | cute_kernels | graph | 74.0 | 2267 | 53.4% |" in text
    # qknorm's records name the fraction copy_frac (its bench since session 2), hc_mix's copy_bw_frac
    text = summarize.table([dict(kernel="qknorm", impl="cute_kernels", shape={"n": 16384}, mode="graph", time_us=84.4,
                                 gbps=3973.7, copy_frac=0.9401)])
    assert "| n=16384 | cute_kernels | graph | 84.4 | 3974 | 94.0% |" in text


def test_latency_records_show_times_alone():
    """Records with neither ``tflops`` nor ``gbps`` (the emulated tensor-parallel bench's) get a table of times,
    without the attention table's empty TFLOP/s and FA4 columns (session 64, a newcomer's note)."""
    text = summarize.table([dict(kernel="qknorm_tp", impl="cute_kernels_fused", shape={"g": 2, "n": 1}, mode="graph",
                                 time_us=4.7),
                            dict(kernel="qknorm_tp", impl="torch_unfused", shape={"g": 2, "n": 1}, mode="graph",
                                 time_us=None, error="timeout")])
    assert "| shape | impl | mode | time (us) |\n" in text and "TFLOP/s" not in text and "GB/s" not in text
    assert "| g=2,n=1 | cute_kernels_fused | graph | 4.7 |\n" in text
    assert text.rstrip().endswith("| g=2,n=1 | torch_unfused | graph | error: timeout |")


def test_probe_timing_interleaves_rounds_and_reports_medians(capsys):
    """bench/probe_timing.py (the probes' shared loop): every config of every case once per round, in
    order, medians over rounds, one JSON line per case with [median us, useful TFLOP/s]."""
    import json

    spec = importlib.util.spec_from_file_location("probe_timing", Path(__file__).parents[1] / "bench" / "probe_timing.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    calls, times = [], iter([10.0, 20.0, 30.0, 12.0, 22.0, 32.0, 11.0, 24.0, 31.0])

    def time_us(fn, reps, inner):
        fn()
        return next(times)

    cases = [("A", "qa", "k", "v", "b", None, 2e9, {"x": "cx", "y": "cy"}), ("B", "qb", "k", "v", "b", 5.0, 3e9, {"x": "cx"})]
    med = pt.time_configs(cases, launch=lambda q, k, v, b, cap, cfg: calls.append((q, cap, cfg)), time_us=time_us)
    assert calls == [("qa", None, "cx"), ("qa", None, "cy"), ("qb", 5.0, "cx")] * 3
    assert med == {"A": {"x": 11.0, "y": 22.0}, "B": {"x": 31.0}}
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert lines == [{"shape": "A", "x": [11.0, 182], "y": [22.0, 91]}, {"shape": "B", "x": [31.0, 97]}]


def test_probe_timing_default_timer_settles(monkeypatch, capsys):
    """Without a ``time_us``, the probes' loop times with ``cuda_time_us`` in a CUDA graph after ``SETTLE_S``
    seconds of calls (the board's sustained clock, as the benches since session 82)."""
    from cute_kernels.runtime import timing

    spec = importlib.util.spec_from_file_location("probe_timing", Path(__file__).parents[1] / "bench" / "probe_timing.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    seen = []

    def fake_cuda_time_us(fn, **kw):
        seen.append(kw)
        return 10.0

    monkeypatch.setattr(timing, "cuda_time_us", fake_cuda_time_us)
    pt.time_configs([("A", "q", "k", "v", "b", None, 1e9, {"x": "cx"})], rounds=2, launch=lambda *a: None)
    assert seen == [dict(reps=8, inner=5, settle_s=timing.SETTLE_S)] * 2 and timing.SETTLE_S > 0


def test_probe_variants_parse_and_validate(capsys):
    """probe_timing.parse_variant reads ``NAME=field:value,...`` from a probe's command line;
    variant_configs keeps the shipped config first, drops invalid variants (saying why) and duplicates."""
    import json

    from cute_kernels.kernels import ranker_bwd as rb

    spec = importlib.util.spec_from_file_location("probe_timing", Path(__file__).parents[1] / "bench" / "probe_timing.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    assert pt.parse_variant("ds1=ds_stages:1,dq_per_wg:False") == ("ds1", {"ds_stages": 1, "dq_per_wg": False})
    base = rb.CONFIGS[128]
    variants = [pt.parse_variant(a) for a in ("ds1=ds_stages:1", "bad=stages:9", "same=dq_first:True",
                                              "typed=gqa_group_per_cta:1")]
    cfgs = pt.variant_configs(base, variants, "D=128")
    assert list(cfgs) == ["shipped", "ds1"] and cfgs["ds1"].ds_stages == 1 and cfgs["shipped"] is base
    out = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [o["variant"] for o in out] == ["bad", "typed"] and "stages=9" in out[0]["invalid"]
    assert "gqa_group_per_cta=1" in out[1]["invalid"]
    for bad, msg in (("nofields", "expected NAME=field:value"), ("x=stages", "expected NAME=field:value"),
                     ("x=stages:(", "variant 'x=stages:\\('")):
        with pytest.raises(ValueError, match=msg):
            pt.parse_variant(bad)
    with pytest.raises(ValueError, match=r"has no field \['tile_k'\]"):
        pt.variant_configs(base, [("typo", {"tile_k": 1})], "D=128")


def test_probe_ranker_inputs_shapes_and_draw_order():
    """probe_timing.ranker_inputs: one bench case's tensors and key; the same seed gives the same q, and q is
    drawn first whether or not dout is (so the forward probes' inputs match the backward's q)."""
    import torch

    spec = importlib.util.spec_from_file_location("probe_timing", Path(__file__).parents[1] / "bench" / "probe_timing.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    key, q, k, v, bounds, do = pt.ranker_inputs((2, 6, 3, 4, 2, 64, None), seed=1, device="cpu")
    assert key == "B=2,h=6,c=3,H=4/2,D=64,cap=None" and do is None
    assert q.shape == (2, 9, 4, 64) and k.shape == v.shape == (2, 9, 2, 64) and q.dtype == torch.bfloat16
    assert bounds.tolist() == [[0, 6, 6, 9]] * 2 and bounds.dtype == torch.int32
    _, q2, k2, _, _, do2 = pt.ranker_inputs((2, 6, 3, 4, 2, 64, None), seed=1, dout=True, device="cpu")
    assert torch.equal(q, q2) and do2.shape == q.shape and not torch.equal(k, k2)


def test_probe_timing_shuffle_and_control(capsys):
    """Shuffled rounds time every config once per round (plus the A/A repeat of the first), in a
    seeded order that differs between rounds; spread_pct is (max - min) / median per name; the
    command line's --rounds/--seed/flags are parsed and bad ones named."""
    import json

    spec = importlib.util.spec_from_file_location("probe_timing", Path(__file__).parents[1] / "bench" / "probe_timing.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    order, clock = [], iter(range(1, 100))

    def time_us(fn, reps, inner):
        fn()
        return float(next(clock))

    cfgs = {"shipped": "c0", "a": "c1", "b": "c2", "c": "c3"}
    cases = [("A", "q", "k", "v", "b", None, 1e9, cfgs)]
    med = pt.time_configs(cases, rounds=4, launch=lambda q, k, v, b, cap, cfg: order.append(cfg), time_us=time_us,
                          shuffle_seed=7, control=True)
    rounds = [order[i:i + 5] for i in range(0, 20, 5)]
    assert all(sorted(r) == ["c0", "c0", "c1", "c2", "c3"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1, "the order must change between rounds"
    assert list(med["A"]) == ["shipped", "a", "b", "c", "shipped_again"]
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(line["spread_pct"]) == set(med["A"]) and all(v > 0 for v in line["spread_pct"].values())
    pt2 = pt.time_configs(cases, rounds=1, launch=lambda *a: None, time_us=time_us)
    assert list(pt2["A"]) == list(cfgs)  # no control, no shuffle: the given order, no A/A entry

    variants, opts = pt.probe_options(["--fa4", "x=stages:3", "--rounds=7", "--seed=3"], flags=("--fa4",))
    assert variants == [("x", {"stages": 3})] and opts == dict(fa4=True, rounds=7, shuffle_seed=3, control=True,
                                                                reps=8, inner=5)
    assert pt.probe_options(["--reps=30", "--inner=20"])[1] | {"shuffle_seed": 0} == dict(
        rounds=5, shuffle_seed=0, control=True, reps=30, inner=20)
    assert pt.probe_options(["--seed=0"])[1]["shuffle_seed"] == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        pt.probe_options(["x=stages:3", "--help"], doc="the probe's doc")
    assert exit_info.value.code == 0 and "the probe's doc" in capsys.readouterr().out
    for bad in (["--rounds=0"], ["--seed=x"], ["--seed=-3"], ["--rounds=\u00b2"], ["--reps=0"], ["--inner=x"], ["--fast"], ["a=stages:3", "a=stages:4"],
                ["shipped=stages:3"]):
        with pytest.raises(ValueError, match="positive integer|non-negative integer|unknown option|used twice"):
            pt.probe_options(bad, flags=("--fa4",))
    # --jobs=N only where the probe takes it (the backward probe's parallel precompile)
    assert pt.probe_options(["--jobs=4"], jobs=True)[1]["jobs"] == 4
    assert pt.probe_options([], jobs=True)[1]["jobs"] is None
    for bad, kw in ((["--jobs=0"], dict(jobs=True)), (["--jobs=abc"], dict(jobs=True)), (["--jobs=-1"], dict(jobs=True)),
                    (["--jobs"], dict(jobs=True)), (["--jobs=2"], {})):
        with pytest.raises(ValueError, match="positive integer|unknown option"):
            pt.probe_options(bad, **kw)


def test_bwd_probe_precompiles_what_the_probe_launches(monkeypatch, capsys):
    """bench/ranker_bwd_config_probe.py --jobs: the compile keys are the eager call's (cap method "none"
    without a cap: a "tanh" key there would leave the headline kernels to compile on first launch; the GQA
    form, the walk's stagger and the dQ zeroing resolved as the call resolves them)."""
    import multiprocessing
    import sys
    from types import SimpleNamespace

    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    sys.modules.pop("ranker_bwd_config_probe", None)
    import ranker_bwd_config_probe as probe

    seen = []

    class Pool:
        def __init__(self, n):
            assert n == 3

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, items, chunksize=1):
            seen.extend(items)

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(multiprocessing, "get_context", lambda kind: SimpleNamespace(Pool=Pool))
    rb = probe.rb
    assert probe.probe_cases() == rb.BENCH_CASES and probe.probe_cases(d256=True) == rb.D256_CASES
    assert probe.probe_cases(headline=True) == rb.BENCH_CASES[:2]
    assert {c[5] for c in probe.probe_cases(d64=True)} == {64}
    with pytest.raises(ValueError, match="--d256"):
        probe.probe_cases(d64=True, d256=True)
    cases = rb.BENCH_CASES + rb.D256_CASES
    probe.precompile([("ds1", {"ds_stages": 1})], 3, cases)
    want = set()
    for nb, hist, cand, hq, hkv, d, cap in cases:
        base = rb.config_for(d, cap is not None)
        for cfg in {base, rb.dataclasses.replace(base, ds_stages=1)}:
            for det in (False, True):
                c = rb.resolve_gqa_group(rb.dataclasses.replace(cfg, deterministic=det), hq // hkv, nb, hkv,
                                         hist + cand, 132)
                c = rb.resolve_walk_stagger(c, hist + cand, 132)
                c = rb.resolve_dq_zeroing(c, hist + cand, 132)
                want.add((torch.bfloat16, c, hq // hkv, "none" if cap is None else "tanh", False))
    mains = [a["main"] for a in seen]
    assert set(mains) == want and len(mains) == len(want)
    assert any(k[3] == "none" for k in mains) and any(k[3] == "tanh" for k in mains)


def _run_bench_script(script: str, *args: str):
    """``python3 bench/<script> <args>`` from the checkout (no install needed), its output captured."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    return subprocess.run([sys.executable, str(root / "bench" / script), *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), timeout=120)


@pytest.mark.parametrize("script", ["qknorm_sweep.py", "qknorm_split_probe.py", "qknorm_packed_probe.py",
                                    "qknorm_launch_bound_probe.py", "qknorm_l2_prefetch_probe.py"])
def test_qknorm_bench_scripts_command_line(script):
    """The Q/K norm sweep and probes: --help prints the usage and exits 0; a bad value or an unknown
    argument exits 2 with a message (no traceback); without a GPU a valid call exits 2 saying so."""
    def run(*args):
        return _run_bench_script(script, *args)

    r = run("--help")
    assert r.returncode == 0 and "python3 bench/" + script in r.stdout
    for bad in (("--rounds=abc", "--n=0", "--qk=4096") if script == "qknorm_sweep.py" else ("--bogus",)):
        r = run(bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr and repr(bad) in r.stderr, (bad, r.stderr[-300:])
    import torch

    if script == "qknorm_sweep.py" and not torch.cuda.is_available():
        r = run()
        assert r.returncode == 2 and "CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("script", ["size1_stride_probe.py", "hc_mix_read_floor.py", "host_breakdown.py",
                                    "hc_mix_host_breakdown.py", "hc_mix_splitk_triton.py", "qknorm_quick.py",
                                    "ranker_timing_order_probe.py"])
def test_gpu_scripts_help_and_no_gpu(script):
    """Bench scripts that time on the GPU (``probe_timing.gpu_script`` first): --help prints the docstring and
    exits 0 (before any GPU or Triton import); without a GPU a plain run exits 2 saying so, no traceback."""
    import torch

    def run(*args):
        return _run_bench_script(script, *args)

    r = run("--help")
    doc = (Path(__file__).parents[1] / "bench" / script).read_text().split('"""')[1].strip().splitlines()[0]
    assert r.returncode == 0 and doc in r.stdout, r.stderr[-300:]
    if not torch.cuda.is_available():
        r = run()
        assert r.returncode == 2 and "CUDA GPU" in r.stderr and "Traceback" not in r.stderr, r.stderr[-300:]


def test_load_records_forms_and_refusals(tmp_path):
    """JSON list, {"results": [...]} wrapper and JSON lines load (entries without impl left out); a file with
    no record is a ValueError saying what it holds; a correctness record renders as a check, not an error."""
    rec = dict(impl="cute_kernels", shape={"n": 1}, mode="graph", time_us=2.0, gbps=1.0)
    (tmp_path / "a.json").write_text(json.dumps([rec]))
    (tmp_path / "b.json").write_text(json.dumps({"date": "x", "results": [rec]}))
    (tmp_path / "c.jsonl").write_text(json.dumps({"copy_gbps": 4000}) + "\n" + json.dumps(rec) + "\n")
    (tmp_path / "a1.json").write_text(json.dumps(rec))  # one record on its own
    for name in ("a.json", "a1.json", "b.json", "c.jsonl"):
        assert summarize.load_records(str(tmp_path / name)) == [rec]
    (tmp_path / "a2.json").write_text(json.dumps(dict(rec, time_us="abc")))  # its bad field is named
    with pytest.raises(ValueError, match="time_us must be"):
        summarize.load_records(str(tmp_path / "a2.json"))
    (tmp_path / "d.json").write_text(json.dumps({"cold": 1.0, "warm": 2.0}))
    with pytest.raises(ValueError, match="no bench records.*'cold'"):
        summarize.load_records(str(tmp_path / "d.json"))
    (tmp_path / "e.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="a list"):
        summarize.load_records(str(tmp_path / "e.json"))
    (tmp_path / "f.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\nnot json\n")
    with pytest.raises(ValueError, match="line 3 is not JSON"):
        summarize.load_records(str(tmp_path / "f.jsonl"))
    (tmp_path / "g.json").write_text(" \n")
    with pytest.raises(ValueError, match="empty"):
        summarize.load_records(str(tmp_path / "g.json"))
    # the fields the tables read, each with a wrong type: a one-line ValueError naming the record
    for field, value, message in (("shape", [1, 2], "shape must be an object"), ("shape", None, "shape must be"),
                                  ("time_us", "fast", "time_us must be"), ("time_us", True, "time_us must be"),
                                  ("time_us", -1.0, "time_us must be"), ("time_us", float("nan"), "time_us must be"),
                                  ("kernel", {"x": 1}, "kernel must be a string"), ("gbps", "1", "gbps must be"),
                                  ("impl", 3, "impl must be a string")):
        (tmp_path / "h.json").write_text(json.dumps([rec, {**rec, field: value}]))
        with pytest.raises(ValueError, match=f"record 2 .*{message}"):
            summarize.load_records(str(tmp_path / "h.json"))
    checks = [dict(impl="fused", shape={"world": 2}, mode=None, time_us=None, passed=True),
              dict(impl="fused", shape={"world": 4}, mode=None, time_us=None, passed=False, error="max_err 1.0")]
    text = summarize.table(checks)
    assert "check passed" in text and "check FAILED: max_err 1.0" in text and "error: ?" not in text and "None" not in text.split("\n", 2)[2]


def test_skipped_peer_records_say_why_in_the_table():
    """A bench that spent its peers' time budget writes one record per skipped peer, and the table shows it."""
    from cute_kernels.kernels.ranker_bench import skipped_peer_records

    recs = skipped_peer_records("ranker_bwd", {"B": 8}, ["fa4_mask_mod", "flex_attention"], 400.0)
    assert [r["impl"] for r in recs] == ["fa4_mask_mod", "flex_attention"]
    text = summarize.table([dict(impl="cute_kernels", shape={"B": 8}, mode="graph", time_us=10.0, tflops=1), *recs])
    assert text.count("error: skipped: the peers' time budget") == 2


def test_bench_loop_interleaves_and_records(monkeypatch):
    """ranker_bench.run, the two ranker benches' loop, on the CPU with a fake timer: rounds interleave the
    impls, each round starting one impl later than the one before, a peer that fails to build or to run becomes an error record (its later rounds skipped), the best
    round is the record's time, and peers past their time budget get 'skipped' records."""
    import types

    from cute_kernels.kernels import ranker_bench

    monkeypatch.setattr(ranker_bench.torch, "Generator", lambda device: types.SimpleNamespace(manual_seed=lambda s: s))
    monkeypatch.setattr(ranker_bench, "host_mode_records", lambda *a: [])  # (needs CUDA; tested on its own)
    order, clock = [], iter([30.0, 10.0, 20.0, 5.0, 25.0, 6.0])

    def timer(fn):
        order.append(fn())
        if order[-1] == "bad":
            raise RuntimeError("no")
        return next(clock), "graph"

    def bad_peer(*args):
        raise ValueError("cannot build")

    peers = types.SimpleNamespace(PEERS={"peer": lambda *args: (lambda: "peer"), "broken": bad_peer,
                                         "flaky": lambda *args: (lambda: "bad")})

    def setup(case, gen):
        return ranker_bench.Case(dict(B=case), 10**8, [("cute_kernels", lambda: "ours")], (case,))

    recs = ranker_bench.run("ranker_fwd", [1], setup, peers, 1e9, rounds=3, echo=False, timer=timer)
    assert order == ["ours", "peer", "bad", "peer", "ours", "ours", "peer"]  # (rounds 2, 3 start at peer, flaky)
    by = {(r["impl"], "error" in r): r for r in recs}
    assert by[("cute_kernels", False)]["time_us"] == 5.0 and by[("cute_kernels", False)]["runs_us"] == [30.0, 5.0, 25.0]
    assert "settle_s" not in by[("cute_kernels", False)]  # (only time_us, the GPU timer, settles)
    assert by[("peer", False)]["time_us"] == 6.0 and by[("peer", False)]["runs_us"] == [10.0, 20.0, 6.0]
    assert [r["impl"] for r in recs if "error" not in r] == ["cute_kernels", "peer"]  # (records in impl order)
    assert "cannot build" in by[("broken", True)]["error"] and "no" in by[("flaky", True)]["error"]
    recs = ranker_bench.run("ranker_fwd", [1], setup, peers, -1.0, rounds=1, echo=False,
                            timer=lambda fn: (1.0, "graph"))
    assert sorted(r["impl"] for r in recs if "skipped" in r.get("error", "")) == ["broken", "flaky", "peer"]


def test_rotated_starts_each_round_one_item_later():
    """``runtime.timing.rotated``: the order of round ``r`` of the benches' and the tuner's loops."""
    from cute_kernels.runtime.timing import rotated

    assert [rotated([1, 2, 3], r) for r in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]
    assert rotated([], 5) == []
