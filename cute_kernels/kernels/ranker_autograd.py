"""Autograd for ranker attention (issues 3 and 4): the forward of :mod:`.ranker_fwd` (with its LSE)
and the backward of :mod:`.ranker_bwd` joined by a ``torch.autograd.Function``.

:func:`cute_kernels.ranker_attention` goes through :class:`RankerAttentionFunction` whenever grad
mode is on and q, k or v requires grad; otherwise it calls the forward op directly (no autograd
bookkeeping on the inference path).  Both directions are ``torch.library`` custom ops, so the
function also works under ``torch.compile`` (``fullgraph=True``).
"""

from __future__ import annotations

import torch

from .ranker_bwd import ranker_attention_backward_op
from .ranker_fwd import _ranker_op


class RankerAttentionFunction(torch.autograd.Function):
    """``(out, lse) = ranker attention(q, k, v, bounds, ...)`` with gradients for q, k and v.

    ``bounds`` and ``cu_seqlens`` are not differentiable; ``lse`` is returned but marked
    non-differentiable.  The backward keeps q, k, v, out and lse alive and launches
    :func:`.ranker_bwd.ranker_attention_backward` (head dims 64 and 128: a 256 head dim raises
    ``ValueError`` in ``backward()``; under torch.compile, when the call is compiled).
    """

    @staticmethod
    def forward(ctx, q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen):
        out, lse = _ranker_op(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)
        ctx.save_for_backward(q, k, v, out, lse, bounds, cu_seqlens)
        ctx.scalars = (softmax_scale, cap, cap_method, max_seqlen)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        # the kernels are not differentiable: a backward that builds a graph (create_graph=True) raises
        # instead of returning gradients whose own gradient would silently miss the attention's terms
        # (torch's once_differentiable raises only when the incoming gradient requires grad)
        if torch.is_grad_enabled():
            raise RuntimeError("ranker_attention has no double backward: its backward kernels are not "
                               "differentiable; call backward() / autograd.grad() without create_graph=True")
        q, k, v, out, lse, bounds, cu_seqlens = ctx.saved_tensors
        softmax_scale, cap, cap_method, max_seqlen = ctx.scalars
        dq, dk, dv = ranker_attention_backward_op(q, k, v, out, lse, dout.contiguous(), bounds, softmax_scale, cap,
                                                  cap_method, cu_seqlens, max_seqlen)
        return dq, dk, dv, None, None, None, None, None, None
