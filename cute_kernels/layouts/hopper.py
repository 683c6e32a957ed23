"""Hopper (sm_90) shared-memory layouts for WGMMA and TMA, built by the DSL's own helpers.

:func:`hopper_smem_layout` builds the layout a Hopper kernel gets from
``cutlass.utils.hopper_helpers.get_smem_layout_atom`` + ``warpgroup.make_smem_layout_atom`` +
``cute.tile_to_shape`` (as CUTLASS's hopper dense GEMM ``make_smem_layout_a/b`` and
FlashAttention-4's sm90 forward do): the widest swizzle (128B, 64B, 32B, none) whose atom row fits
the tile's contiguous extent, tiled over the tile (and stages).
"""

from __future__ import annotations

from typing import Optional

import math

import numpy as np

from .static import ELEM_BYTES, StaticLayout, check_swizzle_atom, require_int, trace

# swizzle name -> SmemLayoutAtomKind suffix
_KINDS = {"128B": "SW128", "64B": "SW64", "32B": "SW32", "none": "INTER"}
_MAJORS = ("K", "row", "MN", "col")


def is_k_major(major) -> bool:
    """True for "K" / "row" (``cols`` contiguous), False for "MN" / "col" (any case); ``TypeError``
    for a non-string, ``ValueError`` for another name."""
    if not isinstance(major, str):
        raise TypeError(f"major={major!r}: expected one of {list(_MAJORS)}")
    if major.upper() not in ("K", "ROW", "MN", "COL"):
        raise ValueError(f"major={major!r}: expected one of {list(_MAJORS)} ('K' = 'row', 'MN' = 'col')")
    return major.upper() in ("K", "ROW")


def cutlass_dtype(dtype):
    """A cutlass Numeric type from a torch dtype, a cutlass type or a short name ("bf16", "fp16", "fp32", "fp8").
    ``TypeError`` for any other dtype or name (bfloat16, float16, float32 and float8_e4m3fn only)."""
    import cutlass

    if isinstance(dtype, type) and issubclass(dtype, cutlass.Numeric):
        return dtype
    names = {
        "bf16": cutlass.BFloat16, "bfloat16": cutlass.BFloat16, "fp16": cutlass.Float16, "float16": cutlass.Float16,
        "half": cutlass.Float16, "fp32": cutlass.Float32, "float32": cutlass.Float32,
        "fp8": cutlass.Float8E4M3FN, "float8_e4m3fn": cutlass.Float8E4M3FN,
    }
    key = str(dtype).replace("torch.", "")
    if key not in names:
        raise TypeError(f"dtype {dtype!r} is not supported: expected bfloat16, float16, float32 or float8_e4m3fn (as a "
                        f"torch dtype or a cutlass Numeric) or one of the names {sorted(names)}")
    return names[key]


def elem_bytes(dtype) -> int:
    """Bytes per element of ``dtype`` (any form :func:`cutlass_dtype` accepts): one of
    :data:`.static.ELEM_BYTES`; ``ValueError`` for a sub-byte type (fp4, fp6, ...), which the
    layouts' byte model does not describe."""
    dt = cutlass_dtype(dtype)
    if dt.width % 8 or dt.width // 8 not in ELEM_BYTES:
        raise ValueError(f"dtype {dt.__name__} ({dt.width} bits): expected a type of {ELEM_BYTES} bytes per element")
    return dt.width // 8


