"""Probe: the per-token Q/K norm with a launch bound of 5 or 6 CTAs per SM (ptxas then has 40 or 32 registers
per thread instead of the 41 it picks, which gives 4 CTAs of 320 threads per SM); Nsight Compute showed
torch's in-place kernel with 1.5x the active warps (bench/results/logs/2026-11-30_s18_qknorm_ncu_16384.log).
Same code, so the same bits (checked).  CUDA graph, shuffled rounds, next to torch's copy and in-place mul_.

    python3 bench/qknorm_launch_bound_probe.py [--rounds=N] [--n=8192,16384]
"""
import json
import random
import statistics
import sys

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32

from cute_kernels.kernels import qknorm as mod
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import cute_dtype, fake_stream, fake_tensor
from cute_kernels.runtime.timing import copy_bandwidth_gbps
from qknorm_sweep import bits_equal, time_rounds


class BoundedKernel(mod.QKNormKernel):
    def __init__(self, dtype, config, ctas_per_sm: int):
        super().__init__(dtype, config)
        self.ctas_per_sm = ctas_per_sm

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor, eps: Float32, stream):
        n = mQ.shape[0]
        grid = (n + self.config.rows - 1) // self.config.rows
        self.kernel(mQ, mK, mWq, mWk, eps).launch(grid=[grid, 1, 1], block=[self.config.threads, 1, 1],
                                                  stream=stream, min_blocks_per_mp=self.ctas_per_sm)


def compile_bounded(dtype, qd, kd, ctas_per_sm: int):
    cfg = mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=mod.DEFAULT_TUNING)

    def build():
        vec = mod.vec_elems(dtype)
        n = cute.sym_int()
        sq, sk = cute.sym_int(divisibility=vec), cute.sym_int(divisibility=vec)
        return BoundedKernel(cute_dtype(dtype), cfg, ctas_per_sm), (
            fake_tensor(dtype, (n, qd), stride=(sq, 1)), fake_tensor(dtype, (n, kd), stride=(sk, 1)),
            fake_tensor(dtype, (qd,)), fake_tensor(dtype, (kd,)), Float32(1e-6), fake_stream())

    return compile_cached("qknorm_launch_bound_probe", (str(dtype), qd, kd, ctas_per_sm), build)


def main(argv):
    rounds, ns = 7, (8192, 16384)
    for a in argv:
        if a.startswith("--rounds="):
            rounds = int(a.split("=", 1)[1])
        elif a.startswith("--n="):
            ns = tuple(int(x) for x in a.split("=", 1)[1].split(","))
        else:
            raise SystemExit(f"unknown argument {a!r}\n{__doc__}")
    qd, kd, dtype = 4096, 1024, torch.bfloat16
    fns = {"per_token": mod._compile(dtype, qd, kd), "bound5": compile_bounded(dtype, qd, kd, 5),
           "bound6": compile_bounded(dtype, qd, kd, 6)}
    from cute_kernels.runtime.cache import compile_record

    for c in (5, 6):  # what ptxas gave each bound (a launch bound compiles only where a GPU is visible)
        rec = compile_record("qknorm_launch_bound_probe", (str(dtype), qd, kd, c))
        print(json.dumps(dict(ctas_per_sm=c, resources=[(r.registers, r.stack_bytes) for r in rec.resources],
                              sass=rec.sass_features if rec.sass else None)), flush=True)
    bw = copy_bandwidth_gbps()
    print(json.dumps(dict(copy_gbps=round(bw, 1), rounds=rounds)), flush=True)
    rng = random.Random(0)
    for n in ns:
        q = torch.randn(n, qd, device="cuda", dtype=dtype)
        k = torch.randn(n, kd, device="cuda", dtype=dtype)
        wq = torch.empty(qd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
        wk = torch.empty(kd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
        print(json.dumps(dict(n=n, bits_equal=bits_equal(fns, q, k, wq, wk))), flush=True)
        wq.fill_(1)
        wk.fill_(1)
        q2, k2 = torch.empty_like(q), torch.empty_like(k)
        calls = {name: (lambda fn=fn: fn(q, k, wq, wk, 1e-6)) for name, fn in fns.items()}
        calls["torch_copy"] = lambda: (q2.copy_(q), k2.copy_(k))
        calls["torch_scalar_mul_"] = lambda: (q.mul_(1.0), k.mul_(1.0))
        times = time_rounds(calls, rounds, rng)
        print(json.dumps(dict(n=n, us={m: statistics.median(v) for m, v in times.items()}, all=times)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
