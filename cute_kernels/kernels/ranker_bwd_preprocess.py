"""Ranker attention backward, step 1 of 3 (issue 4): per-row statistics for the mainloop.

For every query row and head, over the padded per-row layout of :mod:`.ranker_bwd_buffers` (whole
``tile_m`` q blocks per sequence, :func:`.ranker_bwd_buffers.padded_offset` in the packed form):

* ``dPsum = rowsum(dO * O)`` in float32 (FlashAttention-2/3's ``D``), 0 on padding rows; with the
  gradient of the LSE (``dLSE``, when a loss uses the forward's ``lse``) ``dPsum = rowsum(dO * O) - dLSE``
  on rows with a finite LSE: ``dLSE_i * P_ij`` is the LSE's share of ``dS_ij``, so
  ``dS = P * (dP - dPsum)`` carries both (rows with no valid key have ``P = 0``: dLSE ignored there);
* ``LSE2 = LSE * log2(e)``, the form the mainloop's ``exp2(s * scale_log2 - LSE2)`` wants, and
  ``+inf`` where the forward's LSE is ``-inf`` (rows with no valid key) and on padding rows, so
  that ``P`` is exactly 0 there;
* the float32 dQ accumulator row zeroed (the mainloop TMA-reduce-adds into it), or, when the mainloop
  keeps an int32 flag per (q block, query head) (``dq_flagged``: its deterministic mode, whose first KV
  block in order stores its dQ tile, or ``RankerBwdConfig.dq_zero_in_mainloop``, where its KV blocks zero
  the tiles themselves), that flag set to 0 instead and the accumulator left alone (the postprocess reads
  zeros where a q block's flag stayed 0: no KV block wrote the tile).

One CTA of 128 threads per (q block, query head, batch row); ``head_dim / 8`` consecutive lanes
share a row, each with one 16-byte load of O and of dO, reduced by warp shuffles.  Memory-bound.
STATUS: GPU-tested on the H200 alone and as part of the backward (tests/gpu/test_ranker_bwd_gpu.py).
"""

from __future__ import annotations

import math
from typing import Optional

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from ..runtime.cache import compile_cached
from ..runtime.fake import cute_dtype, fake_stream
from . import sm90_helpers as sm90
from .ranker_bwd_buffers import BwdFakes, dq_flag_coord, sequence_offsets

NAME = "ranker_bwd_preprocess"
LOG2_E = math.log2(math.e)
NUM_THREADS = 128


