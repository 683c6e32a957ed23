"""One launch each, for Nsight Compute: the shipped one-GPU Q/K norm (one CTA per token) at N tokens
(default 16384, bf16 4096/1024), torch's in-place scalar ``mul_`` of q and k, and torch's copy of q and k
(the same bytes).  Not a benchmark (no timing here); run it under ncu, e.g.

    ncu --clock-control none --kernel-name regex:"QKNorm|vectorized_elementwise" \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum python3 bench/qknorm_ncu_case.py
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import sys

import torch

from cute_kernels.kernels import qknorm as mod

n = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
qd, kd, dtype = 4096, 1024, torch.bfloat16
q = torch.randn(n, qd, device="cuda", dtype=dtype)
k = torch.randn(n, kd, device="cuda", dtype=dtype)
wq, wk = torch.ones(qd, device="cuda", dtype=dtype), torch.ones(kd, device="cuda", dtype=dtype)
q2, k2 = torch.empty_like(q), torch.empty_like(k)
fn = mod._compile(dtype, qd, kd)  # one CTA per token (what qk_rmsnorm_ launches at this N)
torch.cuda.synchronize()
fn(q, k, wq, wk, 1e-6)
q.mul_(1.0)
k.mul_(1.0)
q2.copy_(q)
k2.copy_(k)
torch.cuda.synchronize()
print("done", n)
