"""How close the backward's preprocess and postprocess run to the copy rate, and what their row passes
per CTA change (issue 4; the two memory-bound kernels around the mainloop: ~150 us of the headline's
~2.7 ms, ~170 of B=16 1K+256's ~0.9 ms).

    python3 bench/ranker_bwd_prepost_probe.py [--only KEY ...] [--post-passes 2,8,16]   (on the GPU; bench/ on sys.path)

Per bench shape, CUDA-graph medians (``cuda_time_us``) of: the preprocess that zeroes the float32 dQ
accumulator (``pre_zero``: dPsum, LSE2 and the zeroed accumulator; what a call with ``dq_zero_in_mainloop``
off, or over its sequence limit, runs), the one that zeroes only the q blocks' flags (``pre``: the shipped
default since session 48, and the deterministic mode's), torch's ``zero_()`` of the accumulator (a memset),
the postprocess a call with them launches (MHA: dQ out of the accumulator, every flag set here, plus the
candidates' self terms), the flagless postprocess compiled with other row passes per CTA
(``ranker_bwd_postprocess.PASSES``: more 16-byte loads in flight per thread, fewer CTAs), and torch's
``dq_accum.to(bfloat16)`` (the same read + write, for scale).  Each figure also as GB/s of the bytes the
kernel must move.  One JSON line per shape.
"""
import argparse
import json
import math

import cutlass.cute as cute
import torch
from probe_timing import case_key, ranker_inputs

from cute_kernels.kernels import ranker_bwd as rb
from cute_kernels.kernels import ranker_bwd_postprocess as post_mod
from cute_kernels.kernels.ranker_bwd_buffers import padded_rows
from cute_kernels.kernels.ranker_fwd import ranker_attention
from cute_kernels.runtime.fake import cute_dtype
from cute_kernels.runtime.timing import cuda_time_us


def compile_post_passes(passes: int, dtype, d: int, tile_m: int, cap_method: str):
    """The MHA postprocess with ``passes`` row passes per CTA, compiled in memory (the module's PASSES is
    read at construction and trace time)."""
    saved = post_mod.PASSES
    post_mod.PASSES = passes
    try:
        kern = post_mod.RankerBwdPostprocess(cute_dtype(dtype), d, tile_m, 1, cap_method, False, False, False)
        return cute.compile(kern, *post_mod.fake_args(dtype, d, False, False, False), options="--enable-tvm-ffi")
    finally:
        post_mod.PASSES = saved


def probe(case, post_passes):
    cap = case[-1]
    key, q, k, v, bounds, do = ranker_inputs(case, seed=0, dout=True)
    o, lse = ranker_attention(q, k, v, bounds, cap=cap, return_lse=True)
    nb, s, hq, d = q.shape
    hkv = k.shape[2]
    cfg = rb.resolve_config(None, d, cap is not None)
    rows = padded_rows(s, nb, cfg.tile_m, False)
    row_shape = (nb, hq, rows)
    lse2 = torch.empty(row_shape, dtype=torch.float32, device=q.device)
    dpsum = torch.empty_like(lse2)
    dq_accum = torch.empty(row_shape + (d,), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    cap_method = "none" if cap is None else "tanh"
    keys = rb.call_launch_args(q.dtype, cfg, hq // hkv, nb, hkv, s, cap, cap_method, False, rb.sm_count(q.device))
    scale = 1.0 / math.sqrt(d)
    scale_log2, capf = rb.exp2_scale(scale, cap), float(cap) if cap is not None else 1.0
    flagged = keys["pre"][4]
    pre = rb._fn("pre", *keys["pre"])
    pre_zero = rb._fn("pre", *keys["pre"][:4], False, False)
    flags = torch.ones((nb, hq, rows // cfg.tile_m), dtype=torch.int32, device=q.device) if flagged else None
    post_args = (q, k, v, do, lse2, dpsum, dq_accum, flags, dq, dk, dv, None, None, bounds, None, scale_log2,
                 scale, capf, nb, s)
    plain_args = post_args[:7] + (None,) + post_args[8:]
    post = rb._fn("post", *keys["post"])
    pre_zero(o, do, lse, None, lse2, dpsum, dq_accum, None, None, nb, s)  # LSE2 and dPsum for the postprocess
    dq_accum.normal_()  # any accumulator contents: the row-pass variants must give the shipped postprocess's bits
    post(*post_args)
    ref_dq = dq.clone()
    acc_bytes, io_bytes = dq_accum.numel() * 4, q.numel() * 2
    pre_flags = torch.empty_like(flags) if flagged else None  # (the preprocess zeroes these, not `flags`)
    fns = {
        "pre_zero": (lambda: pre_zero(o, do, lse, None, lse2, dpsum, dq_accum, None, None, nb, s),
                     2 * io_bytes + acc_bytes),
        "pre": (lambda: pre(o, do, lse, None, lse2, dpsum, dq_accum, pre_flags, None, nb, s),
                2 * io_bytes + (0 if flagged else acc_bytes)),
        "memset": (lambda: dq_accum.zero_(), acc_bytes),
        "post": (lambda: post(*post_args), acc_bytes + io_bytes),
        "to_bf16": (lambda: dq_accum.to(torch.bfloat16), acc_bytes + acc_bytes // 2),
    }
    out = {"shape": key}
    for p in post_passes:
        fn = compile_post_passes(p, q.dtype, d, cfg.tile_m, cap_method)
        dq.fill_(float("nan"))
        fn(*plain_args)
        torch.cuda.synchronize()
        same = bool(torch.equal(dq, ref_dq))
        fns[f"post_passes{p}"] = (lambda fn=fn: fn(*plain_args), acc_bytes + io_bytes)
        out[f"post_passes{p}_same_bits"] = same
    # the postprocesses first, while the accumulator holds the random contents (memset and pre zero it)
    order = [n for n in fns if not n.startswith("pre") and n != "memset"] + ["memset", "pre", "pre_zero"]
    for rnd in range(3):
        for name in (order if rnd % 2 == 0 else order[::-1][3:] + order[-3:]):
            fn, nbytes = fns[name]
            t = cuda_time_us(fn, graph=True, reps=20, inner=10)
            out.setdefault(name, []).append(round(t, 1))
    for name, (_, nbytes) in fns.items():
        best = min(out[name])
        out[name + "_GBps"] = round(nbytes / best / 1e3, 0)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", default=[], help="keep the shapes whose key contains this")
    p.add_argument("--post-passes", default="2,8,16", help="postprocess row passes per CTA to compile and time")
    args = p.parse_args()
    passes = [int(x) for x in args.post_passes.split(",") if x]
    cases = [c for c in rb.BENCH_CASES if c[4] == c[3] and (not args.only or any(k in case_key(c) for k in args.only))]
    for case in cases:
        print(json.dumps(probe(case, passes)), flush=True)


if __name__ == "__main__":
    main()
