"""GPU: the bench timer around CUDA-graph capture (``runtime.timing.cuda_time_us``, ``ranker_bench.time_us`` and
``ranker_bench.run``): a backward (``torch.autograd.grad``) whose forward ran on the bench's stream is captured, in
the first case too, and a failed capture leaves the caller's stream current.  Session 70 found that every backward
bench since session 7 timed its first case's peers eagerly: their forwards ran on the legacy default stream
(``bench/results/logs/2026-12-06_s70_h100_ranker_bwd_first_case_capture.log``)."""

import types

import pytest
import torch

from cute_kernels.kernels import ranker_bench
from cute_kernels.runtime.timing import cuda_time_us


def _backward_peer(gen, n=1 << 16):
    """A peer as the backward bench builds one: the forward runs now (on the current stream), ``fn`` the backward."""
    x = torch.randn(n, device="cuda", generator=gen).requires_grad_(True)
    out = x.sin() * 3.0
    dout = torch.randn(out.shape, device="cuda", generator=gen)
    return lambda: torch.autograd.grad(out, x, dout, retain_graph=True)


def test_bench_loop_captures_a_backward_peer_in_its_first_case(monkeypatch):
    """``ranker_bench.run`` with a peer whose forward runs at build time, as FA4's and Flex's backward peers do:
    graph mode in the first case and the next (before session 70 the loop ran on the caller's stream, the legacy
    default one, where a peer's forward left its backward uncapturable), and the caller's stream current again
    afterwards."""
    monkeypatch.setattr(ranker_bench, "host_mode_records", lambda *a: [])

    def setup(case, gen):
        ours = _backward_peer(gen)
        return ranker_bench.Case(dict(B=case), 10**9, [("cute_kernels", ours)], (gen,))

    peers = types.SimpleNamespace(PEERS={"autograd_peer": _backward_peer})
    before = torch.cuda.current_stream()
    recs = ranker_bench.run("ranker_bwd", [1, 2], setup, peers, 1e9, rounds=1, echo=False)
    assert torch.cuda.current_stream() == before
    assert [(r["impl"], r["shape"]["B"], r.get("mode"), r.get("error")) for r in recs] == [
        ("cute_kernels", 1, "graph", None), ("autograd_peer", 1, "graph", None),
        ("cute_kernels", 2, "graph", None), ("autograd_peer", 2, "graph", None)]


def test_captured_backward_runs_on_every_replay():
    """The captured graph holds the whole backward: call ``i`` (counted on the GPU, in the graph) adds the
    gradient for ``i * dout`` into ``acc``, so after ``cuda_time_us`` ``acc`` is ``1 + 2 + ... + calls`` times the
    gradient for ``dout`` (``warmup`` eager calls, then ``inner`` per replay: one replay before timing and one per
    sample).  A backward computed once at capture and left off the graph would add the same stale gradient on
    every replay.  Counting, not timing: session 70's version compared graph with eager time, and in session 71 it
    failed beside eleven other test shards on the same GPU."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(1 << 20, device="cuda", generator=gen).requires_grad_(True)
        out = x.sin() * 3.0  # (the forward on the bench's stream, as ranker_bench.run's peers)
        dout = torch.randn(out.shape, device="cuda", generator=gen)
        grad_one = torch.autograd.grad(out, x, dout, retain_graph=True)[0].double()
        count = torch.zeros((), device="cuda")
        acc = torch.zeros_like(x, requires_grad=False)

        def call():
            count.add_(1)
            acc.add_(torch.autograd.grad(out, x, dout * count, retain_graph=True)[0])

        cuda_time_us(call, graph=True, stream=s, warmup=2, inner=3, reps=4)
        torch.cuda.synchronize()
    calls = 2 + 3 * (1 + 4)
    assert count.item() == calls
    total = calls * (calls + 1) // 2
    torch.testing.assert_close(acc.double(), total * grad_one, rtol=1e-4, atol=1e-4 * total)


def test_stream_must_be_the_current_one():
    s = torch.cuda.Stream()
    with pytest.raises(ValueError, match="current stream"):
        cuda_time_us(lambda: None, graph=True, stream=s)


_FAILED_CAPTURE = """
import torch
from cute_kernels.runtime.timing import cuda_time_us
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    try:  # torch alone: a failed capture leaves its capture stream current
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.cuda.synchronize()
    except Exception as exc:
        assert "captur" in str(exc), exc
    print("torch leaves the capture stream current:", torch.cuda.current_stream() != s)
    torch.cuda.set_stream(s)
    try:
        cuda_time_us(torch.cuda.synchronize, graph=True, reps=1, inner=1, warmup=1)
    except Exception as exc:
        assert "captur" in str(exc), exc
    else:
        raise AssertionError("the capture did not fail")
    print("cuda_time_us restores the caller's stream:", torch.cuda.current_stream() == s)
x = torch.ones(8, device="cuda")
print("capture works again:", cuda_time_us(lambda: torch.mul(x, x), graph=True, reps=2, inner=2) > 0)
"""


def test_a_failed_capture_restores_the_current_stream():
    """``torch.cuda.graph`` leaves its capture stream current when ``capture_end`` raises; ``cuda_time_us`` raises
    with the caller's stream current again.  In a process of its own: a failed capture also leaves torch's caching
    allocator with a capture it thinks is under way (``empty_cache`` then skips the default pools), which other
    tests of this process would inherit."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _FAILED_CAPTURE], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # (the first line says whether torch still needs the restore: True in 2.11)
    assert len(lines) == 3 and lines[0].startswith("torch leaves"), done.stdout
    assert lines[1:] == ["cuda_time_us restores the caller's stream: True", "capture works again: True"], done.stdout


@pytest.mark.parametrize("graph", [True, False])
def test_settle_runs_calls_before_the_samples(graph):
    """``settle_s``: calls run back to back for that long before the samples (the bench's settled clocks, session
    82), counted on the GPU: without it exactly ``warmup + inner * (1 + reps)`` calls run; with it, more, and they
    take at least ``settle_s`` of wall time."""
    import time

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        count = torch.zeros((), device="cuda")
        x = torch.randn(1 << 16, device="cuda")

        def call():
            count.add_(1)
            x.mul_(1.0)

        stream = s if graph else None
        cuda_time_us(call, graph=graph, stream=stream, warmup=2, inner=3, reps=4)
        torch.cuda.synchronize()
        plain = 2 + 3 * (1 + 4)  # (graph on the current stream: no side-stream warm-up; the capture runs nothing)
        assert count.item() == plain
        count.zero_()
        t0 = time.perf_counter()
        cuda_time_us(call, graph=graph, stream=stream, warmup=2, inner=3, reps=4, settle_s=0.2)
        torch.cuda.synchronize()
        assert time.perf_counter() - t0 >= 0.2
        assert count.item() > plain
