"""The TMA hc_mix op's epilogue on two threads per row (shipped, ``HcMixKernel.epilogue_pair``) against one
thread per row (``HcMixKernel.epilogue``, the walk method's, shipped in the TMA reduction kernel before
session 15): us per call in a CUDA graph, medians of shuffled rounds with an A/A pair, the copy rate
first; pre/post checked bit-equal and comb within 1e-6 between the two.

    python3 bench/hc_mix_epilogue_probe.py [--rounds=N]
"""
import json
import math
import random
import statistics
import sys

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.kernels.hc_mix import SP_COLS, _pieces, fake_launch_args
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import fake_tensor
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us

K = 20480


class OneThreadPerRow(tma.HcMixTmaKernel):
    """The reduction kernel with the one-thread-per-row epilogue."""

    @cute.kernel
    def reduce_kernel(self, mPart: cute.Tensor, m: Int32, k: Int32, mScale: cute.Tensor, mBase: cute.Tensor,
                      mPre: cute.Tensor, mPost: cute.Tensor, mComb: cute.Tensor, mMix: cute.Tensor,
                      sinkhorn_iters: Int32, rms_eps: Float32, hc_eps: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        rows = self.config.reduce_rows
        sA = smem.allocate_tensor(Float32, cute.make_layout((rows, SP_COLS), stride=(SP_COLS, 1)), byte_alignment=16)
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        row0 = bidx * rows
        self.reduce_item(mPart, sA, row0, tidx, cutlass.min(m - row0, rows) * SP_COLS)
        cute.arch.sync_threads()
        if tidx < rows and row0 + tidx < m:
            self.epilogue(sA, tidx, row0 + tidx, k, mScale, mBase, mPre, mPost, mComb, mMix, sinkhorn_iters,
                          rms_eps, hc_eps)


def one_thread_op(cfg):
    def build():
        args = fake_launch_args(pieces=True)
        part = fake_tensor(torch.float32, (cute.sym_int(), SP_COLS), stride=(SP_COLS, 1))
        return OneThreadPerRow(cfg), args[:-1] + (part, args[-1])

    fn = compile_cached("hc_probe_one_thread_epilogue", cfg, build)

    def call(x, w, s, b):
        m = x.shape[0]
        pre, post, comb = (torch.empty(m, 4, device=x.device), torch.empty(m, 4, device=x.device),
                           torch.empty(m, 4, 4, device=x.device))
        scratch = torch.empty(tma.workspace_rows(m, cfg) * SP_COLS + 28, device=x.device)
        fn(x, _pieces(w), s, b, pre, post, comb.view(m, 16), scratch[:SP_COLS].view(1, SP_COLS), 20, 1e-6, 1e-6,
           scratch[28:].view(-1, SP_COLS))
        return pre, post, comb
    return call


def main(argv):
    rounds = 7
    for a in argv:
        if not a.startswith("--rounds=") or not a[9:].isdigit() or int(a[9:]) < 1:
            raise SystemExit(f"unknown argument {a!r}\n{__doc__}")
        rounds = int(a[9:])
    bw = copy_bandwidth_gbps()
    print(json.dumps({"copy_gbps": round(bw, 1), "rounds": rounds}), flush=True)
    calls = {}
    for m in (1, 128, 512, 2048, 4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, K, device="cuda", generator=g).bfloat16()
        w = torch.randn(24, K, device="cuda", generator=g) / math.sqrt(K)
        s = torch.rand(3, device="cuda", generator=g) + 0.5
        b = torch.randn(24, device="cuda", generator=g)
        one = one_thread_op(tma.config_for(m))
        a, c = tma.hc_mix_sinkhorn_tma(x, w, s, b), one(x, w, s, b)
        print(json.dumps({"m": m, "pre_post_bitwise": torch.equal(a[0], c[0]) and torch.equal(a[1], c[1]),
                          "comb_maxdiff": (a[2] - c[2]).abs().max().item()}), flush=True)
        calls[f"pair_{m}"] = lambda x=x, w=w, s=s, b=b: tma.hc_mix_sinkhorn_tma(x, w, s, b)
        calls[f"one_{m}"] = lambda x=x, w=w, s=s, b=b, one=one: one(x, w, s, b)
        calls[f"pair_again_{m}"] = calls[f"pair_{m}"]
    times = {n: [] for n in calls}
    rng = random.Random(2)
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for n in order:
            times[n].append(round(cuda_time_us(calls[n]), 2))
    for n in calls:
        print(json.dumps({"case": n, "us": statistics.median(times[n]), "all": times[n]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
