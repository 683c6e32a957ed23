"""Probe: the per-token Q/K norm past L2 with an L2 prefetch of a later token's rows.  At N=16384 (q + k
168 MB, past the H200's 60 MiB L2) the per-token kernel holds about 40 KB of loads in flight per SM (4 CTAs
of one 10-KB token) and reaches 94% of the copy rate (84.4 us); torch's in-place ``mul_`` of the same bytes
83.3.  Here, at its start, one thread of each part (q, k) of CTA ``b`` issues
``cp.async.bulk.prefetch.L2.global`` for the rows of CTA ``b + distance``, so that CTA later finds them in
L2: more bytes in flight without more registers.  Same sums, so the same bits (checked).  CUDA graph,
shuffled rounds, next to torch's copy and in-place mul_.

    python3 bench/qknorm_l2_prefetch_probe.py [--rounds=N] [--n=8192,16384]
"""
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from cute_kernels.kernels import qknorm as mod
from qknorm_sweep import compile_probe_kernel, run_probe

DISTANCES = (528, 1056, 2112, 4224)  # CTAs ahead: 1, 2, 4, 8 waves of 4 resident CTAs on 132 SMs


@dsl_user_op
def prefetch_l2(addr: Int64, nbytes: int, *, loc=None, ip=None) -> None:
    """``cp.async.bulk.prefetch.L2.global [addr], nbytes`` (nbytes a multiple of 16)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(nbytes).ir_value(loc=loc, ip=ip)],
                    "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


class PrefetchKernel(mod.QKNormKernel):
    def __init__(self, dtype, config, distance: int):
        super().__init__(dtype, config)
        self.distance = distance

    @cute.jit
    def normalize(self, mX: cute.Tensor, mW: cute.Tensor, part: cutlass.Constexpr, dim: cutlass.Constexpr,
                  tidx: Int32, bidx: Int32, n: Int32, eps, sRed: cute.Tensor,
                  warp_base: cutlass.Constexpr, barrier_id: cutlass.Constexpr):
        rows = self.config.rows
        if tidx < rows:
            row = (bidx + self.distance) * rows + tidx
            if row < n:
                prefetch_l2(mX[row, None].iterator.toint(), part.width * self.dtype.width // 8)
        mod.QKNormKernel.normalize(self, mX, mW, part, dim, tidx, bidx, n, eps, sRed, warp_base, barrier_id)


def variants(dtype, qd, kd):
    fns = {"per_token": mod._compile(dtype, qd, kd)}
    for d in DISTANCES:
        fns[f"prefetch{d}"] = compile_probe_kernel("qknorm_l2_prefetch_probe",
                                                   lambda dt, cfg, d=d: PrefetchKernel(dt, cfg, d), dtype, qd, kd, d)
    return fns


if __name__ == "__main__":
    run_probe(sys.argv[1:], __doc__, variants, ns=(8192, 16384))
