"""Where the eager host time of one ``ranker_attention`` call goes (issue 3's target: <= 10 us per call).

    python3 bench/host_breakdown.py

Times (host, us per call, 2000 back-to-back calls after 200 warm-up, best of 5 interleaved rounds) the public call and
its pieces at a tiny shape (B=1, S=128, H=1, D=64), so the differences show what each layer costs:
the public wrapper (without ``return_lse``: the kernel variant that writes no LSE, one output; with it, two),
the registered op's eager fast path, the kept launch plan of a signature (and its key), the full path
(validation cached per signature, config choice), the output allocations (``new_empty``, ``empty_like`` of q:
the plan's way for a compact q, ``torch.empty``), and the raw compiled (tvm-ffi)
calls with and without the LSE; torch.mul for scale.
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import torch

import cute_kernels
from cute_kernels.kernels import ranker_fwd as fwd
from cute_kernels.runtime import torch_op
from probe_timing import report_host_times


def main():
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 96, 96, 128]], device="cuda", dtype=torch.int32)
    cute_kernels.ranker_attention(q, q, q, bounds)
    cute_kernels.ranker_attention(q, q, q, bounds, return_lse=True)
    fns = {fkey[-1]: (fkey, fn) for fkey, fn in fwd._FNS.items()}  # with LSE (True) / without (False)
    (fkey, fn), (_, fn_no_lse) = fns[True], fns[False]
    out, lse = torch.empty_like(q), torch.empty((1, 1, 128), device="cuda", dtype=torch.float32)
    cfg = fkey[1]
    max_ctas = fwd.sm_count(q.device) if cfg.persistent else 2**31 - 1
    sl = fwd.exp2_scale(0.125, None)
    x = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    calls = {
        "ranker_attention (public)": lambda: cute_kernels.ranker_attention(q, q, q, bounds),
        "ranker_attention (return_lse)": lambda: cute_kernels.ranker_attention(q, q, q, bounds, return_lse=True),
        "_ranker_op (eager fast path)": lambda: fwd._ranker_op(q, q, q, bounds),
        "_ranker_eager (kept launch plan)": lambda: fwd._ranker_eager(q, q, q, bounds, None, None, "tanh", None, None),
        "_plan_key": lambda: fwd._plan_key(q, q, q, bounds, None, None, "tanh", False),
        "_ranker_impl (full path)": lambda: fwd._ranker_impl(q, q, q, bounds, None, None, "tanh", None, None),
        "_validate_cached": lambda: fwd._validate_cached(q, q, q, bounds, None, None, "tanh", None, None),
        "torch_op.tracing()": torch_op.tracing,
        "2 x new_empty (out, lse)": lambda: (q.new_empty(q.shape), q.new_empty((1, 1, 128), dtype=torch.float32)),
        "1 x new_empty (out)": lambda: q.new_empty(q.shape),
        "1 x empty_like (q)": lambda: torch.empty_like(q),
        "1 x torch.empty(shape, dtype, device)": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
        "1 x empty_like contiguous_format": lambda: torch.empty_like(q, memory_format=torch.contiguous_format),
        "raw compiled call (13 args)": lambda: fn(q, q, q, bounds, out, lse, None, sl, 0.125, 1.0, 1, 128, max_ctas),
        "raw compiled call, no LSE": lambda: fn_no_lse(q, q, q, bounds, out, None, None, sl, 0.125, 1.0, 1, 128,
                                                       max_ctas),
        "torch.mul (2048 bf16)": lambda: torch.mul(x, 2.0),
    }
    report_host_times(calls)


if __name__ == "__main__":
    main()
