"""What both hc_mix kernels (:mod:`.hc_mix_walk`, :mod:`.hc_mix_tma`) share: the mix's sizes (hc_mult = 4, so
24 values per row: 4 pre, 4 post, 16 comb; seed 001), the three-piece bf16 split of hc_fn
(:func:`_split3_bf16x2`), the per-row epilogue (sigmoids + Sinkhorn, :func:`row_epilogue`) and the compile-time
stand-ins of their launch arguments (:func:`fake_launch_args`).  The op is :func:`.hc_mix.hc_mix_sinkhorn`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32

from ..runtime.fake import fake_stream, fake_tensor

HC = 4  # hc_mult
N_MIX = 2 * HC + HC * HC  # 24 mix values per row
N_PIECES = 3  # hc_fn = hi + mid + lo (bf16)
SP_COLS = N_MIX + 1  # 24 mix partials + sum of squares
K_ALIGN = 64  # K: a multiple of 64 columns (both kernels' k tiles)
SMEM_LIMIT = 227 * 1024  # opt-in shared memory per CTA on sm_90


@cute.jit
def _split3_bf16x2(w0: Float32, w1: Float32):
    """Packed bf16x2 pieces (lo, mid, hi) of the pair (w0, w1): hi = rn(w), mid = rn(w - hi),
    lo = rn(w - hi - mid); both differences are exact, so w = hi + mid + lo + O(2^-27 |w|) (for
    2^-110 <= |w| <= bf16's largest finite value: the module docstring gives the edges)."""
    # inputs are copied first and outputs written last: "=r" outputs may share input registers
    return cute.arch.inline_ptx(
        "{\n\t.reg .b32 q0, q1, p0, p1, h, md;\n\t"
        "mov.b32 p0, {$r0};\n\t"
        "mov.b32 p1, {$r1};\n\t"
        "cvt.rn.bf16x2.f32 h, p1, p0;\n\t"
        "shl.b32 q0, h, 16;\n\t"
        "and.b32 q1, h, -65536;\n\t"
        "sub.f32 p0, p0, q0;\n\t"
        "sub.f32 p1, p1, q1;\n\t"
        "cvt.rn.bf16x2.f32 md, p1, p0;\n\t"
        "shl.b32 q0, md, 16;\n\t"
        "and.b32 q1, md, -65536;\n\t"
        "sub.f32 p0, p0, q0;\n\t"
        "sub.f32 p1, p1, q1;\n\t"
        "cvt.rn.bf16x2.f32 {$w0}, p1, p0;\n\t"
        "mov.b32 {$w1}, md;\n\t"
        "mov.b32 {$w2}, h;\n\t}\n",
        write_only_types=[Int32, Int32, Int32],
        read_only_args=[w0, w1],
    )


class EpilogueArgs(NamedTuple):
    """What the per-row epilogue (:func:`row_epilogue`) writes and reads besides the row's sums; both hc_mix
    kernels pass it (the TMA kernels as launch arguments, spread)."""

    mScale: Any  # [3] float32: hc_scale
    mBase: Any  # [24] float32: hc_base
    mPre: Any  # [M, 4] float32
    mPost: Any  # [M, 4] float32
    mComb: Any  # [M, 16] float32
    mMix: Any  # [M, 25] float32 raw sums (written only with store_mix; else a dummy row)
    sinkhorn_iters: Any
    rms_eps: Any
    hc_eps: Any


@cute.jit
def _sigmoid(z: Float32):
    return cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-z))