def build_hopper_smem_layout(rows: int, cols: int, dtype, major: str = "K", stages: Optional[int] = None,
                             swizzle: str = "auto"):
    """DSL-side builder (call inside a jit function / :func:`trace`); see :func:`hopper_smem_layout`."""
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup
    from cutlass.tensor_utils import LayoutEnum

    dt = cutlass_dtype(dtype)
    k_major = is_k_major(major)
    if k_major and swizzle == "auto":  # what the kernels use: one definition
        from ..kernels.sm90_helpers import smem_layout

        return smem_layout(dt, rows, cols, stages)
    major_size = cols if k_major else rows
    if swizzle == "auto":
        kind = sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR if k_major else LayoutEnum.COL_MAJOR, dt,
                                               major_size)
    else:
        kind = getattr(warpgroup.SmemLayoutAtomKind, ("K_" if k_major else "MN_") + _KINDS[swizzle])
    atom = warpgroup.make_smem_layout_atom(kind, dt)
    order = (0, 1) if k_major else (1, 0)
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), order=order)
    return cute.tile_to_shape(atom, (rows, cols, stages), order=order + (2,))


def hopper_smem_layout(rows: int, cols: int, dtype, major: str = "K", stages: Optional[int] = None,
                       swizzle: str = "auto", name: str = "") -> StaticLayout:
    """The swizzled smem layout a Hopper WGMMA/TMA kernel uses for a ``rows x cols`` tile.

    Args:
        rows, cols: tile extent in elements; ``(rows, cols)`` is the layout's logical shape.
        dtype: element type (torch dtype, cutlass type, or "bf16"/"fp16"/"fp32"/"fp8").
        major: "K" (or "row": ``cols`` contiguous, a K-major WGMMA operand such as Q or K of
            ``Q K^T``) or "MN" (or "col": ``rows`` contiguous).
        stages: add a third mode of ``stages`` buffers (a pipelined operand).
        swizzle: "auto" (the DSL heuristic: widest that fits), or force "128B"/"64B"/"32B"/"none".
    Returns:
        A :class:`StaticLayout` (swizzle + outer layout) traced from the DSL on the CPU.
    Raises:
        ValueError: the contiguous extent is not a multiple of 16 bytes / the tile not a multiple
        of the swizzle atom (the DSL's own checks); before tracing: ``rows``/``cols`` < 1, ``stages``
        neither None nor >= 1, ``major`` or ``swizzle`` not one of the names above, a sub-byte dtype.
        TypeError: unknown dtype, a non-integer extent, a non-string ``major``.
    """
    rows, cols = require_int("rows", rows, 1), require_int("cols", cols, 1)
    if stages is not None:
        stages = require_int("stages", stages, 1)
    if not isinstance(swizzle, str) or swizzle not in ("auto", *_KINDS):
        raise ValueError(f"swizzle={swizzle!r}: expected 'auto' or one of {list(_KINDS)}")
    major_size = cols if is_k_major(major) else rows
    if (major_size * elem_bytes(dtype)) % 16:
        raise ValueError(f"contiguous extent {major_size} x {elem_bytes(dtype)} B is not a multiple of 16 bytes")
    lay = trace(lambda: build_hopper_smem_layout(rows, cols, dtype, major, stages, swizzle))
    if tuple(lay.dims[:2]) != (rows, cols):  # the DSL tiles the atom over the shape, rounding it up
        atom = lay.swizzle.byte_swizzle_name if lay.swizzle else ""
        raise ValueError(f"a {rows} x {cols} tile is not a whole number of {atom}"
                         f" swizzle atoms (the layout would cover {lay.dims[0]} x {lay.dims[1]}); pick multiples of "
                         "the atom or another swizzle")
    staged = f"x{stages}" if stages else ""
    return lay.named(name or f"{swizzle if swizzle != 'auto' else lay.swizzle.byte_swizzle_name} "
                             f"{major}-major {rows}x{cols}{staged} {cutlass_dtype(dtype).__name__}")


TMA_BOX_MAX = 256  # elements per box dimension (cuTensorMapEncodeTiled's boxDim limit)


