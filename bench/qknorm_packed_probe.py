"""Probe: the per-token Q/K norm with x kept packed (16-bit) across the row reduction: an opaque register
move after the sum stops the compiler from keeping the float32 copies of x alive until the scale (ptxas:
6144/1024 bf16 58 -> 48 registers, 3 -> 4 CTAs of 320 threads per SM; 4096/1024 stays at 41).  Same math,
so the same bits (checked).  CUDA graph, shuffled rounds, next to torch's copy and in-place mul_.

    python3 bench/qknorm_packed_probe.py [--rounds=N] [--n=8192,16384]
"""
import json
import random
import statistics
import sys

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from cute_kernels.kernels import qknorm as mod
from cute_kernels.runtime.cache import compile_cached
from cute_kernels.runtime.fake import cute_dtype, fake_stream, fake_tensor
from cute_kernels.runtime.timing import copy_bandwidth_gbps
from qknorm_sweep import bits_equal, time_rounds


@dsl_user_op
def opaque_b32(x, *, loc=None, ip=None):
    return Int32(llvm.inline_asm(Int32.mlir_type, [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
                                 has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


class PackedKernel(mod.QKNormKernel):
    @cute.jit
    def normalize(self, mX, mW, part: cutlass.Constexpr, dim: cutlass.Constexpr, tidx, bidx, n, eps, sRed,
                  warp_base: cutlass.Constexpr, barrier_id: cutlass.Constexpr):
        tXgX, tXrX, tXrW, row_ok, col_ok = self.load_rows(mX, mW, part, tidx, bidx, n)
        ss = self.row_sum_of_squares(tXrX, part, tidx, sRed, warp_base, barrier_id)
        words = cute.recast_tensor(tXrX, Int32)
        for i in cutlass.range_constexpr(cute.size(words)):
            words[i] = opaque_b32(words[i])
        scale = cute.math.rsqrt(ss * Float32(1.0 / dim) + eps, fastmath=True)
        self.scale_and_store(tXgX, tXrX, tXrW, scale, row_ok, col_ok, part)


def compile_packed(dtype, qd, kd):
    cfg = mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=mod.DEFAULT_TUNING)
    def build():
        vec = mod.vec_elems(dtype)
        n = cute.sym_int()
        sq, sk = cute.sym_int(divisibility=vec), cute.sym_int(divisibility=vec)
        return PackedKernel(cute_dtype(dtype), cfg), (
            fake_tensor(dtype, (n, qd), stride=(sq, 1)), fake_tensor(dtype, (n, kd), stride=(sk, 1)),
            fake_tensor(dtype, (qd,)), fake_tensor(dtype, (kd,)), Float32(1e-6), fake_stream())
    return compile_cached("qknorm_packed_probe", (str(dtype), qd, kd), build)

def main(argv):
    rounds, ns = 7, (8192, 16384)
    for a in argv:
        if a.startswith("--rounds="):
            rounds = int(a.split("=", 1)[1])
        elif a.startswith("--n="):
            ns = tuple(int(x) for x in a.split("=", 1)[1].split(","))
        else:
            raise SystemExit(f"unknown argument {a!r}\n{__doc__}")
    dtype = torch.bfloat16
    bw = copy_bandwidth_gbps()
    print(json.dumps(dict(copy_gbps=round(bw, 1), rounds=rounds)), flush=True)
    rng = random.Random(0)
    for qd, kd in ((6144, 1024), (4096, 1024)):
        fns = {"per_token": mod._compile(dtype, qd, kd), "packed": compile_packed(dtype, qd, kd)}
        for n in ns:
            q = torch.randn(n, qd, device="cuda", dtype=dtype)
            k = torch.randn(n, kd, device="cuda", dtype=dtype)
            wq = torch.empty(qd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
            wk = torch.empty(kd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
            print(json.dumps(dict(qk=[qd, kd], n=n, bits_equal=bits_equal(fns, q, k, wq, wk))), flush=True)
            wq.fill_(1)
            wk.fill_(1)
            q2, k2 = torch.empty_like(q), torch.empty_like(k)
            calls = {name: (lambda fn=fn: fn(q, k, wq, wk, 1e-6)) for name, fn in fns.items()}
            calls["torch_copy"] = lambda: (q2.copy_(q), k2.copy_(k))
            calls["torch_scalar_mul_"] = lambda: (q.mul_(1.0), k.mul_(1.0))
            times = time_rounds(calls, rounds, rng)
            print(json.dumps(dict(qk=[qd, kd], n=n, us={m: statistics.median(v) for m, v in times.items()},
                                  all=times)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
