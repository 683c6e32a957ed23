"""Tuning sweep of the one-GPU fused Q/K RMSNorm (vectors per thread, streaming cache hints).

    python3 bench/qknorm_sweep.py

Prints one JSON line per (tuning, N): kernel time in a CUDA graph and the fraction of the measured
copy rate (Q=4096, K=1024, bf16).
"""

import json

import torch

import cute_kernels  # noqa: F401  (sets the arch)
from cute_kernels.kernels import qknorm as mod
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us


def main():
    bw = copy_bandwidth_gbps()
    print(json.dumps(dict(copy_gbps=round(bw, 1))))
    qd, kd, dtype = 4096, 1024, torch.bfloat16
    for tuning in (mod.QKNormTuning(4, False), mod.QKNormTuning(4, True), mod.QKNormTuning(2, False),
                   mod.QKNormTuning(2, True), mod.QKNormTuning(8, False), mod.QKNormTuning(8, True)):
        fn = mod._compile(dtype, qd, kd, tuning)
        for n in (64, 4096, 16384, 65536):
            q = torch.randn(n, qd, device="cuda", dtype=dtype)
            k = torch.randn(n, kd, device="cuda", dtype=dtype)
            wq = torch.randn(qd, device="cuda", dtype=dtype)
            wk = torch.randn(kd, device="cuda", dtype=dtype)
            t = cuda_time_us(lambda: fn(q, k, wq, wk, 1e-6), graph=True, reps=30)
            gbps = 2 * (q.numel() + k.numel()) * 2 / t / 1e3
            print(json.dumps(dict(vecs=tuning.target_vecs, streaming=tuning.streaming, n=n,
                                  time_us=round(t, 2), copy_frac=round(gbps / bw, 3))))


if __name__ == "__main__":
    main()
