"""Small qknorm / qknorm_tp launches for compute-sanitizer (memcheck, racecheck); not a pytest module.

    compute-sanitizer --tool racecheck python3 tests/gpu/qknorm_sanitize_case.py

The TP case runs ranks back to back: sanitizers serialize kernels, so rank 0 cannot meet rank 1
and its wait ends at the (short) timeout, which is expected here and reported, not raised.
"""

import torch

import cute_kernels
from cute_kernels.kernels import qknorm_tp

for dtype, (qd, kd), n in ((torch.bfloat16, (768, 128), 37), (torch.float32, (4096, 1024), 3)):
    q = torch.randn(n, qd, device="cuda", dtype=dtype)
    k = torch.randn(n, kd, device="cuda", dtype=dtype)
    cute_kernels.qk_rmsnorm_(q, k, torch.ones(qd, device="cuda", dtype=dtype),
                             torch.ones(kd, device="cuda", dtype=dtype), 1e-6)
ranks = qknorm_tp.ParallelQKNorm.emulated(2, 64, 4096, 1024, torch.bfloat16, timeout_s=0.05)
q = torch.randn(9, 2048, device="cuda", dtype=torch.bfloat16)
k = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
w = (torch.ones(2048, device="cuda", dtype=torch.bfloat16), torch.ones(512, device="cuda", dtype=torch.bfloat16))
for r in ranks:
    r(q, k, w[0], w[1], 1e-6)
torch.cuda.synchronize()
print("sanitize case done; tp timeouts:", [int(r._error_np[0]) for r in ranks])
