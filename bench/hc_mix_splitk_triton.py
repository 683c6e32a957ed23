"""Baseline for hc_mix: the seed's "stock" split-K Triton design, written fairly.

Seed 001 (``launcher/.../hc_fused.py``) describes the engine's stock path: a partial kernel with one
program per (row block, K slice) -- 80 slices of 256 columns at K = 20480, 64-column chunks,
``tl.dot`` in tf32x3, 4 warps -- that writes every slice's ``[rows, 24]`` partial and sum of
squares to memory, then a reduce + Sinkhorn kernel (one program per row, 1 warp) that sums the
partials in slice order and computes pre / post / comb.  Same math and outputs as
``cute_kernels.hc_mix_sinkhorn``.  BLOCK_M and the pipeline depth are autotuned per M (the stock
engine tunes them too); the autotuner runs on the first, eager call.
"""

from __future__ import annotations
if __name__ == "__main__":  # (also imported as a module: the check only when run as a script)
    from probe_timing import gpu_script

    gpu_script(__doc__)

import torch
import triton
import triton.language as tl

HC = 4
MIX = 24
MIX_PAD = 32
SLICE_K = 256
BLOCK_K = 64


@triton.autotune(
    configs=[triton.Config({"BLOCK_M": bm}, num_warps=4, num_stages=ns)
             for bm in (16, 32, 64) for ns in (2, 4)],
    key=["M", "K"],
)
@triton.jit
def _hc_mix_stats_partial_kernel(x_ptr, w_ptr, mix_ptr, sq_ptr, M, K, stride_xm, stride_wn,
                                 BLOCK_M: tl.constexpr, MIX: tl.constexpr, MIX_PAD: tl.constexpr,
                                 SLICE_K: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    sl = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, MIX_PAD)
    mask_m = offs_m < M
    mask_n = offs_n < MIX
    acc = tl.zeros([BLOCK_M, MIX_PAD], dtype=tl.float32)
    sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for kk in tl.static_range(0, SLICE_K, BLOCK_K):
        offs_k = sl * SLICE_K + kk + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None],
                    mask=mask_n[None, :] & mask_k[:, None], other=0.0)
        acc = tl.dot(x, w, acc, input_precision="tf32x3")
        sq += tl.sum(x * x, axis=1)
    tl.store(mix_ptr + (sl * M + offs_m[:, None]) * MIX + offs_n[None, :], acc,
             mask=mask_m[:, None] & mask_n[None, :])
    tl.store(sq_ptr + sl * M + offs_m, sq, mask=mask_m)


@triton.jit
def _hc_mix_reduce_sinkhorn_kernel(mix_ptr, sq_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr,
                                   M, num_slices, inv_k, rms_eps, hc_eps, iters,
                                   MIX: tl.constexpr, HC: tl.constexpr):
    row = tl.program_id(0)
    i4 = tl.arange(0, HC)
    c44 = i4[:, None] * HC + i4[None, :]
    a_pre = tl.zeros([HC], dtype=tl.float32)
    a_post = tl.zeros([HC], dtype=tl.float32)
    a_comb = tl.zeros([HC, HC], dtype=tl.float32)
    sq = 0.0
    for s in range(num_slices):
        base = mix_ptr + (s * M + row) * MIX
        a_pre += tl.load(base + i4)
        a_post += tl.load(base + HC + i4)
        a_comb += tl.load(base + 2 * HC + c44)
        sq += tl.load(sq_ptr + s * M + row)
    r = 1.0 / tl.sqrt(sq * inv_k + rms_eps)
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    pre = tl.sigmoid(a_pre * r * s0 + tl.load(base_ptr + i4)) + hc_eps
    post = 2.0 * tl.sigmoid(a_post * r * s1 + tl.load(base_ptr + HC + i4))
    c = a_comb * r * s2 + tl.load(base_ptr + 2 * HC + c44)
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + hc_eps
    c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    for _ in range(iters - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    tl.store(pre_ptr + row * HC + i4, pre)
    tl.store(post_ptr + row * HC + i4, post)
    tl.store(comb_ptr + row * HC * HC + c44, c)


def hc_mix_splitk_triton(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6):
    """Split-K stock design: partials [num_slices, M, 24] + [num_slices, M] to memory, then reduce."""
    m, k = x.shape
    dev = x.device
    pre = torch.empty(m, HC, dtype=torch.float32, device=dev)
    post = torch.empty(m, HC, dtype=torch.float32, device=dev)
    comb = torch.empty(m, HC, HC, dtype=torch.float32, device=dev)
    if m == 0:
        return pre, post, comb
    num_slices = triton.cdiv(k, SLICE_K)
    mix = torch.empty(num_slices, m, MIX, dtype=torch.float32, device=dev)
    sq = torch.empty(num_slices, m, dtype=torch.float32, device=dev)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), num_slices)  # noqa: E731
    _hc_mix_stats_partial_kernel[grid](x, hc_fn, mix, sq, m, k, x.stride(0), hc_fn.stride(0),
                                       MIX=MIX, MIX_PAD=MIX_PAD, SLICE_K=SLICE_K, BLOCK_K=BLOCK_K)
    _hc_mix_reduce_sinkhorn_kernel[(m,)](mix, sq, hc_scale, hc_base, pre, post, comb, m, num_slices,
                                         1.0 / k, rms_eps, hc_eps, sinkhorn_iters, MIX=MIX, HC=HC,
                                         num_warps=1)
    return pre, post, comb
