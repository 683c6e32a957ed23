"""Small Hopper (sm_90) building blocks shared by the kernels: swizzled smem layouts, WGMMA
accumulator views, the WGMMA k-loop, and tensor views.

One definition each, used by the ranker forward and backward and by ``cute_kernels.layouts``
(so a picture shows the layout the kernel compiles with).
"""

from __future__ import annotations

from typing import Optional

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

# soft_sign's argument is clamped to +-this (sign kept, NaN kept) before 1 / (1 + |x|): below 2**126, so the
# reciprocal stays a normal float32 (``rcp.approx.ftz`` flushes smaller results to 0) and x = +-inf gives +-1
SOFT_SIGN_CLAMP = 2.0**100


def max_registers_per_thread(threads: int) -> int:
    """The most registers a thread of a ``threads``-thread CTA gets at one CTA per SM: an SM's 65536 registers are
    four sub-partitions of 16384, and a CTA's warps are spread over them, so the sub-partition holding
    ``ceil(warps / 4)`` of its warps sets the cap: ``16384 / (32 * ceil(warps / 4))``, rounded down to a multiple of
    8, at most 248 (255 rounded).  ``65536 / threads`` overstates it unless ``threads`` is a multiple of 128: 544
    threads get 96, not 120 (ptxas capped such a CTA at 96 registers and it spilled)."""
    warps_per_subpartition = -(-threads // 128)
    return min(248, 16384 // (32 * warps_per_subpartition) // 8 * 8)


def register_pool(threads: int) -> int:
    """Registers a CTA of ``threads`` threads (whole warpgroups) owns for ``setmaxnreg`` to redistribute: the
    launch gives each thread :func:`max_registers_per_thread`, so the pool is ``threads`` times that (64512
    for 384 threads), not 65536.  A split that asks for more makes ``setmaxnreg.inc`` retry forever (a hang)."""
    return threads * max_registers_per_thread(threads)


def check_register_split(producer_regs: int, consumer_regs: int, consumer_wgs: int) -> None:
    """``ValueError`` unless one producer warpgroup at ``producer_regs`` and ``consumer_wgs`` consumer
    warpgroups at ``consumer_regs`` fit the CTA's register pool (see :func:`register_pool`), each count
    is one ``setmaxnreg`` takes (a multiple of 8 in [24, 256]), and the producer gets no more than a consumer:
    ptxas refuses a ``setmaxnreg.dec`` above the program's largest count (C7406)."""
    for name, regs in (("producer_regs", producer_regs), ("consumer/MMA regs", consumer_regs)):
        if regs % 8 or not 24 <= regs <= 256:
            raise ValueError(f"{name}={regs}: setmaxnreg takes a multiple of 8 in [24, 256]")
    if producer_regs > consumer_regs:
        raise ValueError(f"register split {producer_regs}/{consumer_regs}: the producer warpgroup must not get "
                         "more registers than a consumer/MMA warpgroup (its setmaxnreg.dec would raise the count)")
    threads = 128 * (1 + consumer_wgs)
    need = 128 * producer_regs + 128 * consumer_wgs * consumer_regs
    if need > register_pool(threads):
        raise ValueError(f"register split {producer_regs}/{consumer_regs} needs {need} registers; a CTA of "
                         f"{threads} threads has {register_pool(threads)} for setmaxnreg to hand out")


@dsl_user_op
def clamp_magnitude(x, bound: float, *, loc=None, ip=None) -> Float32:
    """``sign(x) * min(|x|, bound)`` for ``bound > 0``, NaN kept: one ``min.NaN.xorsign.abs.f32`` (sm_86+; the
    sign of the result is x's sign xor bound's, i.e. x's)."""
    return Float32(llvm.inline_asm(
        Float32.mlir_type, [Float32(x).ir_value(loc=loc, ip=ip), Float32(bound).ir_value(loc=loc, ip=ip)],
        "min.NaN.xorsign.abs.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


def soft_sign_unit(x):
    """``(x / (1 + |x|), 1 / (1 + |x|))`` in float32 for every x: the ranker's soft_sign cap in units of
    the cap and its slope's root.  ``x`` is first clamped to ``+-SOFT_SIGN_CLAMP`` (:func:`clamp_magnitude`), which
    changes no result below it and keeps the reciprocal normal above it: ``+-inf`` and ``|x| > 2**126`` give
    ``+-1`` and a slope of 0, not NaN and 0 (``rcp.approx.ftz`` of ``1 + |x| > 2**126`` flushes to 0).  Call it while
    tracing a kernel (DSL values in and out)."""
    xc = clamp_magnitude(x, SOFT_SIGN_CLAMP)
    inv = cute.arch.rcp_approx(1.0 + cute.math.abs(xc))
    return xc * inv, inv


def cap_and_slope(s, softmax_scale, cap, cap_method: str):
    """Raw score ``q.k`` -> (the forward's capped score in the units of ``scale_log2``, ``cap'``):
    no cap: ``(s, 1)``; tanh: ``(tanh(x), 1 - tanh(x)^2)``; soft_sign: ``(x / (1 + |x|), 1 / (1 + |x|)^2)``
    with ``x = softmax_scale * s / cap`` (the forward's ``scale_log2`` carries ``cap * log2(e)``).  The forward's
    self term and the backward's mainloop and postprocess all cap scores here (the forward's tiles through
    ``RankerAttentionFwd.apply_cap``, the same math); ``cap_method`` is static.  Call it while tracing a kernel."""
    t = s
    dcap = Float32(1.0)
    if cap_method == "tanh":
        t = cute.math.tanh(s * (softmax_scale / cap), fastmath=True)
        dcap = 1.0 - t * t
    elif cap_method == "soft_sign":
        t, inv = soft_sign_unit(s * (softmax_scale / cap))
        dcap = inv * inv
    return t, dcap


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


@cute.jit
def store_rows_predicated(tiles, num_threads: cutlass.Constexpr, tidx, row_lo, seqlen):
    """Copy each ``(sX, gX)`` of ``tiles`` (a ``(rows, cols)`` 16-bit tile in shared memory, and its global
    destination of the same shape; all tiles of one shape) by ``num_threads`` threads with 16-byte vectors,
    skipping rows at or past a sequence's end (``row_lo + row >= seqlen``): the variable-length epilogues'
    store, where a TMA store of the whole tile would write into the next sequence.  Each thread reads its
    vectors of a tile from ``sX``, then stores its rows that pass."""
    s0 = tiles[0][0]
    vec = 128 // s0.element_type.width
    rows, cols = cute.size(s0, mode=[0]), cute.size(s0, mode=[1]) // vec
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), s0.element_type, num_bits_per_copy=128)
    thr_copy = cute.make_tiled_copy_tv(atom, cute.make_ordered_layout((num_threads // cols, cols), order=(1, 0)),
                                       cute.make_layout((1, vec))).get_slice(tidx)
    tXcX = thr_copy.partition_S(cute.make_identity_tensor((rows, cols * vec)))
    for sX, gX in tiles:
        tXsX = thr_copy.partition_S(sX)
        tXgX = thr_copy.partition_D(gX)
        tXrX = cute.make_rmem_tensor_like(tXsX, sX.element_type)
        cute.autovec_copy(tXsX, tXrX)
        for m in cutlass.range_constexpr(cute.size(tXrX.shape[1])):
            if row_lo + tXcX[0, m, 0][0] < seqlen:
                cute.copy(atom, tXrX[None, m, None], tXgX[None, m, None])
