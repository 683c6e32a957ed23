"""hc_mix tma: a shorter epilogue chain against the shipped one (session 19).  The epilogue (one thread per
row) is a latency chain after the walk: the sigmoids' IEEE divisions (each with a slow-path branch),
``1 / sqrt`` and ``sq / K``, then 20 Sinkhorn iterations whose row and column sums are sequential
``((a + b) + c) + d``.  The variant uses ``rcp.approx`` for the sigmoids, ``rsqrt`` and ``sq * (1 / K)``
(``fast_math``), and pairwise sums ``(a + b) + (c + d)`` in Sinkhorn (``tree_sums``); different bits, errors
against float64 printed.  The op at M = 1, 128, 4096 (config_for), us per call in a CUDA graph of 10
calls, median of shuffled rounds, shipped timed twice (A/A).

    python3 bench/hc_mix_epilogue_fast_probe.py [--rounds=N]   (on the GPU)
"""
import json
import math
import random
import statistics
import sys

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

import cute_kernels
from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.kernels.hc_mix import HC, N_MIX, SP_COLS, _pieces, fake_launch_args
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import fake_tensor
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us


class FastEpilogue(tma.HcMixTmaKernel):
    def __init__(self, config, fast_math, tree_sums):
        super().__init__(config)
        self.fast_math, self.tree_sums = fast_math, tree_sums

    @cute.jit
    def epilogue(self, sA, rr, row, k, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters, rms_eps, hc_eps):
        if cutlass.const_expr(self.config.store_mix):
            for c in cutlass.range_constexpr(SP_COLS):
                mMix[row, c] = sA[rr, c]
        sq = sA[rr, N_MIX]
        if cutlass.const_expr(self.fast_math):
            r = cute.math.rsqrt(sq * cute.arch.rcp_approx(Float32(k)) + rms_eps)
        else:
            r = Float32(1.0) / cute.math.sqrt(sq / Float32(k) + rms_eps)
        s0, s1, s2 = mScale[0] * r, mScale[1] * r, mScale[2] * r
        for i in cutlass.range_constexpr(HC):
            z = sA[rr, i] * s0 + mBase[i]
            if cutlass.const_expr(self.fast_math):
                mPre[row, i] = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-z)) + hc_eps
            else:
                mPre[row, i] = Float32(1.0) / (Float32(1.0) + cute.math.exp(-z)) + hc_eps
        for i in cutlass.range_constexpr(HC):
            z = sA[rr, HC + i] * s1 + mBase[HC + i]
            if cutlass.const_expr(self.fast_math):
                mPost[row, i] = Float32(2.0) * cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-z))
            else:
                mPost[row, i] = Float32(2.0) / (Float32(1.0) + cute.math.exp(-z))
        rM = cute.make_rmem_tensor(cute.make_layout(HC * HC), Float32)
        for i in cutlass.range_constexpr(HC * HC):
            rM[i] = sA[rr, 2 * HC + i] * s2 + mBase[2 * HC + i]
        for i in cutlass.range_constexpr(HC):
            mx = rM[i * HC]
            for j in cutlass.range_constexpr(1, HC):
                mx = cute.arch.fmax(mx, rM[i * HC + j])
            ssum = Float32(0.0)
            for j in cutlass.range_constexpr(HC):
                e = cute.math.exp(rM[i * HC + j] - mx)
                rM[i * HC + j] = e
                ssum = ssum + e
            inv = cute.arch.rcp_approx(ssum)
            for j in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv + hc_eps
        self.normalize_cols(rM, hc_eps)
        for _ in cutlass.range(sinkhorn_iters - 1, unroll=1):
            self.normalize_rows(rM, hc_eps)
            self.normalize_cols(rM, hc_eps)
        for i in cutlass.range_constexpr(HC * HC):
            mComb[row, i] = rM[i]

    @cute.jit
    def normalize_rows(self, rM, hc_eps):
        for i in cutlass.range_constexpr(HC):
            if cutlass.const_expr(self.tree_sums):
                ssum = (rM[i * HC] + rM[i * HC + 1]) + (rM[i * HC + 2] + rM[i * HC + 3])
            else:
                ssum = ((rM[i * HC] + rM[i * HC + 1]) + rM[i * HC + 2]) + rM[i * HC + 3]
            inv = cute.arch.rcp_approx(ssum + hc_eps)
            for j in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv

    @cute.jit
    def normalize_cols(self, rM, hc_eps):
        for j in cutlass.range_constexpr(HC):
            if cutlass.const_expr(self.tree_sums):
                ssum = (rM[j] + rM[HC + j]) + (rM[2 * HC + j] + rM[3 * HC + j])
            else:
                ssum = ((rM[j] + rM[HC + j]) + rM[2 * HC + j]) + rM[3 * HC + j]
            inv = cute.arch.rcp_approx(ssum + hc_eps)
            for i in cutlass.range_constexpr(HC):
                rM[i * HC + j] = rM[i * HC + j] * inv