class RankerBwdPreprocess:
    """dPsum, LSE2 and the zeroed dQ accumulator (or, ``dq_flagged``, the q blocks' zeroed flags) for one (dtype,
    head dim, q block, varlen, dq_flagged, with dLSE)."""

    def __init__(self, dtype, head_dim: int, tile_m: int, varlen: bool, dq_flagged: bool = False,
                 with_dlse: bool = False):
        if head_dim % 64:
            raise ValueError(f"head_dim={head_dim}: must be a multiple of 64")
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.varlen = varlen
        self.with_dlse = with_dlse
        self.dq_flagged = dq_flagged
        self.vec = 128 // dtype.width  # elements per 16-byte load
        self.threads_per_row = head_dim // self.vec
        self.rows_per_pass = NUM_THREADS // self.threads_per_row
        if tile_m % self.rows_per_pass:
            raise ValueError(f"tile_m={tile_m} must be a multiple of {self.rows_per_pass}")

    @cute.jit
    def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: Optional[cute.Tensor],
                 mLSE2: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdQflag: Optional[cute.Tensor],
                 mCuSeqlens: Optional[cute.Tensor], num_batch: Int32, max_seqlen: Int32, stream):
        # O, dO (B, S, H, D) -> (S, D, H, B) / (T, H, D) -> (T, D, H);
        # LSE, dLSE (B, H, S) -> (S, H, B) / (H, T) -> (T, H)
        # padded rows (B, H, S_pad) -> (S_pad, H, B) / (H, T_pad) -> (T_pad, H); dQ accumulator likewise + D
        if const_expr(self.varlen):
            mO, mdO = [sm90.select_modes(t, [0, 2, 1]) for t in (mO, mdO)]
            mLSE, mLSE2, mdPsum = [sm90.select_modes(t, [1, 0]) for t in (mLSE, mLSE2, mdPsum)]
            if const_expr(self.with_dlse):
                mdLSE = sm90.select_modes(mdLSE, [1, 0])
            mdQaccum = sm90.select_modes(mdQaccum, [1, 2, 0])
        else:
            mO, mdO = [sm90.select_modes(t, [1, 3, 2, 0]) for t in (mO, mdO)]
            mLSE, mLSE2, mdPsum = [sm90.select_modes(t, [2, 1, 0]) for t in (mLSE, mLSE2, mdPsum)]
            if const_expr(self.with_dlse):
                mdLSE = sm90.select_modes(mdLSE, [2, 1, 0])
            mdQaccum = sm90.select_modes(mdQaccum, [2, 3, 1, 0])
        grid = (cute.ceil_div(max_seqlen, self.tile_m), cute.size(mO.shape[2]), num_batch)
        self.kernel(mO, mdO, mLSE, mdLSE, mLSE2, mdPsum, mdQaccum, mdQflag, mCuSeqlens, Int32(mO.shape[0])).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: Optional[cute.Tensor],
               mLSE2: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdQflag: Optional[cute.Tensor],
               mCuSeqlens: Optional[cute.Tensor], seqlen_static: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        offset, seqlen, pad = sequence_offsets(mCuSeqlens, batch, seqlen_static, self.tile_m, self.varlen)
        if const_expr(self.varlen):
            mO_cur = cute.domain_offset((offset, 0), mO[None, None, head])
            mdO_cur = cute.domain_offset((offset, 0), mdO[None, None, head])
            mLSE_cur = cute.domain_offset((offset,), mLSE[None, head])
            mdLSE_cur = cute.domain_offset((offset,), mdLSE[None, head]) if const_expr(self.with_dlse) else None
            mLSE2_cur = cute.domain_offset((pad,), mLSE2[None, head])
            mdPsum_cur = cute.domain_offset((pad,), mdPsum[None, head])
            mdQ_cur = cute.domain_offset((pad, 0), mdQaccum[None, None, head])
        else:
            mO_cur = mO[None, None, head, batch]
            mdO_cur = mdO[None, None, head, batch]
            mLSE_cur = mLSE[None, head, batch]
            mdLSE_cur = mdLSE[None, head, batch] if const_expr(self.with_dlse) else None
            mLSE2_cur = mLSE2[None, head, batch]
            mdPsum_cur = mdPsum[None, head, batch]
            mdQ_cur = mdQaccum[None, None, head, batch]

        # packed form: a q block past this sequence's end would write into the next one's padded rows
        if m_block * self.tile_m < seqlen:
            self.rows(mO_cur, mdO_cur, mLSE_cur, mdLSE_cur, mLSE2_cur, mdPsum_cur, mdQ_cur, m_block, seqlen, tidx)
            if const_expr(self.dq_flagged):
                if tidx == 0:
                    mdQflag[dq_flag_coord(batch, head, pad // self.tile_m + m_block, self.varlen)] = Int32(0)

    @cute.jit
    def rows(self, mO_cur, mdO_cur, mLSE_cur, mdLSE_cur, mLSE2_cur, mdPsum_cur, mdQ_cur, m_block, seqlen, tidx):
        """The tile_m padded rows of this q block: dPsum (less dLSE), LSE2, the zeroed dQ accumulator (not with
        ``dq_flagged``).  Every pass's O and dO loads are issued first, then the sums and stores:
        otherwise a pass's loads wait behind the previous pass's stores, which the compiler cannot move them
        past (it cannot prove the tensors disjoint)."""
        ld_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        chunk = tidx % self.threads_per_row
        rZero = cute.make_rmem_tensor((4,), Float32)
        rZero.fill(0.0)
        passes = self.tile_m // self.rows_per_pass
        rLSE = cute.make_rmem_tensor((passes,), Float32)  # the forward's LSE of each pass's row (lane 0)
        rdLSE = cute.make_rmem_tensor((passes,), Float32)  # and its gradient (with_dlse)
        loaded = []
        for p in cutlass.range_constexpr(passes):
            row = m_block * self.tile_m + p * self.rows_per_pass + tidx // self.threads_per_row
            rO = cute.make_rmem_tensor((self.vec,), self.dtype)
            rdO = cute.make_rmem_tensor((self.vec,), self.dtype)
            rO.fill(0.0)
            rdO.fill(0.0)
            rLSE[p] = -Float32.inf
            rdLSE[p] = Float32(0.0)
            if row < seqlen:
                cute.copy(ld_atom, cute.local_tile(mO_cur[row, None], (self.vec,), (chunk,)), rO)
                cute.copy(ld_atom, cute.local_tile(mdO_cur[row, None], (self.vec,), (chunk,)), rdO)
                if chunk == 0:
                    rLSE[p] = Float32(mLSE_cur[row])
                    if const_expr(self.with_dlse):
                        rdLSE[p] = Float32(mdLSE_cur[row])
            loaded.append((row, rO, rdO))
        for p in cutlass.range_constexpr(passes):
            row, rO, rdO = loaded[p]
            dot = (rO.load().to(Float32) * rdO.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            dot = cute.arch.warp_reduction_sum(dot, threads_in_group=self.threads_per_row)
            if chunk == 0:
                lse2 = Float32.inf  # also on padding rows (rLSE -inf there)
                if rLSE[p] != -Float32.inf:
                    lse2 = rLSE[p] * LOG2_E
                    if const_expr(self.with_dlse):
                        dot = dot - rdLSE[p]
                mLSE2_cur[row] = lse2
                mdPsum_cur[row] = dot
            if const_expr(not self.dq_flagged):
                for j in cutlass.range_constexpr(self.vec // 4):  # zero the dQ accumulator row (16-byte stores)
                    cute.copy(st_atom, rZero,
                              cute.local_tile(mdQ_cur[row, None], (4,), (chunk * (self.vec // 4) + j,)))


def compile_preprocess(dtype: torch.dtype, head_dim: int, tile_m: int, varlen: bool, dq_flagged: bool,
                       with_dlse: bool):
    """Compiled preprocess for (dtype, head dim, the mainloop's ``tile_m``, varlen, whether the mainloop keeps
    flags per dQ tile (``dq_flagged``: its deterministic mode or ``dq_zero_in_mainloop``; the flags are zeroed
    then, not the accumulator), whether a dLSE comes); called as ``fn(out, dout, lse, dlse, lse2, dpsum,
    dq_accum, dq_flag, cu_seqlens, num_batch, max_seqlen)`` with ``dlse`` None unless ``with_dlse`` (then
    float32 shaped like ``lse``, contiguous) and ``dq_flag`` (int32 ``(B, Hq, S_pad / tile_m)``, packed
    ``(1, Hq, T_pad / tile_m)``) None unless ``dq_flagged``.  Compile-cache key: ``(str(dtype), *the other
    arguments)``."""

    def build():
        kern = RankerBwdPreprocess(cute_dtype(dtype), head_dim, tile_m, varlen, dq_flagged, with_dlse)
        f = BwdFakes(head_dim, varlen)
        return kern, (f.inputs(f.hq, dtype), f.inputs(f.hq, dtype), f.lse(), f.lse() if with_dlse else None,
                      f.rows(), f.rows(), f.dq_accum(), f.dq_flag() if dq_flagged else None, f.cu, Int32(1),
                      Int32(1), fake_stream())

    return compile_cached(NAME, (str(dtype), head_dim, tile_m, varlen, dq_flagged, with_dlse), build)
