"""Autograd for ranker attention (issues 3 and 4): the backward of :mod:`.ranker_bwd` registered as the
gradient of the forward op ``torch.ops.cute_kernels.ranker_attention_fwd`` (``torch.library``'s
``register_autograd``).

So every way of calling the forward differentiates: :func:`cute_kernels.ranker_attention` (which takes
the op whenever grad mode is on and q, k or v requires grad; without grad it calls the implementation
directly, no autograd bookkeeping), ``torch.ops.cute_kernels.ranker_attention_fwd`` itself (an exported
or traced graph) and ``torch.compile(fullgraph=True)``; not ``torch.func`` transforms
(``NotImplementedError``: torch's custom-op autograd refuses grad / vjp, and the kernels have no vmap
rule).  ``bounds`` and ``cu_seqlens`` are not differentiable; the returned ``lse`` is (a loss on it, e.g.
merging attention over key chunks or a z-loss, reaches q and k: the backward's preprocess folds its
gradient into dPsum; under torch.compile the backward always gets one, zeros when the loss ignores lse).
The backward keeps q, k, v, out and lse alive and launches :func:`.ranker_bwd.ranker_attention_backward`'s
op, in its deterministic mode when torch's flag is on (``torch.use_deterministic_algorithms(True)``; read
when the backward runs, or, under torch.compile, when it is compiled: Dynamo guards on the flag and
recompiles), else in its default (non-deterministic) mode.  Head dims 64, 128 and 256 (as the forward).  Its
modules load on the first backward.
"""

from __future__ import annotations

import torch


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bounds, cu_seqlens)
    ctx.scalars = (softmax_scale, cap, cap_method, max_seqlen)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros allocated)


def _backward(ctx, dout, dlse):
    # the kernels are not differentiable: a backward that builds a graph (create_graph=True) raises
    # instead of returning gradients whose own gradient would silently miss the attention's terms
    if torch.is_grad_enabled():
        raise RuntimeError("ranker_attention has no double backward: its backward kernels are not "
                           "differentiable; call backward() / autograd.grad() without create_graph=True")
    from .ranker_bwd import ranker_attention_backward_op

    q, k, v, out, lse, bounds, cu_seqlens = ctx.saved_tensors
    softmax_scale, cap, cap_method, max_seqlen = ctx.scalars
    if dout is None and dlse is None:
        return None, None, None, None, None, None, None, None, None
    # a loss on lse alone: dO = 0 (dV = 0; dS = P * dLSE * cap')
    dout = torch.zeros_like(out) if dout is None else dout.contiguous()
    dq, dk, dv = ranker_attention_backward_op(q, k, v, out, lse, dout, bounds, softmax_scale, cap, cap_method,
                                              cu_seqlens, max_seqlen, torch.are_deterministic_algorithms_enabled(),
                                              dlse)
    return dq, dk, dv, None, None, None, None, None, None


def register(op) -> None:
    """Make the forward op (``ranker_fwd._ranker_op.op``) differentiable in q, k and v."""
    op.register_autograd(_backward, setup_context=_setup_context)
