"""Host time of an eager ``ranker_attention`` call with the kept launch plan's key of session 38 (q's shape,
strides, dtype, device; k's shape; k's and v's strides; the bounds' shape; the scalars: the rest is left to
the compiled function's own checks) against the key of sessions 24-37 (every tensor's shape, strides, dtype
and device, plus an alignment check of every data pointer), interleaved in one process (the H200's host
speed varies 1.5x between runs, so only a same-run comparison shows a ~1-us change).

    python3 bench/ranker_plan_key_ab.py   (on the GPU; bench/ on sys.path)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import torch
from probe_timing import report_host_times

import cute_kernels
from cute_kernels.kernels import ranker_fwd as fwd


def eager_sessions_24_37(q, k, v, bounds, softmax_scale, cap, cap_method, cu_seqlens, max_seqlen, with_lse=True):
    """The plan lookup as it was before session 38 (for this comparison only)."""
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
           v.dtype, v.device, bounds.shape, bounds.stride(), bounds.dtype, bounds.device, type(softmax_scale),
           softmax_scale, type(cap), cap, type(cap_method), cap_method, with_lse)
    plan = fwd._PLANS.get(key)
    if plan is not None and fwd._pointers_aligned(q, k, v, bounds):
        fn, q_compact, lse_shape, tail = plan
        out = fwd._empty_like(q) if q_compact else q.new_empty(q.shape)
        lse = None if lse_shape is None else q.new_empty(lse_shape, dtype=torch.float32)
        fn(q, k, v, bounds, out, lse, None, *tail)
        return out, lse
    raise RuntimeError("no plan under the old key")


def main():
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 96, 96, 128]], device="cuda", dtype=torch.int32)
    cute_kernels.ranker_attention(q, q, q, bounds)
    new_key = fwd._plan_key(q, q, q, bounds, None, None, "tanh", False)
    assert new_key in fwd._PLANS
    old_key = (q.shape, q.stride(), q.dtype, q.device, q.shape, q.stride(), q.dtype, q.device, q.shape, q.stride(),
               q.dtype, q.device, bounds.shape, bounds.stride(), bounds.dtype, bounds.device, type(None), None,
               type(None), None, str, "tanh", False)
    fwd._PLANS[old_key] = fwd._PLANS[new_key]
    x = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    report_host_times({
        "plan, session 38 key": lambda: fwd._ranker_eager(q, q, q, bounds, None, None, "tanh", None, None,
                                                           with_lse=False),
        "plan, sessions 24-37 key": lambda: eager_sessions_24_37(q, q, q, bounds, None, None, "tanh", None, None,
                                                                 with_lse=False),
        "ranker_attention (public)": lambda: cute_kernels.ranker_attention(q, q, q, bounds),
        "torch.mul (2048 bf16)": lambda: torch.mul(x, 2.0),
    })


if __name__ == "__main__":
    main()
