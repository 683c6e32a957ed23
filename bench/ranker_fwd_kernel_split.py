"""Per-kernel GPU time of one ``ranker_attention`` call: the norm_bound k pre-pass and the attention kernel
(both launched from one compiled call), from torch.profiler's CUDA activity records.

    python3 bench/ranker_fwd_kernel_split.py [--calls 20]

For each bench shape (:data:`cute_kernels.kernels.ranker_fwd.BENCH_CASES`, no cap): whether the call takes
``norm_bound`` (by :func:`~cute_kernels.kernels.ranker_fwd.chosen_config`, the op's own rule), the mean time of each kernel over ``--calls`` calls (us), and for the pre-pass its HBM floor (one
read of k at the copy rate measured in the same run) and achieved read rate.  One JSON line per shape.
"""

import argparse
import dataclasses
import json
from collections import defaultdict

import torch
from probe_timing import ranker_inputs
from torch.profiler import ProfilerActivity, profile

from cute_kernels import ranker_attention
from cute_kernels.kernels import ranker_fwd as fwd
from cute_kernels.runtime.timing import copy_bandwidth_gbps


def kernel_times_us(fn, calls: int) -> dict[str, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time
    return {name: round(t / calls, 1) for name, t in total.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--calls", type=int, default=20, help="calls profiled per shape (>= 1)")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("ranker_fwd_kernel_split: needs a CUDA GPU (an H200)")
    copy_gbps = copy_bandwidth_gbps()
    print(json.dumps(dict(copy_gbps=round(copy_gbps))), flush=True)
    for nb, hist, cand, hq, hkv, d, cap in fwd.BENCH_CASES:
        if cap is not None:
            continue
        s = hist + cand
        _, q, k, v, bounds, _ = ranker_inputs((nb, hist, cand, hq, hkv, d, cap), seed=0)
        cfg = fwd.chosen_config(fwd.config_for_shape(torch.bfloat16, nb, s, hq, hkv, d, "none"), torch.bfloat16,
                                None, s)
        runs = [("shipped", cfg, lambda: ranker_attention(q, k, v, bounds))]
        if not cfg.norm_bound:  # what the pre-pass would cost here
            forced = dataclasses.replace(cfg, norm_bound=True)
            runs.append(("norm_bound forced", forced, lambda: fwd._ranker_impl(
                q, k, v, bounds, None, None, "tanh", None, None, config=forced)))
        k_bytes = k.numel() * k.element_size()
        for label, c, fn in runs:
            times = kernel_times_us(fn, args.calls)
            rec = dict(shape=f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d}", run=label, norm_bound=c.norm_bound,
                       kernels_us=times, k_read_floor_us=round(k_bytes / copy_gbps / 1e3, 1))  # copy rate: read + write bytes
            pre = [t for name, t in times.items() if "k_norm" in name]
            if pre:
                rec["k_norm_read_gbps"] = round(k_bytes / pre[0] / 1e3)
            print(json.dumps(rec), flush=True)
        q = k = v = None  # (frees this shape's inputs; the lambdas above are done with them)


if __name__ == "__main__":
    main()
