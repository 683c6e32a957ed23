"""Where the time of one isolated forward (or, with ``--backward``, backward) call goes (one call on an idle
GPU, synchronized after it: the bench's "isolated" mode, how the issue's peer figures were taken), for ours
and FlashAttention-4 with the ranker mask_mod, from torch.profiler's CPU and CUDA records on one clock.

    python3 bench/ranker_fwd_isolated_breakdown.py [--calls 10] [--no-peers] [--backward] [--short]

``--short``: only the issue's short, candidate-heavy shapes (``SHORT_CASES``).  ``host_us``: the call's
Python time without the profiler (perf_counter around the call, median of ``--calls`` isolated calls).

Per shape (the uncapped :data:`cute_kernels.kernels.ranker_fwd.BENCH_CASES`) and implementation, medians over
``--calls`` profiled calls (us): ``host_call`` (the Python call, start to return), ``to_launch`` (call start
to the first CPU event whose name holds "aunch": the kernel-launch API call, where the profiler sees it),
``launch_to_kernel`` (that API call to the first kernel's start on the GPU), ``kernels`` (first kernel start
to last kernel end), ``kernel_busy`` (sum of kernel durations), ``event_us`` (the same calls timed as the
bench's isolated mode: CUDA events, after the profiled calls) and ``graph_us`` (ours in a CUDA graph).
The profiler inflates the host times (~3-4x here); the kernel times are the point.  One JSON line per row.
"""

import argparse
import json
import statistics
import sys
import time

import torch
from probe_timing import ranker_inputs
from torch.profiler import ProfilerActivity, profile, record_function

from cute_kernels import ranker_attention
from cute_kernels.kernels import ranker_bwd as bwd
from cute_kernels.kernels import ranker_fwd as fwd
from cute_kernels.runtime.timing import cuda_time_us


def breakdown(fn, calls: int) -> dict:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with record_function(f"call{i}"):
                fn()
            torch.cuda.synchronize()
    events = prof.events()
    def is_mark(e):
        return e.name.startswith("call") and e.name[4:].isdigit()

    marks = sorted((e for e in events if is_mark(e) and e.device_type == torch.autograd.DeviceType.CPU),
                   key=lambda e: e.time_range.start)
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not is_mark(e)]
    launches = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and "aunch" in e.name]
    rows = []
    for j, m in enumerate(marks):
        t0 = m.time_range.start
        t_next = marks[j + 1].time_range.start if j + 1 < len(marks) else float("inf")
        ks = [e for e in kernels if t0 <= e.time_range.start < t_next]
        ls = [e for e in launches if t0 <= e.time_range.start < t_next]
        if not ks:
            continue
        row = dict(host_call=m.time_range.end - t0,
                   kernels=max(e.time_range.end for e in ks) - min(e.time_range.start for e in ks),
                   kernel_busy=sum(e.time_range.end - e.time_range.start for e in ks), n_kernels=len(ks))
        if ls:
            first_launch = min(e.time_range.start for e in ls)
            row["to_launch"] = first_launch - t0
            row["launch_to_kernel"] = min(e.time_range.start for e in ks) - first_launch
        rows.append(row)
    keys = [key for key in rows[0] if all(key in r for r in rows)]
    out = {key: round(statistics.median(r[key] for r in rows), 1) for key in keys}
    out["launch_apis"] = sorted({e.name for e in launches})[:4]
    out["kernel_names"] = sorted({e.name[:60] for e in kernels})[:8]
    return out


def host_us(fn, calls: int) -> float:
    """Median Python time of one call on an idle GPU (perf_counter, no profiler)."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return round(statistics.median(times), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--calls", type=int, default=10, help="profiled calls per row (>= 1)")
    ap.add_argument("--no-peers", action="store_true", help="ours only")
    ap.add_argument("--backward", action="store_true", help="the backward (ranker_bwd's cases and peers)")
    ap.add_argument("--short", action="store_true", help="only the short, candidate-heavy shapes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ranker_fwd_isolated_breakdown: needs a CUDA GPU")
    mod = bwd if args.backward else fwd
    for nb, hist, cand, hq, hkv, d, cap in (mod.SHORT_CASES if args.short else mod.BENCH_CASES):
        if cap is not None:
            continue
        _, q, k, v, bounds, do = ranker_inputs((nb, hist, cand, hq, hkv, d, cap), seed=0, dout=args.backward)
        if args.backward:
            o, lse = ranker_attention(q, k, v, bounds, return_lse=True)
            impls = [("cute_kernels", lambda: bwd.ranker_attention_backward(q, k, v, o, lse, do, bounds))]
        else:
            impls = [("cute_kernels", lambda: ranker_attention(q, k, v, bounds))]
        if not args.no_peers:
            try:
                if args.backward:
                    from ranker_bwd_peers import fa4_mask_mod

                    impls.append(("fa4_mask_mod", fa4_mask_mod(q, k, v, bounds, do)))
                else:
                    from ranker_fwd_peers import fa4_mask_mod

                    impls.append(("fa4_mask_mod", fa4_mask_mod(q, k, v, bounds)))
            except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
                print(f"fa4_mask_mod unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        shape = f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d}"
        for name, fn in impls:
            rec = dict(shape=shape, impl=name, **breakdown(fn, args.calls))
            rec["host_us"] = host_us(fn, args.calls)
            rec["event_us"] = round(cuda_time_us(fn, graph=False, inner=1), 1)
            rec["graph_us"] = round(cuda_time_us(fn, graph=True), 1) if name == "cute_kernels" else None
            print(json.dumps(rec), flush=True)
        q = k = v = do = None  # (frees this shape's inputs; the lambdas above are done with them)


if __name__ == "__main__":
    main()
