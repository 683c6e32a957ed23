"""Differentiable ranker attention (issue 4): the forward of :mod:`.ranker_fwd` (with its LSE) and
the backward of :mod:`.ranker_bwd` joined by a ``torch.autograd.Function``.

STATUS: NOT YET GPU-VALIDATED.  The backward kernels were written and compiled for sm_90a on a
machine without a GPU; ``tests/gpu/test_ranker_bwd_gpu.py`` checks them against float64 reference
gradients on a GPU.  Until that passes, :func:`cute_kernels.ranker_attention` stays forward-only
(no autograd); opt in explicitly with :func:`ranker_attention_autograd`.
"""

from __future__ import annotations

from typing import Optional

import torch

from .ranker_bwd import ranker_attention_backward_op
from .ranker_fwd import _ranker_op


class RankerAttentionFunction(torch.autograd.Function):
    """``out = ranker_attention(q, k, v, bounds, ...)`` with gradients for q, k, v (bounds and
    cu_seqlens are not differentiable; ``lse`` is returned but not differentiable)."""

    @staticmethod
    def forward(ctx, q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen):
        out, lse = _ranker_op(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen)
        ctx.save_for_backward(q, k, v, out, lse, bounds, cu_seqlens)
        ctx.scalars = (softmax_scale, cap, cap_method, max_seqlen)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, bounds, cu_seqlens = ctx.saved_tensors
        softmax_scale, cap, cap_method, max_seqlen = ctx.scalars
        dq, dk, dv = ranker_attention_backward_op(q, k, v, out, lse, dout.contiguous(), bounds, softmax_scale, cap,
                                                  cap_method, cu_seqlens, max_seqlen)
        return dq, dk, dv, None, None, None, None, None, None


def ranker_attention_autograd(q, k, v, bounds, softmax_scale=None, cap=None, cap_method: str = "tanh",
                              return_lse: bool = False, cu_seqlens: Optional[torch.Tensor] = None,
                              max_seqlen: Optional[int] = None):
    """:func:`cute_kernels.ranker_attention` with ``.backward()`` support (gradients of q, k, v).

    NOT YET GPU-VALIDATED (see the module docstring): opt-in until a GPU session passes
    ``tests/gpu/test_ranker_bwd_gpu.py``.  Same arguments, rules, errors and return values as
    :func:`.ranker_fwd.ranker_attention` (head dims 64 and 128 for the backward: a 256 head dim
    fails in ``backward()`` with ``ValueError``); ``lse`` is not differentiable.  Works under
    ``torch.compile`` (both directions are ``torch.library`` custom ops).  The backward keeps q, k,
    v, out and lse alive; it launches :func:`.ranker_bwd.ranker_attention_backward`.
    """
    out, lse = RankerAttentionFunction.apply(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens,
                                             max_seqlen)
    return (out, lse) if return_lse else out
