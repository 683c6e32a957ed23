"""Peers of ``ranker_fwd`` for ``bench()``: each returns ``fn`` (one forward call) or raises.

All import only on the GPU machine (FlashAttention-4 and quack come from the ``.devkit`` peers
wheels).  Mask and calls follow ``../shared/bench-peers/anchor_bench*.py`` (how the issue's peer
figures were taken): FlexAttention with the ranker block mask (tanh cap as ``score_mod``),
FlashAttention-4 sm90 with the ranker ``mask_mod`` reading the bounds from an aux tensor plus its
block-sparsity tensors, FlashAttention-4 dense over the history keys with the self term merged
through the LSE (what a user without mask support does), and cuDNN SDPA dense over all keys.
"""

from __future__ import annotations

import math

import torch


def _mask_terms(bounds, b, qi, ki):
    """The ranker mask for FlexAttention's ``mask_mod`` (query ``qi``, key ``ki`` of batch row ``b``)."""
    hl, hh, cl, ch = bounds[b, 0], bounds[b, 1], bounds[b, 2], bounds[b, 3]
    kv_hist = (ki >= hl) & (ki < hh)
    q_hist = (qi >= hl) & (qi < hh)
    q_cand = (qi >= cl) & (qi < ch)
    return (kv_hist & (q_hist | q_cand)) | (q_cand & (qi == ki))


def flex(q, k, v, bounds, cap=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    nb, s, hq, _ = q.shape
    bm = create_block_mask(lambda b, h, qi, ki: _mask_terms(bounds, b, qi, ki), nb, None, s, s, device=q.device)
    fn = torch.compile(flex_attention)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    score_mod = None
    if cap is not None:
        def score_mod(score, b, h, qi, ki):
            return cap * torch.tanh(score / cap)
    gqa = k.shape[2] != hq
    return lambda: fn(qt, kt, vt, block_mask=bm, score_mod=score_mod, enable_gqa=gqa)


def fa4_ranker_mask(transposed: bool = False):
    """The ranker mask as a FlashAttention-4 CuTe ``mask_mod`` reading the bounds from ``aux_tensors[0]``;
    ``transposed`` swaps query and key (the backward's block sparsity over the transposed mask)."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def ranker_mask(batch, head, a_idx, b_idx, seqlen_info, aux_tensors):
        m_idx, n_idx = (b_idx, a_idx) if transposed else (a_idx, b_idx)
        bnd = aux_tensors[0]
        hl = utils.scalar_to_ssa(bnd[batch[0], 0], cutlass.Int32)
        hu = utils.scalar_to_ssa(bnd[batch[0], 1], cutlass.Int32)
        cl = utils.scalar_to_ssa(bnd[batch[0], 2], cutlass.Int32)
        cu = utils.scalar_to_ssa(bnd[batch[0], 3], cutlass.Int32)
        kv_hist = (n_idx >= hl) & (n_idx < hu)
        q_hist = (m_idx >= hl) & (m_idx < hu)
        q_cand = (m_idx >= cl) & (m_idx < cu)
        return (kv_hist & (q_hist | q_cand)) | (q_cand & (m_idx == n_idx))

    return ranker_mask


def fa4_mask_mod(q, k, v, bounds, cap=None):
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.compute_block_sparsity import compute_block_sparsity

    ranker_mask = fa4_ranker_mask()
    nb, s, hq, _ = q.shape
    bst = compute_block_sparsity(tile_m=128, tile_n=128, batch_size=nb, num_heads=hq, seqlen_q=s, seqlen_k=s,
                                 mask_mod=ranker_mask, aux_tensors=[bounds], device=q.device)
    kw = dict(mask_mod=ranker_mask, aux_tensors=[bounds], block_sparse_tensors=bst)
    if cap is not None:
        kw["softcap"] = cap
    return lambda: flash_attn_func(q, k, v, **kw)


def fa4_dense_merge(q, k, v, bounds, cap=None):
    """Dense attention of all queries over the history keys, then the candidates' self term merged
    through the LSE (bounds must be the benchmark's [0, H, H, S] rows)."""
    from flash_attn.cute import flash_attn_func

    hist = int(bounds[0, 1])
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    kh, vh = k[:, :hist].contiguous(), v[:, :hist].contiguous()
    g = q.shape[2] // k.shape[2]

    def fn():
        o, lse = flash_attn_func(q, kh, vh, return_lse=True)
        qc = q[:, hist:]
        kc = k[:, hist:].repeat_interleave(g, dim=2)
        vc = v[:, hist:].repeat_interleave(g, dim=2)
        sc = (qc.float() * kc.float()).sum(-1) * scale
        l = lse[:, :, hist:].transpose(1, 2)
        new = torch.logaddexp(l, sc)
        oc = o[:, hist:].float() * torch.exp(l - new)[..., None] + vc.float() * torch.exp(sc - new)[..., None]
        o[:, hist:] = oc.to(o.dtype)
        return o

    if cap is not None:
        raise NotImplementedError("dense merge peer is timed without a cap")
    return fn


def sdpa_dense(q, k, v, bounds, cap=None):
    """cuDNN SDPA, dense over all keys (for scale, not the ranker mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if cap is not None or k.shape[2] != q.shape[2]:
        raise NotImplementedError("dense SDPA peer only for MHA without a cap")
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt)

    return fn


PEERS = {"flex_attention": flex, "fa4_mask_mod": fa4_mask_mod, "fa4_dense_merge": fa4_dense_merge,
         "sdpa_cudnn_dense": sdpa_dense}
