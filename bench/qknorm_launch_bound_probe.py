"""Probe: the per-token Q/K norm with a launch bound of 5 or 6 CTAs per SM (ptxas gave both 32 registers and
8 B of stack, instead of the 41 it picks unbounded: 4 CTAs of 320 threads per SM); Nsight Compute showed
torch's in-place kernel with 1.5x the active warps (bench/results/logs/2026-11-30_s18_qknorm_ncu_16384.log).
Same code, so the same bits (checked).  CUDA graph, shuffled rounds, next to torch's copy and in-place mul_.

    python3 bench/qknorm_launch_bound_probe.py [--rounds=N] [--n=8192,16384]

Run recorded: bench/results/logs/2026-11-30_s18_qknorm_launch_bound_probe.log (3.5% slower; not shipped).
"""
import json
import sys

import cutlass.cute as cute
from cutlass import Float32

from cute_kernels.kernels import qknorm as mod
from qknorm_sweep import PROBE_TUNING, compile_probe_kernel, run_probe


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
    return compile_probe_kernel("qknorm_launch_bound_probe", lambda dt, cfg: BoundedKernel(dt, cfg, ctas_per_sm),
                                dtype, qd, kd, ctas_per_sm)


def variants(dtype, qd, kd):
    from cute_kernels.runtime.cache import compile_record

    fns = {"per_token": mod._compile(dtype, qd, kd, PROBE_TUNING), "bound5": compile_bounded(dtype, qd, kd, 5),
           "bound6": compile_bounded(dtype, qd, kd, 6)}
    for c in (5, 6):  # what ptxas gave each bound (a launch bound compiles only where a GPU is visible)
        rec = compile_record("qknorm_launch_bound_probe", (str(dtype), qd, kd, c))
        print(json.dumps(dict(ctas_per_sm=c, resources=[(r.registers, r.stack_bytes) for r in rec.resources])),
              flush=True)
    return fns


PROBE_ARGS = dict(ns=(8192, 16384))


if __name__ == "__main__":
    run_probe(sys.argv[1:], __doc__, variants, **PROBE_ARGS)
