"""Ranker attention backward, step 3 of 3 (issue 4): dQ out of its float32 accumulator, GQA dK/dV,
and the candidate self terms.

Per key row ``j`` and KV head (one row per ``head_dim / 8`` consecutive lanes, 16-byte vectors):

* for each query head ``h`` of the group: ``dQ_h = softmax_scale * dQaccum_h`` in the input dtype;
* a candidate ``j`` outside the history attends, besides the history, only its own key.  The
  mainloop leaves that diagonal out (no 128x128 tiles masked down to their diagonal), so it is
  added here as per-row vector operations (issue 4):
  ``P_jj = exp2(cap(q_j.k_j) * scale_log2 - LSE2_j)``,
  ``dS_jj = P_jj (dO_j.v_j - dPsum_j) cap'(s_jj)``,
  ``dQ_j += scale dS_jj k_j``, ``dK_j += scale dS_jj q_j``, ``dV_j += P_jj dO_j`` (dK, dV summed over
  the group's query heads in float32);
* GQA with one query head per mainloop CTA (``dkv_accumulated``): ``dK = dKaccum + self terms``,
  ``dV = dVaccum + self terms`` in the input dtype (the mainloop reduce-added the query heads'
  float32 tiles); MHA, and GQA with a group per CTA: the mainloop wrote dK, dV already (zeros on
  candidate keys outside the history), so only the self-term rows are written.

STATUS: GPU-tested on the H200 alone and as part of the backward (tests/gpu/test_ranker_bwd_gpu.py).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from ..runtime.cache import compile_cached
from ..runtime.fake import cute_dtype, fake_stream
from . import sm90_helpers as sm90
from .ranker_bwd_buffers import BwdFakes, dq_flag_coord, sequence_offsets
from .ranker_mask import RankerSegments

NAME = "ranker_bwd_postprocess"
NUM_THREADS = 128
PASSES = 4  # row passes per CTA


class RankerBwdPostprocess:
    """For one (dtype, head dim, the mainloop's tile_m, GQA ratio, cap method, varlen, whether dK/dV come
    in float32 accumulators)."""

    def __init__(self, dtype, head_dim: int, tile_m: int, qhead_per_kvhead: int, cap_method: str, varlen: bool,
                 dkv_accumulated: bool, dq_flagged: bool = False):
        if head_dim % 64:
            raise ValueError(f"head_dim={head_dim}: must be a multiple of 64")
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.qhead_per_kvhead = qhead_per_kvhead
        if dkv_accumulated and qhead_per_kvhead == 1:
            raise ValueError("dkv_accumulated: only GQA (qhead_per_kvhead > 1) has dK/dV accumulators")
        self.dkv_accumulated = dkv_accumulated
        self.dq_flagged = dq_flagged  # the accumulator's q block tiles hold data only where flagged (not 0)
        self.cap_method = cap_method
        self.varlen = varlen
        self.vec = 128 // dtype.width
        self.threads_per_row = head_dim // self.vec
        self.rows_per_pass = NUM_THREADS // self.threads_per_row
        self.rows_per_cta = self.rows_per_pass * PASSES

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
                 mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdQflag: Optional[cute.Tensor], mdQ: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mdKaccum: Optional[cute.Tensor], mdVaccum: Optional[cute.Tensor],
                 mBounds: cute.Tensor, mCuSeqlens: Optional[cute.Tensor], scale_log2: Float32, softmax_scale: Float32,
                 cap: Float32, num_batch: Int32, max_seqlen: Int32, stream):
        if const_expr(self.varlen):
            mQ, mK, mV, mdO, mdQ, mdK, mdV = [sm90.select_modes(t, [0, 2, 1]) for t in (mQ, mK, mV, mdO, mdQ, mdK, mdV)]
            if const_expr(self.dkv_accumulated):
                mdKaccum, mdVaccum = [sm90.select_modes(t, [0, 2, 1]) for t in (mdKaccum, mdVaccum)]
            mLSE2, mdPsum = [sm90.select_modes(t, [1, 0]) for t in (mLSE2, mdPsum)]
            mdQaccum = sm90.select_modes(mdQaccum, [1, 2, 0])
        else:
            mQ, mK, mV, mdO, mdQ, mdK, mdV = [sm90.select_modes(t, [1, 3, 2, 0])
                                              for t in (mQ, mK, mV, mdO, mdQ, mdK, mdV)]
            if const_expr(self.dkv_accumulated):
                mdKaccum, mdVaccum = [sm90.select_modes(t, [1, 3, 2, 0]) for t in (mdKaccum, mdVaccum)]
            mLSE2, mdPsum = [sm90.select_modes(t, [2, 1, 0]) for t in (mLSE2, mdPsum)]
            mdQaccum = sm90.select_modes(mdQaccum, [2, 3, 1, 0])
        grid = (cute.ceil_div(max_seqlen, self.rows_per_cta), cute.size(mK.shape[2]), num_batch)
        self.kernel(mQ, mK, mV, mdO, mLSE2, mdPsum, mdQaccum, mdQflag, mdQ, mdK, mdV, mdKaccum, mdVaccum, mBounds,
                    mCuSeqlens, scale_log2, softmax_scale, cap, Int32(mQ.shape[0])).launch(
            grid=grid, block=[NUM_THREADS, 1, 1], stream=stream)

    def _row(self, mX, row, offset, head, batch):
        """(D,) row ``row`` of one sequence and head of a (S, D, H, B) / packed (T, D, H) tensor."""
        if const_expr(self.varlen):
            return mX[offset + row, None, head]
        return mX[row, None, head, batch]

    def _stat(self, mX, prow, head, batch):
        if const_expr(self.varlen):
            return mX[prow, head]
        return mX[prow, head, batch]

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
               mdPsum: cute.Tensor, mdQaccum: cute.Tensor, mdQflag: Optional[cute.Tensor], mdQ: cute.Tensor,
               mdK: cute.Tensor, mdV: cute.Tensor, mdKaccum: Optional[cute.Tensor], mdVaccum: Optional[cute.Tensor],
               mBounds: cute.Tensor, mCuSeqlens: Optional[cute.Tensor], scale_log2: Float32, softmax_scale: Float32,
               cap: Float32, seqlen_static: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        row_block, head_kv, batch = cute.arch.block_idx()
        offset, seqlen, pad = sequence_offsets(mCuSeqlens, batch, seqlen_static, self.tile_m, self.varlen)
        seg = RankerSegments.load(mBounds, batch, seqlen)
        ld_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        f32_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        chunk = tidx % self.threads_per_row
        if const_expr(self.qhead_per_kvhead == 1):
            self.rows_mha(mQ, mK, mV, mdO, mLSE2, mdPsum, mdQaccum, mdQflag, mdQ, mdK, mdV, seg, row_block, head_kv,
                          batch, offset, seqlen, pad, chunk, tidx, ld_atom, f32_atom, scale_log2, softmax_scale,
                          cap)
        else:
            self.rows_gqa(mQ, mK, mV, mdO, mLSE2, mdPsum, mdQaccum, mdQflag, mdQ, mdK, mdV, mdKaccum, mdVaccum, seg,
                          row_block, head_kv, batch, offset, seqlen, pad, chunk, tidx, ld_atom, f32_atom, scale_log2,
                          softmax_scale, cap)

    @cute.jit
    def rows_gqa(self, mQ, mK, mV, mdO, mLSE2, mdPsum, mdQaccum, mdQflag, mdQ, mdK, mdV, mdKaccum, mdVaccum, seg,
                 row_block, head_kv, batch, offset, seqlen, pad, chunk, tidx, ld_atom, f32_atom, scale_log2,
                 softmax_scale, cap):
        """A group of query heads per KV head, row by row (PASSES rows per lane group): each query head's
        dQ (with its self term), then the row's dK/dV self terms summed over the group in float32 (plus
        the float32 accumulators with ``dkv_accumulated``)."""
        vec = self.vec
        g = self.qhead_per_kvhead
        for p in cutlass.range_constexpr(PASSES):
            row = row_block * self.rows_per_cta + p * self.rows_per_pass + tidx // self.threads_per_row
            valid = row < seqlen
            self_term = valid and seg.takes_self_term(row)
            rk = cute.make_rmem_tensor((vec,), Float32)
            rv = cute.make_rmem_tensor((vec,), Float32)
            rk.fill(0.0)
            rv.fill(0.0)
            if self_term:
                rk.store(self._load(ld_atom, self._row(mK, row, offset, head_kv, batch), chunk))
                rv.store(self._load(ld_atom, self._row(mV, row, offset, head_kv, batch), chunk))
            dk_self = cute.make_rmem_tensor((vec,), Float32)
            dv_self = cute.make_rmem_tensor((vec,), Float32)
            dk_self.fill(0.0)
            dv_self.fill(0.0)
            for h in cutlass.range(g, unroll=1):
                head = head_kv * g + h
                rq = cute.make_rmem_tensor((vec,), Float32)
                rdo = cute.make_rmem_tensor((vec,), Float32)
                rq.fill(0.0)
                rdo.fill(0.0)
                if self_term:
                    rq.store(self._load(ld_atom, self._row(mQ, row, offset, head, batch), chunk))
                    rdo.store(self._load(ld_atom, self._row(mdO, row, offset, head, batch), chunk))
                # every lane shuffles (rows of one warp differ in self_term)
                s = cute.arch.warp_reduction_sum((rq.load() * rk.load()).reduce(cute.ReductionOp.ADD, Float32(0.0), 0),
                                                 threads_in_group=self.threads_per_row)
                dov = cute.arch.warp_reduction_sum(
                    (rdo.load() * rv.load()).reduce(cute.ReductionOp.ADD, Float32(0.0), 0),
                    threads_in_group=self.threads_per_row)
                if valid:
                    rdq = cute.make_rmem_tensor((vec,), Float32)
                    rdq.fill(0.0)
                    if self._dq_written(mdQflag, pad + row, head, batch):
                        self._load_f32(f32_atom, self._row(mdQaccum, pad + row, Int32(0), head, batch), chunk, rdq)
                    rdq.store(rdq.load() * softmax_scale)
                    if self_term:
                        p_self, ds = self._self_term(s, dov, mLSE2, mdPsum, pad + row, head, batch, scale_log2,
                                                     softmax_scale, cap)
                        rdq.store(rdq.load() + ds * rk.load())
                        dk_self.store(dk_self.load() + ds * rq.load())
                        dv_self.store(dv_self.load() + p_self * rdo.load())
                    self._store(ld_atom, rdq, self._row(mdQ, row, offset, head, batch), chunk)
            if const_expr(self.dkv_accumulated):
                if valid:
                    for acc, self_part, mOut in ((mdKaccum, dk_self, mdK), (mdVaccum, dv_self, mdV)):
                        racc = cute.make_rmem_tensor((vec,), Float32)
                        self._load_f32(f32_atom, self._row(acc, row, offset, head_kv, batch), chunk, racc)
                        racc.store(racc.load() + self_part.load())
                        self._store(ld_atom, racc, self._row(mOut, row, offset, head_kv, batch), chunk)
            else:
                if self_term:
                    self._store(ld_atom, dk_self, self._row(mdK, row, offset, head_kv, batch), chunk)
                    self._store(ld_atom, dv_self, self._row(mdV, row, offset, head_kv, batch), chunk)

    @cute.jit
    def rows_mha(self, mQ, mK, mV, mdO, mLSE2, mdPsum, mdQaccum, mdQflag, mdQ, mdK, mdV, seg, row_block, head, batch,
                 offset, seqlen, pad, chunk, tidx, ld_atom, f32_atom, scale_log2, softmax_scale, cap):
        """One query head per KV head: the same per-row work as the GQA loop, with the dQ accumulator
        loads of all the CTA's PASSES rows issued first (16-byte vectors into registers): otherwise a
        pass's loads wait behind the previous pass's stores, which the compiler cannot move them past
        (it cannot prove the tensors disjoint).  The candidate rows' self-term loads (q, k, v, dO,
        LSE2, dPsum: a minority of rows) stay in their pass."""
        vec = self.vec
        rdqs = []
        for p in cutlass.range_constexpr(PASSES):
            row = row_block * self.rows_per_cta + p * self.rows_per_pass + tidx // self.threads_per_row
            rdq = cute.make_rmem_tensor((vec,), Float32)
            rdq.fill(0.0)
            if row < seqlen:
                if self._dq_written(mdQflag, pad + row, head, batch):
                    self._load_f32(f32_atom, self._row(mdQaccum, pad + row, Int32(0), head, batch), chunk, rdq)
            rdqs.append(rdq)
        for p in cutlass.range_constexpr(PASSES):
            row = row_block * self.rows_per_cta + p * self.rows_per_pass + tidx // self.threads_per_row
            valid = row < seqlen
            self_term = valid and seg.takes_self_term(row)
            rq, rk, rv, rdo = (cute.make_rmem_tensor((vec,), Float32) for _ in range(4))
            for r in (rq, rk, rv, rdo):
                r.fill(0.0)
            s_part = Float32(0.0)
            dov_part = Float32(0.0)
            if self_term:
                for r, mX in zip((rq, rk, rv, rdo), (mQ, mK, mV, mdO)):
                    r.store(self._load(ld_atom, self._row(mX, row, offset, head, batch), chunk))
                s_part = (rq.load() * rk.load()).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                dov_part = (rdo.load() * rv.load()).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            # every lane shuffles (rows of one warp differ in self_term)
            s = cute.arch.warp_reduction_sum(s_part, threads_in_group=self.threads_per_row)
            dov = cute.arch.warp_reduction_sum(dov_part, threads_in_group=self.threads_per_row)
            if valid:
                rdq = rdqs[p]
                rdq.store(rdq.load() * softmax_scale)
                if self_term:
                    p_self, ds = self._self_term(s, dov, mLSE2, mdPsum, pad + row, head, batch, scale_log2,
                                                 softmax_scale, cap)
                    rdq.store(rdq.load() + ds * rk.load())
                    dk_self = cute.make_rmem_tensor((vec,), Float32)
                    dv_self = cute.make_rmem_tensor((vec,), Float32)
                    dk_self.fill(0.0)  # 0 + x, as the GQA loop: a -0.0 product is written as +0.0
                    dv_self.fill(0.0)
                    dk_self.store(dk_self.load() + ds * rq.load())
                    dv_self.store(dv_self.load() + p_self * rdo.load())
                    self._store(ld_atom, dk_self, self._row(mdK, row, offset, head, batch), chunk)
                    self._store(ld_atom, dv_self, self._row(mdV, row, offset, head, batch), chunk)
                self._store(ld_atom, rdq, self._row(mdQ, row, offset, head, batch), chunk)

    @cute.jit
    def _dq_written(self, mdQflag, prow, head, batch):
        """Whether the mainloop wrote the dQ accumulator's tile of padded row ``prow`` (``dq_flagged``: its q
        block's flag is not 0, the count of the deterministic mode's adds or the flag of the tile's zeroing
        in the mainloop; else always, the preprocess zeroed the accumulator)."""
        written = True
        if const_expr(self.dq_flagged):
            written = mdQflag[dq_flag_coord(batch, head, prow // self.tile_m, self.varlen)] != 0
        return written

    @cute.jit
    def _load_f32(self, atom, g_row, chunk, r):
        """This lane's chunk (``vec`` values) of a float32 row into ``r``, in 16-byte loads."""
        for j in cutlass.range_constexpr(self.vec // 4):
            cute.copy(atom, cute.local_tile(g_row, (4,), (chunk * (self.vec // 4) + j,)),
                      cute.local_tile(r, (4,), (j,)))

    def _self_term(self, s, dov, mLSE2, mdPsum, prow, head, batch, scale_log2, softmax_scale, cap):
        """A candidate's own key: ``(P_jj, scale * dS_jj)`` from its raw score ``s = q_j.k_j`` and
        ``dov = dO_j.v_j`` (module docstring)."""
        lse2 = Float32(self._stat(mLSE2, prow, head, batch))
        dpsum = Float32(self._stat(mdPsum, prow, head, batch))
        t, dcap = sm90.cap_and_slope(s, softmax_scale, cap, self.cap_method)
        p_self = cute.math.exp2(t * scale_log2 - lse2, fastmath=True)
        return p_self, p_self * (dov - dpsum) * dcap * softmax_scale

    def _load(self, atom, g_row, chunk):
        """16-byte load of this lane's chunk of a row, as float32 values."""
        r = cute.make_rmem_tensor((self.vec,), self.dtype)
        cute.copy(atom, cute.local_tile(g_row, (self.vec,), (chunk,)), r)
        return r.load().to(Float32)

    def _store(self, atom, r_f32, g_row, chunk):
        """float32 values -> one 16-byte store of this lane's chunk of a row in the input dtype."""
        r = cute.make_rmem_tensor((self.vec,), self.dtype)
        r.store(r_f32.load().to(self.dtype))
        cute.copy(atom, r, cute.local_tile(g_row, (self.vec,), (chunk,)))


def fake_args(dtype: torch.dtype, head_dim: int, varlen: bool, dkv_accumulated: bool, dq_flagged: bool) -> tuple:
    """The fake (shape-only) call arguments a :class:`RankerBwdPostprocess` compiles with, in the order of
    :func:`compile_postprocess`'s call (also what ``bench/ranker_bwd_prepost_probe.py`` compiles variants with)."""
    f = BwdFakes(head_dim, varlen)
    hq, hkv = f.hq, f.hkv
    dk_acc = f.outputs(hkv, torch.float32) if dkv_accumulated else None
    dv_acc = f.outputs(hkv, torch.float32) if dkv_accumulated else None
    return (f.inputs(hq, dtype), f.inputs(hkv, dtype), f.inputs(hkv, dtype), f.inputs(hq, dtype), f.rows(), f.rows(),
            f.dq_accum(), f.dq_flag() if dq_flagged else None, f.outputs(hq, dtype), f.outputs(hkv, dtype),
            f.outputs(hkv, dtype), dk_acc, dv_acc, f.bounds(), f.cu, Float32(1.0), Float32(1.0), Float32(1.0),
            Int32(1), Int32(1), fake_stream())


def compile_postprocess(dtype: torch.dtype, head_dim: int, tile_m: int, qhead_per_kvhead: int, cap_method: str,
                        varlen: bool, dkv_accumulated: bool, dq_flagged: bool):
    """Compiled postprocess; called as ``fn(q, k, v, dout, lse2, dpsum, dq_accum, dq_flag, dq, dk, dv, dk_accum,
    dv_accum, bounds, cu_seqlens, scale_log2, softmax_scale, cap, num_batch, max_seqlen)`` (the
    accumulators None unless ``dkv_accumulated``: GQA with one query head per mainloop CTA; ``dq_flag``, the
    dQ accumulator's flags per q block, None unless ``dq_flagged``: the mainloop ran its deterministic mode or
    zeroed the tiles itself, ``dq_zero_in_mainloop``)."""

    def build():
        kern = RankerBwdPostprocess(cute_dtype(dtype), head_dim, tile_m, qhead_per_kvhead, cap_method, varlen,
                                    dkv_accumulated, dq_flagged)
        return kern, fake_args(dtype, head_dim, varlen, dkv_accumulated, dq_flagged)

    return compile_cached(NAME, (str(dtype), head_dim, tile_m, qhead_per_kvhead, cap_method, varlen, dkv_accumulated,
                                 dq_flagged), build)
