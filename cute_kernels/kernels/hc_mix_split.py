"""hc_fn split into three bf16 pieces, the B operand of :mod:`.hc_mix_tma`'s bf16x3 WGMMA (seed 001).

``pieces [72, K]`` bf16, row ``24 p + n`` = piece ``p`` (lo, mid, hi) of ``hc_fn[n]``: hi = rn(w),
mid = rn(w - hi), lo = rn(w - hi - mid) (round to nearest even; both differences are exact), the values
of :func:`.hc_mix.split_pieces` (the torch form, 8 launches) and of the walk's in-register split
(:func:`.hc_mix._split3_bf16x2`, which this kernel calls).

``hc_mix_sinkhorn(method="tma")`` runs this kernel on every call that passes the float32 hc_fn, so a
weight changed in any way (an optimizer step, fused or not; a broadcast; a write through ``.data`` or a
raw pointer) is always seen, in CUDA graphs too; the pieces made once by :func:`.hc_mix.hc_mix_split_weights`
skip it (frozen weights: serving).  Until session 34 a cache keyed on the tensor's version counter stood in
its place; fused optimizers and collectives do not bump that counter, and a captured graph could read an
evicted entry.

Design: one thread per 8 consecutive columns of a row (two 16-byte loads, three 16-byte stores), grid
``(ceil(K / (8 * threads)), 24)``.  The kernel triggers its dependents as it starts
(``griddepcontrol.launch_dependents``): the TMA walk launched next is a programmatic dependent launch,
so its launch and prologue overlap this kernel, and its ``griddepcontrol.wait`` holds its first load
until this grid has completed and flushed.  Bytes: 24 K x 4 read + 72 K x 2 written = 240 K (4.9 MB at
K = 20480, about 1.2 us at the H200's copy rate).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32

from ..runtime.cache import compile_cached
from ..runtime.fake import fake_stream, fake_tensor
from ..runtime.validate import check_config_fields
from .hc_mix import K_ALIGN, N_MIX, N_PIECES, _split3_bf16x2

NAME = "hc_mix_split"
VEC = 8  # columns per thread: 32 bytes of fp32 in, 16 bytes of bf16 out per piece


@dataclass(frozen=True)
class HcSplitConfig:
    """``threads`` per CTA (each thread splits 8 columns of one row)."""

    threads: int = 128

    def validate(self) -> None:
        """``TypeError`` for a field that is not an int, ``ValueError`` (with the rule) for a value out of range."""
        check_config_fields(self)
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads={self.threads}: must be a multiple of 32 in [32, 1024]")


class HcSplitKernel:
    """``mW [24, K]`` float32 (row stride a multiple of 4) -> ``mP [72, K]`` bf16 pieces (compact)."""

    def __init__(self, config: HcSplitConfig):
        config.validate()
        self.config = config

    @cute.jit
    def __call__(self, mW: cute.Tensor, mP: cute.Tensor, stream):
        cols_per_cta = self.config.threads * VEC
        grid_x = (mW.shape[1] + (cols_per_cta - 1)) // cols_per_cta
        self.kernel(mW, mP).launch(grid=[grid_x, N_MIX, 1], block=[self.config.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mW: cute.Tensor, mP: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, row, _ = cute.arch.block_idx()
        cute.arch.griddepcontrol_launch_dependents()  # the walk (a PDL launch) may start its prologue
        chunk = bidx * self.config.threads + tidx  # this thread's 8 columns: [8 chunk, 8 chunk + 8)
        if chunk * VEC < mW.shape[1]:  # (K is a multiple of 64: a chunk is in range whole or not at all)
            rW = self.load_row_chunk(mW, row, chunk)
            rLo, rMid, rHi = [cute.make_rmem_tensor(VEC // 2, Int32) for _ in range(N_PIECES)]
            for j in cutlass.range_constexpr(VEC // 2):
                rLo[j], rMid[j], rHi[j] = _split3_bf16x2(rW[2 * j], rW[2 * j + 1])
            for piece, rPiece in enumerate((rLo, rMid, rHi)):
                self.store_piece_chunk(mP, piece * N_MIX + row, chunk, rPiece)

    @cute.jit
    def load_row_chunk(self, mW: cute.Tensor, row, chunk) -> cute.Tensor:
        """Columns ``[8 chunk, 8 chunk + 8)`` of hc_fn's row ``row`` as 8 float32 registers (two 16-byte loads)."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        gW = cute.zipped_divide(cute.local_tile(mW[row, None], (VEC,), (chunk,)), (4,))  # ((4), (2))
        rW = cute.make_rmem_tensor(VEC, Float32)
        rW4 = cute.zipped_divide(rW, (4,))
        for h in cutlass.range_constexpr(2):
            cute.copy(atom, gW[None, h], rW4[None, h])
        return rW

    @cute.jit
    def store_piece_chunk(self, mP: cute.Tensor, prow, chunk, rPiece: cute.Tensor):
        """8 bf16 of one piece (4 packed bf16x2 registers) to row ``prow``, columns ``[8 chunk, 8 chunk + 8)``
        (one 16-byte store)."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        gP = cute.local_tile(mP[prow, None], (VEC,), (chunk,))
        cute.copy(atom, cute.recast_tensor(rPiece, BFloat16), gP)


def _compile(config: HcSplitConfig = HcSplitConfig()):
    def build():
        k = cute.sym_int(divisibility=K_ALIGN)
        # explicit row-major strides (a compact fake tensor without strides is column-major); hc_fn's row
        # stride a multiple of 4 elements (16 bytes), the pieces compact
        w = fake_tensor(torch.float32, (N_MIX, k), stride=(cute.sym_int(divisibility=4), 1))
        p = fake_tensor(torch.bfloat16, (N_PIECES * N_MIX, k), stride=(k, 1))
        return HcSplitKernel(config), (w, p, fake_stream())

    return compile_cached(NAME, config, build)


def split(hc_fn: torch.Tensor) -> torch.Tensor:
    """The pieces ``[72, K]`` bf16 (new, contiguous) of a validated float32 ``hc_fn [24, K]`` on a CUDA device
    (K a multiple of 64, last dim contiguous, 16-byte aligned rows), made on the current stream."""
    pieces = hc_fn.new_empty((N_PIECES * N_MIX, hc_fn.shape[1]), dtype=torch.bfloat16)
    _compile()(hc_fn, pieces)
    return pieces
