"""Probe: does the one-GPU Q/K norm gain at large N when its CTAs are split by part (q-only CTAs, then
k-only CTAs, in one launch) instead of every CTA holding one token's q row and its k row?

The shipped per-token kernel reads a q row and a k row in every CTA, so DRAM serves two address streams
at once; torch's two in-place kernels (q, then k) serve one at a time and measure ~1.4% faster at
N=16384.  Here CTAs ``0 .. ceil(N/rows_q)`` take q rows (``rows_q`` per CTA), the rest k rows (``rows_k``
per CTA, as many threads as a q CTA), or the k CTAs first (``split_k_first``).  Same per-row thread tiling
as the shipped kernel, so the same bits (checked).  Times: CUDA graph, shuffled rounds, next to the
shipped kernel and torch's copy / in-place scalar mul_ on the same bytes.

    python3 bench/qknorm_split_probe.py [--rounds=N] [--n=8192,16384]

Run recorded: bench/results/logs/2026-11-30_s18_qknorm_split_probe.log (no robust gain; not shipped).
"""
import sys
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from cute_kernels.kernels import qknorm as mod
from qknorm_sweep import PROBE_TUNING, compile_probe_kernel, run_probe


def _part_normalizer(dtype, cfg, rows: int, threads: int):
    """A QKNormKernel whose device methods see ``rows`` rows of one part per CTA of ``threads`` threads."""
    obj = object.__new__(mod.QKNormKernel)
    obj.dtype, obj.vec, obj.num_warps = dtype, cfg.q.vec, threads // 32
    obj.config = SimpleNamespace(rows=rows, tuning=cfg.tuning)
    return obj


class SplitPartsKernel:
    def __init__(self, dtype, cfg, k_first: bool):
        self.cfg, self.k_first = cfg, k_first
        self.threads = max(cfg.q.threads, cfg.k.threads, 32)
        self.rows_q, self.rows_k = self.threads // cfg.q.threads, self.threads // cfg.k.threads
        assert self.rows_q * cfg.q.threads == self.threads == self.rows_k * cfg.k.threads
        self.qn = _part_normalizer(dtype, cfg, self.rows_q, self.threads)
        self.kn = _part_normalizer(dtype, cfg, self.rows_k, self.threads)
        # each CTA holds one part: its threads start at 0 and sync on barrier 1 (mod.NamedBarrier.Q_ROWS)
        self.q_role = mod.RowRole(0, cfg.q, cfg.q_dim, 0, int(mod.NamedBarrier.Q_ROWS))
        self.k_role = mod.RowRole(1, cfg.k, cfg.k_dim, 0, int(mod.NamedBarrier.Q_ROWS))

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor, eps: Float32, stream):
        n = mQ.shape[0]
        nq = (n + self.rows_q - 1) // self.rows_q
        nk = (n + self.rows_k - 1) // self.rows_k
        first = nk if cutlass.const_expr(self.k_first) else nq
        self.kernel(mQ, mK, mWq, mWk, eps, first).launch(grid=[nq + nk, 1, 1], block=[self.threads, 1, 1],
                                                         stream=stream)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor, eps: Float32,
               first: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout(self.threads // 32), byte_alignment=16)
        n = mQ.shape[0]
        if cutlass.const_expr(self.k_first):
            if bidx < first:
                self.kn.normalize(mK, mWk, self.k_role, tidx, bidx, n, eps, sRed)
            else:
                self.qn.normalize(mQ, mWq, self.q_role, tidx, bidx - first, n, eps, sRed)
        else:
            if bidx < first:
                self.qn.normalize(mQ, mWq, self.q_role, tidx, bidx, n, eps, sRed)
            else:
                self.kn.normalize(mK, mWk, self.k_role, tidx, bidx - first, n, eps, sRed)


def compile_split(dtype, qd, kd, k_first: bool):
    return compile_probe_kernel("qknorm_split_probe", lambda dt, cfg: SplitPartsKernel(dt, cfg, k_first),
                                dtype, qd, kd, k_first)


def variants(dtype, qd, kd):
    return {"per_token": mod._compile(dtype, qd, kd, PROBE_TUNING), "split_q_first": compile_split(dtype, qd, kd, False),
            "split_k_first": compile_split(dtype, qd, kd, True)}


PROBE_ARGS = dict(ns=(8192, 16384))


if __name__ == "__main__":
    run_probe(sys.argv[1:], __doc__, variants, **PROBE_ARGS)
