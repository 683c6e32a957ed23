"""Small qknorm / qknorm_tp launches for compute-sanitizer (memcheck, racecheck); not a pytest module.

    compute-sanitizer --tool racecheck python3 tests/gpu/qknorm_sanitize_case.py

Also the persistent one-GPU kernel (5 CTAs over 37 tokens; the op's own pick at 1024 tokens) and the
bulk-staged one (3 CTAs of 4 slots over 37 tokens: every slot refilled; 6144/1024 with 3 slots), and one CTA
per token with its L2 prefetch of a near CTA's rows (3 ahead, so it runs at 37 tokens).
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
# the persistent kernel: 5 CTAs walking 37 tokens (partial sums in alternating smem slots), and the op's
# own pick of it at 1024 tokens
from cute_kernels.kernels import qknorm

for n, qd, fn in ((37, 4096, qknorm._compile(torch.bfloat16, 4096, 1024, qknorm.QKNormTuning(2, False, 5))),
                  (1024, 4096, lambda *a: cute_kernels.qk_rmsnorm_(*a)),
                  (37, 4096, qknorm._compile(torch.bfloat16, 4096, 1024, qknorm.QKNormTuning(2, False, 3, 4))),
                  (37, 6144, qknorm._compile(torch.bfloat16, 6144, 1024, qknorm.QKNormTuning(2, False, 3, 3))),
                  # one CTA per token with the L2 prefetch 3 CTAs ahead (the last 3 CTAs prefetch nothing)
                  (37, 4096, qknorm._compile(torch.bfloat16, 4096, 1024,
                                             qknorm.QKNormTuning(2, False, l2_prefetch_bytes=3 * 10240)))):
    q = torch.randn(n, qd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
    fn(q, k, torch.ones(qd, device="cuda", dtype=torch.bfloat16), torch.ones(1024, device="cuda", dtype=torch.bfloat16),
       1e-6)
ranks = qknorm_tp.ParallelQKNorm.emulated(2, 64, 4096, 1024, torch.bfloat16, timeout_s=0.05)
q = torch.randn(9, 2048, device="cuda", dtype=torch.bfloat16)
k = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
w = (torch.ones(2048, device="cuda", dtype=torch.bfloat16), torch.ones(512, device="cuda", dtype=torch.bfloat16))
for r in ranks:
    r(q, k, w[0], w[1], 1e-6)
torch.cuda.synchronize()
print("sanitize case done; tp timeouts:", [int(r._error_np[0]) for r in ranks])
