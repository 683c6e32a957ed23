"""Peers of ``ranker_bwd`` for ``bench()``: each returns ``fn`` (one backward: the gradients of q, k,
v for the caller's ``dout``, the same tensor every implementation gets) or raises.  No peer draws
random numbers: a peer whose CUDA-graph capture fails leaves torch's default generator unusable
("Offset increment outside graph capture"), which used to break the next shape's peers.

They import only on the GPU machine (FlashAttention-4 from the ``.devkit`` peers wheels).  Set-up as
in ``../shared/bench-peers/anchor_bench2.py`` (how the issue's backward figures were taken):
FlashAttention-4 sm90 with the ranker ``mask_mod`` and both block-sparsity tensors (forward and the
transposed mask for the backward, 128x128 blocks); FlexAttention with the ranker block mask
(``donated_buffer`` off so its backward can be replayed); cuDNN SDPA dense over all keys (MHA, no cap).
The forward runs once at set-up; ``fn`` times ``torch.autograd.grad(out, (q, k, v), dout)`` only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def _load_forward_peers():
    """The forward's peer module (its masks), under the name torch.compile re-imports it by."""
    if "ranker_fwd_peers" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ranker_fwd_peers", Path(__file__).with_name("ranker_fwd_peers.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ranker_fwd_peers"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["ranker_fwd_peers"]


_FWD = _load_forward_peers()


def _grad_fn(out, inputs, dout):
    out = out[0] if isinstance(out, tuple) else out
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def fa4_mask_mod(q, k, v, bounds, dout, cap=None):
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.compute_block_sparsity import compute_block_sparsity

    nb, s, hq, _ = q.shape
    mask, mask_t = _FWD.fa4_ranker_mask(False), _FWD.fa4_ranker_mask(True)
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
    return _grad_fn(out, (qq, kk, vv), dout)


def flex(q, k, v, bounds, dout, cap=None):
    import torch._functorch.config as fconfig
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fconfig.donated_buffer = False
    nb, s, hq, _ = q.shape

    bm = create_block_mask(lambda b, h, qi, ki: _FWD._mask_terms(bounds, b, qi, ki), nb, None, s, s, device=q.device)
    score_mod = None
    if cap is not None:
        def score_mod(score, b, h, qi, ki):
            return cap * torch.tanh(score / cap)
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(flex_attention)(qt, kt, vt, block_mask=bm, score_mod=score_mod,
                                        enable_gqa=k.shape[2] != hq)
    return _grad_fn(out, (qt, kt, vt), dout.transpose(1, 2).contiguous())


def sdpa_dense(q, k, v, bounds, dout, cap=None):
    """cuDNN SDPA backward, dense over all keys (for scale, not the ranker mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if cap is not None or k.shape[2] != q.shape[2]:
        raise NotImplementedError("dense SDPA peer only for MHA without a cap")
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qt, kt, vt)
    dout = dout.transpose(1, 2).contiguous()

    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(out, (qt, kt, vt), dout, retain_graph=True)

    return fn


PEERS = {"fa4_mask_mod": fa4_mask_mod, "flex_attention": flex, "sdpa_cudnn_dense": sdpa_dense}
