"""Peers of ``ranker_bwd`` for ``bench()``: each returns ``fn`` (one backward: the gradients of q, k,
v for a fixed ``dout``) or raises.

They import only on the GPU machine (FlashAttention-4 from the ``.devkit`` peers wheels).  Set-up as
in ``../shared/bench-peers/anchor_bench2.py`` (how the issue's backward figures were taken):
FlashAttention-4 sm90 with the ranker ``mask_mod`` and both block-sparsity tensors (forward and the
transposed mask for the backward, 128x128 blocks); FlexAttention with the ranker block mask
(``donated_buffer`` off so its backward can be replayed); cuDNN SDPA dense over all keys (MHA, no cap).
The forward runs once at set-up; ``fn`` times ``torch.autograd.grad(out, (q, k, v), dout)`` only.
"""

from __future__ import annotations

import torch


def _grad_fn(out, inputs, dout):
    out = out[0] if isinstance(out, tuple) else out
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def fa4_mask_mod(q, k, v, bounds, cap=None):
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import flash_attn_func, utils
    from flash_attn.cute.compute_block_sparsity import compute_block_sparsity

    def make_mask(transposed: bool):
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

    nb, s, hq, _ = q.shape
    mask, mask_t = make_mask(False), make_mask(True)
    bst = compute_block_sparsity(tile_m=128, tile_n=128, batch_size=nb, num_heads=hq, seqlen_q=s, seqlen_k=s,
                                 mask_mod=mask, aux_tensors=[bounds], device=q.device)
    bst_bwd = compute_block_sparsity(tile_m=128, tile_n=128, batch_size=nb, num_heads=hq, seqlen_q=s, seqlen_k=s,
                                     mask_mod=mask_t, aux_tensors=[bounds], device=q.device)
    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
    kw = dict(mask_mod=mask, aux_tensors=[bounds], block_sparse_tensors=bst, block_sparse_tensors_bwd=bst_bwd)
    if cap is not None:
        kw["softcap"] = cap
    out = flash_attn_func(qq, kk, vv, **kw)
    out = out[0] if isinstance(out, tuple) else out
    return _grad_fn(out, (qq, kk, vv), torch.randn_like(out))


def flex(q, k, v, bounds, cap=None):
    import torch._functorch.config as fconfig
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fconfig.donated_buffer = False
    nb, s, hq, _ = q.shape

    def mask_mod(b, h, qi, ki):
        hl, hh, cl, ch = bounds[b, 0], bounds[b, 1], bounds[b, 2], bounds[b, 3]
        kv_hist = (ki >= hl) & (ki < hh)
        return (kv_hist & (((qi >= hl) & (qi < hh)) | ((qi >= cl) & (qi < ch)))) | ((qi >= cl) & (qi < ch) & (qi == ki))

    bm = create_block_mask(mask_mod, nb, None, s, s, device=q.device)
    score_mod = None
    if cap is not None:
        def score_mod(score, b, h, qi, ki):
            return cap * torch.tanh(score / cap)
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(flex_attention)(qt, kt, vt, block_mask=bm, score_mod=score_mod,
                                        enable_gqa=k.shape[2] != hq)
    return _grad_fn(out, (qt, kt, vt), torch.randn_like(out))


def sdpa_dense(q, k, v, bounds, cap=None):
    """cuDNN SDPA backward, dense over all keys (for scale, not the ranker mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if cap is not None or k.shape[2] != q.shape[2]:
        raise NotImplementedError("dense SDPA peer only for MHA without a cap")
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qt, kt, vt)
    dout = torch.randn_like(out)

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(out, (qt, kt, vt), dout, retain_graph=True)

    return fn


PEERS = {"fa4_mask_mod": fa4_mask_mod, "flex_attention": flex, "sdpa_cudnn_dense": sdpa_dense}
