"""Probe: the per-token Q/K norm with x kept packed (16-bit) across the row reduction (the shipped
``qknorm.keep_packed``: an opaque register move after the sum stops the compiler from keeping the float32
copies of x alive until the scale; ptxas: 6144/1024 bf16 58 -> 48 registers, 3 -> 4 CTAs of 320 threads per
SM; 4096/1024 stays at 41) against the same kernel without it ("unpacked", the code before session 18).  Same
math, so the same bits (checked).  CUDA graph, shuffled rounds, next to torch's copy and in-place mul_.

    python3 bench/qknorm_packed_probe.py [--rounds=N] [--n=4096,8192,16384]

Run recorded: bench/results/logs/2026-11-30_s18_qknorm_packed_probe.log (then "packed" was this probe's own
copy of the change and "per_token" the kernel without it).
"""
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from cute_kernels.kernels import qknorm as mod
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import cute_dtype
from qknorm_sweep import PROBE_TUNING, run_probe


class UnpackedKernel(mod.QKNormKernel):
    """The per-token kernel without :func:`qknorm.keep_packed`."""

    @cute.jit
    def normalize(self, mX, mW, role: cutlass.Constexpr, tidx, bidx, n, eps, sRed):
        tXgX, tXrX, tXrW, row_ok, col_ok = self.load_rows(mX, mW, role.part, tidx, bidx, n)
        ss = self.row_sum_of_squares(tXrX, role, tidx, sRed)
        scale = cute.math.rsqrt(ss * Float32(1.0 / role.dim) + eps, fastmath=True)
        self.scale_and_store(tXgX, tXrX, tXrW, scale, row_ok, col_ok, role.part)


def compile_unpacked(dtype, qd, kd):
    cfg = mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=PROBE_TUNING)
    return compile_cached("qknorm_unpacked_probe", (str(dtype), qd, kd),
                          lambda: (UnpackedKernel(cute_dtype(dtype), cfg), mod.fake_launch_args(dtype, qd, kd)))


def variants(dtype, qd, kd):
    return {"per_token": mod._compile(dtype, qd, kd, PROBE_TUNING), "unpacked": compile_unpacked(dtype, qd, kd)}


PROBE_ARGS = dict(shapes=((6144, 1024), (4096, 1024)), ns=(4096, 8192, 16384))


if __name__ == "__main__":
    run_probe(sys.argv[1:], __doc__, variants, **PROBE_ARGS)
