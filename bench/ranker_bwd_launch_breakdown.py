"""Where the backward's time goes, per GPU kernel (torch.profiler, CUDA activity): the preprocess, the
mainloop, the postprocess and torch's own launches (the zeroed GQA float32 accumulators, output
allocations), at the bench shapes, MHA vs GQA side by side.  Evidence for the GQA gap (session 10: GQA
16/4 513 useful TFLOP/s vs MHA 542 in the same run, while FlashAttention-4's two are within 1%).

    python3 bench/ranker_bwd_launch_breakdown.py [--iters 20] [--only KEY ...] [--dlse]   (on the GPU; bench/ on sys.path)

``--dlse``: each shape also with a gradient of the LSE (``dlse=``, what a loss on the forward's lse
hands the backward; the preprocess's variant that folds it into dPsum), key suffix ``,dlse``.

``--only`` (repeatable) keeps the bench shapes whose key (``B=4,h=4096,c=512,H=16/4,D=128,cap=None``)
contains the given substring.  Under Nsight Compute, the mainloop's counters at the headline (MHA)
shape, then the same at the GQA one (``--only H=16/4``); the first three calls are the warm-up:

    ncu --kernel-name regex:RankerAttentionBwd --launch-skip 3 --launch-count 1 --set full -o bwd_mha \
        python3 bench/ranker_bwd_launch_breakdown.py --iters 1 --only h=4096,c=512,H=16/16,D=128,cap=None

Prints one JSON line per shape: {kernel name (shortened): mean microseconds per backward call}.
"""
import argparse
import json
from collections import defaultdict

import torch
from probe_timing import case_key, ranker_inputs

from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels.ranker_fwd import ranker_attention


def breakdown(case, iters, with_dlse=False):
    cap = case[-1]
    key, q, k, v, bounds, do = ranker_inputs(case, seed=0, dout=True)
    o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    dlse = torch.randn_like(lse) if with_dlse else None
    key = key + (",dlse" if with_dlse else "")
    for _ in range(3):  # compile and warm up outside the profile
        rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, dlse=dlse)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            rb.ranker_attention_backward(q, k, v, o, lse, do, bounds, cap=cap, dlse=dlse)
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name[:60]] += evt.time_range.elapsed_us() / iters
    total = sum(per_kernel.values())
    return {"shape": key, "total_us": round(total, 1),
            **{name: round(t, 1) for name, t in sorted(per_kernel.items(), key=lambda kv: -kv[1])}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20, help="profiled backward calls per shape (>= 1)")
    p.add_argument("--only", action="append", default=[], help="keep the shapes whose key contains this")
    p.add_argument("--dlse", action="store_true", help="each shape also with a gradient of the LSE")
    args = p.parse_args()
    if args.iters < 1:
        p.error(f"--iters {args.iters}: must be at least 1")
    keep = args.only
    cases = [c for c in rb.BENCH_CASES if not keep or any(k in case_key(c) for k in keep)]
    if not cases:
        p.error(f"--only {keep}: no bench shape matches; the keys are "
                + ", ".join(case_key(c) for c in rb.BENCH_CASES))
    for case in cases:
        print(json.dumps(breakdown(case, args.iters)), flush=True)
        if args.dlse:
            print(json.dumps(breakdown(case, args.iters, with_dlse=True)), flush=True)


if __name__ == "__main__":
    main()