def tma_box(layout: StaticLayout, dtype) -> dict:
    """What the TMA copies of a ``(rows, cols)`` K-major shared-memory tile look like.

    A TMA box lands in shared memory densely, row after row: box element ``(r, c)`` of a box
    ``(h, w)`` goes to ``start + r * w + c`` (elements; a 32B/64B/128B swizzle then permutes 16-byte
    chunks of the byte address).  So the box is read off the layout's outer offsets (stage 0):

    * inner extent ``w``: the contiguous run of columns of row 0 (``offset(0, c) = c``); the
      largest divisor of that run (and of ``cols``) that is at most :data:`TMA_BOX_MAX` elements
      and, with a 32B/64B/128B swizzle, at most the swizzle width (a swizzled tile wider than its
      atom is several boxes).  For an interleave ("none") Hopper layout the run is the 16-byte atom
      width: bf16 64 x 24 is ``((8,8),(8,3)):((8,64),(1,512))``, row 1 starts at 8 and column 8 at
      512, so the box is 64 x 8, issued 3 times; a 128B swizzle's run is its 128-byte row;
    * rows ``h``: the run of rows at stride ``w`` (``offset(r, 0) = r * w``), likewise cut to the
      largest divisor of it (and of ``rows``) that is at most :data:`TMA_BOX_MAX`.

    The runs of a ``shape:stride`` layout end at boundaries of its sub-modes, so every other box of
    the ``(rows / h) x (cols / w)`` grid is dense the same way.  This is the box the DSL's
    ``make_tiled_tma_atom`` builds (tested against its atoms, for Hopper K-major layouts of every
    swizzle and for plain ones).  Returns rows, cols, ``box`` = (h, w) in elements, ``boxes`` per tile, bytes
    per tile, swizzle name.  Raises ``ValueError`` for a layout that is not K-major (columns not
    contiguous), for one whose box rows would not be a multiple of 16 bytes (TMA's rule), and for a ``dtype``
    whose element size does not match the layout's (:func:`.static.check_swizzle_atom`).
    """
    eb = elem_bytes(dtype)
    if len(layout.dims) not in (2, 3):
        raise ValueError(f"tma_box describes (rows, cols[, stages]) tiles, got dims {layout.dims}")
    rows, cols = layout.dims[0], layout.dims[1]
    off = layout.outer_offsets()[(slice(None), slice(None)) + (0,) * (layout.rank - 2)]
    off = off - off[0, 0]
    first = off[:2, :2]
    if cols > 1 and first[0, 1] - first[0, 0] != 1:
        raise ValueError(f"tma_box describes K-major tiles (cols contiguous); {layout.name or 'this layout'} is not")
    check_swizzle_atom(layout, eb, f"dtype={dtype!r} ({eb} B elements)")
    sw = layout.swizzle.byte_swizzle_name if layout.swizzle is not None else "none"
    cap = TMA_BOX_MAX
    if sw in ("128B", "64B", "32B"):
        cap = min(cap, {"128B": 128, "64B": 64, "32B": 32}[sw] // eb)
    inner = _largest_divisor(math.gcd(cols, _run(off[0, :], 1)), cap)
    if (inner * eb) % 16:
        raise ValueError(f"no TMA box for {layout.name or layout}: its box rows would be {inner} {dtype} elements "
                         f"({inner * eb} bytes; at most {cap} elements dividing the contiguous columns), and TMA moves "
                         "rows of a multiple of 16 bytes")
    box_rows = _largest_divisor(math.gcd(rows, _run(off[:, 0], inner)), TMA_BOX_MAX)
    return dict(rows=rows, cols=cols, box=(box_rows, inner), boxes=(rows // box_rows) * (cols // inner),
                bytes=rows * cols * eb, swizzle=sw)


def _run(offsets: np.ndarray, stride: int) -> int:
    """Length of the leading run of ``offsets`` at ``stride`` apart from 0 (``offsets[i] == i * stride``)."""
    ok = offsets == np.arange(len(offsets)) * stride
    return len(ok) if ok.all() else int(np.argmin(ok))


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` (>= 1)."""
    return max(d for d in range(1, max(min(n, at_most), 1) + 1) if n % d == 0)
