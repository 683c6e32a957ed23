"""GPU timing for benchmarks and ``cute-kernels bench`` (no test times anything; ``tests/gpu/test_timing_gpu.py``
tests its capture rules)."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch


# How long the benches and the tuner run a function back to back before timing it (``settle_s``): under its power
# limit an H100 / H200 clocks down within ~0.2 s of load after an idle spell, so whatever is timed first after idling
# runs faster (session 82, ``bench/results/logs/2026-12-07_s82_h100_ranker_timing_order_probe.log``)
SETTLE_S = 1.0


def rotated(items: list, start: int) -> list:
    """``items`` from index ``start`` (modulo their count) round to the one before it: round ``start`` of an
    interleaved timing loop (the ranker benches, the tuner), so that no item is always timed first; ``[]`` for
    none."""
    k = start % len(items) if items else 0
    return items[k:] + items[:k]


def cuda_time_us(fn: Callable[[], object], *, graph: bool = True, reps: int = 20, inner: int = 10, warmup: int = 3,
                 stream: Optional[torch.cuda.Stream] = None, settle_s: float = 0.0) -> float:
    """Median time of one ``fn()`` call in microseconds.

    ``graph=True`` captures ``inner`` back-to-back calls in a CUDA graph and times replays
    (kernel time without launch gaps, as decode serving sees it); ``graph=False`` times eager
    calls (host overhead included where it exceeds the GPU's time); ``graph=False, inner=1`` times one
    call at a time on an idle GPU, so all of its host time counts (how the project's peer measurements,
    ``shared/bench-peers`` outside this repository, timed the peer figures quoted in the issues).  Each of
    ``reps`` samples is timed with CUDA events and synchronized.

    ``settle_s``: run back to back for this many seconds before sampling, so that the board is at the clock it
    holds under sustained load (under its power limit an H100 / H200 clocks down within ~0.2 s of load after an
    idle spell: the ranker forward's short shapes ran ~13% faster in the first 50 ms than sustained,
    ``bench/ranker_timing_order_probe.py``); :data:`SETTLE_S` is what the benches and the tuner use.

    ``stream`` (graph only; it must be the current stream, else ``ValueError``): capture on it, with no warm-up
    call on a side stream first (without it: one warm-up call on a side stream, then the capture on a stream torch
    makes for it). A ``torch.autograd.grad`` whose forward ran on the legacy
    default stream cannot be captured (its backward runs on the forward's stream: cudaErrorStreamCaptureImplicit);
    one whose forward ran on ``stream`` can (session 70). A failed capture raises with the caller's current stream
    restored (``torch.cuda.graph`` leaves its capture stream current when ``capture_end`` raises). It also leaves
    torch's caching allocator with a capture it thinks is still under way (``empty_cache`` then skips the default
    pools): after a failure, time in a fresh process where memory matters.
    """
    if stream is not None and stream != torch.cuda.current_stream():
        raise ValueError(f"stream must be the current stream ({torch.cuda.current_stream()}), got {stream}")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        caller_stream = torch.cuda.current_stream()
        if stream is None:
            s = torch.cuda.Stream()
            s.wait_stream(caller_stream)
            with torch.cuda.stream(s):
                fn()
            caller_stream.wait_stream(s)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=stream):
                for _ in range(inner):
                    fn()
        except BaseException:
            torch.cuda.set_stream(caller_stream)
            raise
        run = g.replay
    else:
        def run():
            for _ in range(inner):
                fn()
    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle_s:
        run()
        torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(samples)


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy rate (bytes read + written per second / 1e9)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = cuda_time_us(lambda: dst.copy_(src), graph=False, reps=10, inner=3)
    return nbytes / (t * 1e-6) / 1e9