@cute.jit
def row_epilogue(sSums: cute.Tensor, rr: Int32, row: Int32, k: Int32, epi, store_mix: cutlass.Constexpr):
    """One thread's row ``row`` from its sums ``sSums[rr, :]`` (24 of x . hc_fn^T, then sum x^2; ``epi``:
    :class:`EpilogueArgs`): r = 1/sqrt(mean x^2 + rms_eps), pre = sigmoid + hc_eps, post = 2 sigmoid, comb =
    row softmax + hc_eps then Sinkhorn (seed 001; float32)."""
    if cutlass.const_expr(store_mix):
        for c in cutlass.range_constexpr(SP_COLS):
            epi.mMix[row, c] = sSums[rr, c]
    # reciprocals by rcp.approx / rsqrt, no IEEE division: each division or 1 / sqrt took a slow-path
    # branch in this latency chain (H200, session 19: 0.5-0.6 us less per call at every M; errors
    # against float64 unchanged, <= 4e-7)
    sq = sSums[rr, N_MIX]
    r = cute.math.rsqrt(sq * cute.arch.rcp_approx(Float32(k)) + epi.rms_eps)
    s0 = epi.mScale[0] * r
    s1 = epi.mScale[1] * r
    s2 = epi.mScale[2] * r
    hc_eps = epi.hc_eps
    for i in cutlass.range_constexpr(HC):
        epi.mPre[row, i] = _sigmoid(sSums[rr, i] * s0 + epi.mBase[i]) + hc_eps
    for i in cutlass.range_constexpr(HC):
        epi.mPost[row, i] = Float32(2.0) * _sigmoid(sSums[rr, HC + i] * s1 + epi.mBase[HC + i])
    rM = cute.make_rmem_tensor(cute.make_layout(HC * HC), Float32)
    for i in cutlass.range_constexpr(HC * HC):
        rM[i] = sSums[rr, 2 * HC + i] * s2 + epi.mBase[2 * HC + i]
    # softmax over each row, + eps
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
    _normalize_cols(rM, hc_eps)
    for _ in cutlass.range(epi.sinkhorn_iters - 1, unroll=1):
        _normalize_rows(rM, hc_eps)
        _normalize_cols(rM, hc_eps)
    for i in cutlass.range_constexpr(HC * HC):
        epi.mComb[row, i] = rM[i]


@cute.jit
def _normalize_rows(rM: cute.Tensor, hc_eps: Float32):
    """Sinkhorn's row step on the 4 x 4 ``rM`` (row-major): each row divided by its sum + hc_eps."""
    for i in cutlass.range_constexpr(HC):
        ssum = rM[i * HC]
        for j in cutlass.range_constexpr(1, HC):
            ssum = ssum + rM[i * HC + j]
        inv = cute.arch.rcp_approx(ssum + hc_eps)
        for j in cutlass.range_constexpr(HC):
            rM[i * HC + j] = rM[i * HC + j] * inv


@cute.jit
def _normalize_cols(rM: cute.Tensor, hc_eps: Float32):
    """Sinkhorn's column step: each column divided by its sum + hc_eps."""
    for j in cutlass.range_constexpr(HC):
        ssum = rM[j]
        for i in cutlass.range_constexpr(1, HC):
            ssum = ssum + rM[i * HC + j]
        inv = cute.arch.rcp_approx(ssum + hc_eps)
        for i in cutlass.range_constexpr(HC):
            rM[i * HC + j] = rM[i * HC + j] * inv


def fake_launch_args() -> tuple:
    """Compile-time stand-ins for the launch arguments, shared by both hc_mix kernels: x, hc_fn, scale, base,
    pre, post, comb, mix, sinkhorn_iters, rms_eps, hc_eps, stream."""
    m = cute.sym_int()
    k = cute.sym_int(divisibility=K_ALIGN)
    mm = cute.sym_int()
    x_ld = cute.sym_int(divisibility=8)  # row strides: 16-byte multiples (checked on the host)
    w_ld = cute.sym_int(divisibility=4)
    # explicit row-major strides (a compact fake tensor without strides is column-major)
    return (
        fake_tensor(torch.bfloat16, (m, k), stride=(x_ld, 1)),
        fake_tensor(torch.float32, (N_MIX, k), stride=(w_ld, 1)),
        fake_tensor(torch.float32, (3,), align=4),
        fake_tensor(torch.float32, (N_MIX,), align=4),
        fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
        fake_tensor(torch.float32, (m, HC), stride=(HC, 1)),
        fake_tensor(torch.float32, (m, HC * HC), stride=(HC * HC, 1)),
        fake_tensor(torch.float32, (mm, SP_COLS), stride=(SP_COLS, 1), align=4),
        Int32(20), Float32(1e-6), Float32(1e-6), fake_stream())
