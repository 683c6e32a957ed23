"""Small Hopper (sm_90) building blocks shared by the kernels: swizzled smem layouts, WGMMA
accumulator views, the WGMMA k-loop, and tensor views.

One definition each, used by the ranker forward and backward and by ``cute_kernels.layouts``
(so a picture shows the layout the kernel compiles with).
"""

from __future__ import annotations

import struct
from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum


def register_pool(threads: int) -> int:
    """Registers a CTA of ``threads`` threads owns for ``setmaxnreg`` to redistribute: the launch gives each
    thread the per-thread cap of one CTA per SM (65536 / threads, rounded down to a multiple of 8, at most
    255 rounded: 248), so the pool is ``threads * cap`` (64512 for 384 threads), not 65536.  A split
    that asks for more makes ``setmaxnreg.inc`` retry forever (a hang)."""
    cap = min(248, (65536 // threads) // 8 * 8)
    return threads * cap


def check_register_split(producer_regs: int, consumer_regs: int, consumer_wgs: int) -> None:
    """``ValueError`` unless one producer warpgroup at ``producer_regs`` and ``consumer_wgs`` consumer
    warpgroups at ``consumer_regs`` fit the CTA's register pool (see :func:`register_pool`)."""
    threads = 128 * (1 + consumer_wgs)
    need = 128 * producer_regs + 128 * consumer_wgs * consumer_regs
    if need > register_pool(threads):
        raise ValueError(f"register split {producer_regs}/{consumer_regs} needs {need} registers; a CTA of "
                         f"{threads} threads has {register_pool(threads)} for setmaxnreg to hand out")


def smem_layout(dtype, rows: int, cols: int, stages: Optional[int] = None):
    """K-major swizzled smem layout (rows, cols[, stages]) with the widest swizzle the row allows
    (128 B for 64 bf16 columns): what WGMMA operands and TMA boxes of a row-major tile use."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, cols), dtype)
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), order=(0, 1))
    return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))


def select_modes(t: cute.Tensor, modes) -> cute.Tensor:
    """``t`` restricted to (and reordered by) ``modes``."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=modes))


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of an smem tensor (e.g. V -> V^T for the PV GEMM's B operand)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


def acc_mn_layout(acc_layout: cute.Layout) -> cute.Layout:
    """WGMMA accumulator ((2, 2, N/8), M, N) -> ((2, M), (2, N/8, N)): rows x columns view."""
    lay = cute.make_layout(acc_layout.shape)
    shape = ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[0][2], lay.shape[2]))
    stride = ((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[0][2], lay.stride[2]))
    return cute.composition(acc_layout, cute.make_layout(shape, stride=stride))


def acc_mn(acc: cute.Tensor) -> cute.Tensor:
    """A WGMMA accumulator fragment viewed as (rows, columns) of this thread."""
    return cute.make_tensor(acc.iterator, acc_mn_layout(acc.layout))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator ((2, 2, N/8), M, N) as the RS-WGMMA A operand ((2, 2, 2), M, (N/16, N))."""
    lay = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    op = cute.make_layout(
        ((lay.shape[0][0], lay.shape[0][1], lay.shape[0][2][0]), lay.shape[1], (lay.shape[0][2][1], lay.shape[2])),
        stride=((lay.stride[0][0], lay.stride[0][1], lay.stride[0][2][0]), lay.stride[1],
                (lay.stride[0][2][1], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, op)


def advanced(state):
    """A copy of a pipeline state moved one stage on (assignment keeps it visible to DSL control flow)."""
    nxt = state.clone()
    nxt.advance()
    return nxt


@cute.jit
def wgmma_gemm(tiled_mma, acc, tCrA, tCrB, zero_init: cutlass.Constexpr):
    """Issue ``acc (+)= A B`` over the k-blocks of the partitions as one WGMMA group (not waited on:
    ``warpgroup.wait_group`` by the caller). ``zero_init`` overwrites ``acc`` with the first k-block."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tCrA.shape[2])):
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


# 2^f on [-0.5, 0.5], degree 4, fitted for relative error (max 2.7e-6 in float32 Horner form; the
# MUFU's ex2.approx is ~2.4e-7): coefficients c0 .. c4
EXP2_POLY_VALUES = (0.999999166, 0.69312197, 0.240249813, 0.0559170395, 0.00956051052)


def ptx_f32(value: float) -> str:
    """``value`` rounded to float32, as a PTX hexadecimal float literal (``0fXXXXXXXX``)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]


@cute.jit
def exp2_poly(x: cutlass.Float32) -> cutlass.Float32:
    """``2**x`` for ``x <= 0`` on the FMA and integer pipes instead of the MUFU: x = n + f with n = round(x)
    (by adding and subtracting 1.5 * 2**23) and f in [-0.5, 0.5], 2**f by a degree-4 polynomial, then n
    added to the exponent bits.  ``x < -126`` (and -inf) gives exactly 0.  Relative error <= 3e-6.
    Meant for a fraction of a softmax's exponentials, so that the MUFU (16 results per clock per SM)
    is not the bottleneck, as FlashAttention-4 does on Blackwell."""
    c0, c1, c2, c3, c4 = (ptx_f32(c) for c in EXP2_POLY_VALUES)
    lowest, zero_below, magic = ptx_f32(-127.0), ptx_f32(-126.0), ptx_f32(1.5 * 2**23)
    return cute.arch.inline_ptx(
        "{\n\t.reg .f32 xc, t, r, f, p;\n\t.reg .b32 n, pb;\n\t.reg .pred lo;\n\t"
        f"max.ftz.f32 xc, {{$r0}}, {lowest};\n\t"  # clamp at -127 (keeps n in range; -inf too)
        f"add.rn.ftz.f32 t, xc, {magic};\n\t"  # round(xc) lands in t's low mantissa bits
        f"sub.rn.ftz.f32 r, t, {magic};\n\t"
        "sub.rn.ftz.f32 f, xc, r;\n\t"
        f"fma.rn.ftz.f32 p, f, {c4}, {c3};\n\t"
        f"fma.rn.ftz.f32 p, p, f, {c2};\n\t"
        f"fma.rn.ftz.f32 p, p, f, {c1};\n\t"
        f"fma.rn.ftz.f32 p, p, f, {c0};\n\t"
        "mov.b32 n, t;\n\t"
        "shl.b32 n, n, 23;\n\t"  # round(xc) << 23 (the bits of 1.5 * 2**23 shift out)
        "mov.b32 pb, p;\n\t"
        "add.s32 pb, pb, n;\n\t"
        f"setp.lt.ftz.f32 lo, {{$r0}}, {zero_below};\n\t"  # below -126 the result would be subnormal: 0
        "selp.b32 pb, 0, pb, lo;\n\t"
        "mov.b32 {$w0}, pb;\n\t}\n",
        write_only_types=[cutlass.Float32],
        read_only_args=[x],
    )
