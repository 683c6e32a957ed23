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


def _backward_peer(gen):
    """A peer as the backward bench builds one: the forward runs now (on the current stream), ``fn`` the backward."""
    x = torch.randn(1 << 16, device="cuda", generator=gen).requires_grad_(True)
    out = x.sin() * 3.0
    dout = torch.randn(out.shape, device="cuda", generator=gen)
    return lambda: torch.autograd.grad(out, x, dout, retain_graph=True)


def test_bench_loop_captures_a_backward_peer_in_its_first_case(monkeypatch):
    """``ranker_bench.run`` with a peer whose forward runs at build time, as FA4's and Flex's backward peers do:
    graph mode in the first case and the next (before session 70 the first case fell back to eager), and the
    caller's stream current again afterwards."""
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


def test_graph_time_of_a_backward_counts_its_kernels():
    """The captured backward is the whole backward: its graph time is not far under its eager time (a backward
    left on another stream would be missing from the graph and time near zero)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn = _backward_peer(torch.Generator(device="cuda").manual_seed(1))
        graph_us = cuda_time_us(fn, graph=True, stream=s)
        eager_us = cuda_time_us(fn, graph=False)
    assert graph_us > 0.3 * eager_us, (graph_us, eager_us)


def test_a_failed_capture_restores_the_current_stream():
    """``torch.cuda.graph`` leaves its capture stream current when ``capture_end`` raises; ``cuda_time_us`` raises
    with the caller's stream current again (a later call on the default stream would otherwise run on the
    capture stream), with and without ``stream``."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with pytest.raises(Exception):
            cuda_time_us(torch.cuda.synchronize, graph=True, reps=1, inner=1, warmup=1)
        assert torch.cuda.current_stream() == s
        with pytest.raises(Exception):
            cuda_time_us(torch.cuda.synchronize, graph=True, reps=1, inner=1, warmup=1, stream=s)
        assert torch.cuda.current_stream() == s
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    x = torch.ones(8, device="cuda")
    assert cuda_time_us(lambda: torch.mul(x, x), graph=True, reps=2, inner=2) > 0  # (capture works again)