def compiled(cfg, fast_math, tree_sums):
    def build():
        args = fake_launch_args(pieces=True)
        part = fake_tensor(torch.float32, (cute.sym_int(), SP_COLS), stride=(SP_COLS, 1))
        return FastEpilogue(cfg, fast_math, tree_sums), args[:-1] + (part, args[-1])
    return compile_cached(f"hc_probe_epi_{int(fast_math)}{int(tree_sums)}", cfg, build)


def main(rounds):
    k = 20480
    print(json.dumps({"copy_gbps": round(copy_bandwidth_gbps(), 1), "rounds": rounds}), flush=True)
    calls = {}
    for m in (1, 128, 4096):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
        s = torch.rand(3, device="cuda", generator=g) + 0.5
        b = torch.randn(24, device="cuda", generator=g)
        cfg = tma.config_for(m)
        ref = cute_kernels.hc_mix_sinkhorn_reference(x, w, s, b)
        pieces = _pieces(w)
        ws = torch.empty(tma.workspace_rows(m, cfg), SP_COLS, device="cuda")
        for fm, ts in ((False, False), (True, False), (True, True)):
            fn = compiled(cfg, fm, ts)
            outs = (torch.empty(m, 4, device="cuda"), torch.empty(m, 4, device="cuda"), torch.empty(m, 16, device="cuda"))
            call = lambda fn=fn, outs=outs, ws=ws, x=x, pieces=pieces, s=s, b=b: fn(
                x, pieces, s, b, *outs, ws[:1], 20, 1e-6, 1e-6, ws)
            call()
            torch.cuda.synchronize()
            err = [(o.double() - r.double().reshape(o.shape)).abs().max().item() for o, r in zip(outs, ref)]
            name = {(False, False): "same_epilogue", (True, False): "fast_math", (True, True): "fast_math_tree_sums"}[(fm, ts)]
            print(json.dumps({"m": m, "variant": name, "max_abs_err_pre_post_comb": ["%.2e" % e for e in err]}), flush=True)
            calls[(m, name)] = call
        calls[(m, "shipped_op")] = lambda x=x, w=w, s=s, b=b: tma.hc_mix_sinkhorn_tma(x, w, s, b)
        calls[(m, "shipped_op_again")] = calls[(m, "shipped_op")]
    times = {}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for key in order:
            times.setdefault(key, []).append(cuda_time_us(calls[key]))
    for m in (1, 128, 4096):
        print(json.dumps({"m": m, **{n: round(statistics.median(v), 2) for (mm, n), v in times.items() if mm == m},
                          "all": {n: [round(t, 2) for t in v] for (mm, n), v in times.items() if mm == m}}), flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "-h" in args or "--help" in args:
        print(__doc__)
        sys.exit(0)
    main(next((int(a.split("=", 1)[1]) for a in args if a.startswith("--rounds=")), 9))
