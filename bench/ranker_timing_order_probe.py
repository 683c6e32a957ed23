"""Does the bench's order favour whichever impl it times first?  The forward's short shapes, ours vs FA4 + mask_mod.

Until session 82 ``cute_kernels.kernels.ranker_bench.run`` timed the impls in a fixed order each round, ours
first, without settling; the board clocks down under load (700 W), so an impl timed right after an idle spell may
run faster than one timed after other impls (since then the bench settles each timing and rotates the order).  Three measurements per shape (CUDA graphs of 10 calls, us per call):

* ``trace``: after ``--idle`` seconds idle, back-to-back replays for ``--trace`` seconds; the median time in
  windows since the start (the board's transient from idle to sustained load);
* ``order``: the bench's timer (:func:`cute_kernels.runtime.timing.cuda_time_us`, no settling) after an idle
  spell, ours then FA4 and FA4 then ours;
* ``settled``: the same with ``settle_s`` of replays before sampling, both orders.

    python3 bench/ranker_timing_order_probe.py [--idle 3] [--trace 3] [--settle 1.0]

Prints one JSON line per measurement.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import torch  # noqa: E402

from cute_kernels import ranker_attention  # noqa: E402
from cute_kernels.kernels import ranker_bench  # noqa: E402
from cute_kernels.runtime.timing import cuda_time_us  # noqa: E402

WINDOWS_S = [(0.0, 0.05), (0.05, 0.2), (0.2, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 5.0)]


def capture(fn, inner=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def trace(g, seconds, inner=10):
    out, t0 = [], time.perf_counter()
    while (t := time.perf_counter() - t0) < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append((t, a.elapsed_time(b) * 1e3 / inner))
    return {f"{lo:g}-{hi:g}s": round(statistics.median(x for t, x in out if lo <= t < hi), 1)
            for lo, hi in WINDOWS_S if any(lo <= t < hi for t, _ in out)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--trace", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=1.0)
    args = ap.parse_args()
    peers = ranker_bench.load_peers("ranker_fwd_peers")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for case in ranker_bench.SHORT_CASES:
            nb, hist, cand, hq, hkv, d, cap = case
            gen = torch.Generator(device="cuda").manual_seed(0)
            s = hist + cand
            q, k, v = (torch.randn(nb, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for h in (hq, hkv, hkv))
            bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
            impls = {"cute_kernels": lambda: ranker_attention(q, k, v, bounds, cap=cap),
                     "fa4_mask_mod": peers.PEERS["fa4_mask_mod"](q, k, v, bounds, cap)}
            shape = f"B={nb},hist={hist},cand={cand},H={hq}"
            graphs = {name: capture(fn) for name, fn in impls.items()}
            for name, g in graphs.items():
                time.sleep(args.idle)
                print(json.dumps(dict(probe="trace", shape=shape, impl=name, us=trace(g, args.trace))), flush=True)
            for settle in (0.0, args.settle):
                for order in (["cute_kernels", "fa4_mask_mod"], ["fa4_mask_mod", "cute_kernels"]):
                    for rep in range(2):
                        time.sleep(args.idle)
                        res = {name: round(cuda_time_us(impls[name], graph=True, stream=stream,
                                                        settle_s=settle), 1) for name in order}
                        print(json.dumps(dict(probe="settled" if settle else "order", shape=shape, settle_s=settle,
                                              order=order, rep=rep, us=res,
                                              ratio=round(res["fa4_mask_mod"] / res["cute_kernels"], 3))),
                              flush=True)


if __name__ == "__main__":
    main()
