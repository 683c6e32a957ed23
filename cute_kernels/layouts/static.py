"""Static CuTe layouts evaluated on the CPU: trace a DSL builder, keep its shape/stride/swizzle.

A CuTe-DSL layout only exists while a ``@cute.jit`` function is being traced (calling
``cute.make_layout`` from plain Python raises ``CALL_OUTSIDE_JIT``).  :func:`trace` runs a builder
inside a throw-away jit function (a plain call: no kernel, no GPU), and turns each static
``Layout`` / ``ComposedLayout`` it returns into a :class:`StaticLayout`: plain nested tuples plus
the swizzle's three numbers, which numpy then evaluates for whole tiles at once.
:func:`dsl_evaluate` asks the DSL itself for the values (slower: one traced op per coordinate);
the tests check that both agree.

Swizzles, two readings (see CuTe's ``swizzle_ptr``):

* *functional*: ``L(c) = swizzle(offset + outer(c))`` in element units; this is what the DSL
  returns when a ComposedLayout is called on a coordinate.
* *pointer* (what a Hopper kernel does): the kernel splits the ComposedLayout into
  ``outer`` (element offsets) and ``inner`` (a swizzle attached to the shared-memory pointer,
  ``get_tensor(layout.outer, swizzle=layout.inner)``), and the swizzle XORs bits of the **byte
  address**.  ``Swizzle<3,4,3>`` is then the 128-byte TMA/WGMMA swizzle: bits [4, 7) of the byte
  address (the 16-byte chunk within a 128-byte row) ^= bits [7, 10) (the row within 8 rows).
  The buffer must be 1024-byte aligned for the two readings of rows to line up (the kernels align
  their smem buffers to 1024 B).  :meth:`StaticLayout.byte_offsets` uses this reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np


# ---------------------------------------------------------------------------- int tuples
def flatten(t) -> tuple:
    """Flatten a nested int tuple (CuTe ``flatten``)."""
    if isinstance(t, (tuple, list)):
        return tuple(x for e in t for x in flatten(e))
    return (t,)


def size(t) -> int:
    """Product of a nested int tuple (CuTe ``size`` of a shape)."""
    return int(np.prod(flatten(t), dtype=np.int64)) if flatten(t) else 1


def fmt_int_tuple(t) -> str:
    if isinstance(t, (tuple, list)):
        return "(" + ",".join(fmt_int_tuple(e) for e in t) + ")"
    return str(t)


# ---------------------------------------------------------------------------- argument checks
# whole-byte element sizes a shared-memory tile can hold (fp8/int8, bf16/fp16, fp32, fp64); sub-byte
# types are not modelled
ELEM_BYTES = (1, 2, 4, 8)


def require_int(name: str, value, minimum: Optional[int] = None) -> int:
    """``value`` as an int: ``TypeError`` naming ``name`` for anything but an integer (a bool too),
    ``ValueError`` for a value below ``minimum``."""
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r}: expected {expected}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value}: expected {expected}")
    return int(value)


def require_one_of(name: str, value, choices: tuple, what: str) -> int:
    """``value`` as an int in ``choices``: ``TypeError`` naming ``name`` for anything but an integer (a bool
    too), ``ValueError`` for another integer; ``what`` says what the number counts."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r}: expected {what}, one of {choices}")
    if value not in choices:
        raise ValueError(f"{name}={value}: expected {what}, one of {choices}")
    return int(value)


def check_elem_bytes(elem_bytes, name: str = "elem_bytes") -> int:
    """``elem_bytes`` as an int, one of :data:`ELEM_BYTES` (``TypeError``/``ValueError`` naming ``name``)."""
    return require_one_of(name, elem_bytes, ELEM_BYTES, "bytes per element (fp8/int8, bf16/fp16, fp32, fp64)")


@dataclass(frozen=True)
class SwizzleSpec:
    """``Swizzle<bits, base, shift>``: ``y ^ ((y >> shift) & (mask << base))``, mask = 2^bits - 1."""

    bits: int
    base: int
    shift: int

    def __post_init__(self):
        for name in ("bits", "base", "shift"):
            require_int(f"SwizzleSpec.{name}", getattr(self, name), minimum=0)

    def __call__(self, y):
        if self.bits == 0:
            return y
        mask = ((1 << self.bits) - 1) << (self.base + self.shift)
        return y ^ ((y & mask) >> self.shift)

    @property
    def name(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"

    @property
    def byte_swizzle_name(self) -> str:
        """Hopper TMA/WGMMA name of this swizzle read on byte addresses (16-byte base)."""
        if self.base == 4 and self.shift == 3:
            return {0: "none (interleave)", 1: "32B", 2: "64B", 3: "128B"}.get(self.bits, self.name)
        return self.name


@dataclass(frozen=True)
class StaticLayout:
    """A static CuTe layout ``(swizzle o offset o) shape:stride`` as plain Python data.

    ``shape``/``stride`` are nested int tuples (the outer layout of a ComposedLayout);
    ``swizzle`` is None for a plain Layout.  ``name`` is a label for pictures and reports.
    """

    shape: Any
    stride: Any
    swizzle: Optional[SwizzleSpec] = None
    offset: int = 0
    name: str = ""

    def __post_init__(self):
        """``ValueError`` where ``shape`` and ``stride`` are not congruent (the same nesting: a stride per
        shape mode) or a size is below 1; ``TypeError`` for entries that are not integers."""
        def congruent(sh, st) -> bool:
            if isinstance(sh, (tuple, list)):
                return isinstance(st, (tuple, list)) and len(sh) == len(st) and all(map(congruent, sh, st))
            return not isinstance(st, (tuple, list))

        if not congruent(self.shape, self.stride):
            raise ValueError(f"StaticLayout: shape {self.shape} and stride {self.stride} are not congruent "
                             "(one stride per shape mode, nested alike)")
        for i, n in enumerate(flatten(self.shape)):
            require_int(f"shape entry {i}", n, minimum=1)
        for i, d in enumerate(flatten(self.stride)):
            require_int(f"stride entry {i}", d)
        require_int("offset", self.offset)

    # -- CuTe-like queries
    @property
    def rank(self) -> int:
        return len(self.shape) if isinstance(self.shape, tuple) else 1

    def mode(self, i: int) -> "StaticLayout":
        """Top-level mode ``i`` (without the swizzle)."""
        if not isinstance(self.shape, tuple):
            if i:
                raise IndexError(i)
            return StaticLayout(self.shape, self.stride)
        return StaticLayout(self.shape[i], self.stride[i])

    @property
    def size(self) -> int:
        return size(self.shape)

    @property
    def cosize(self) -> int:
        """1 + the largest offset of the outer layout (elements of storage it spans)."""
        return 1 + sum((s - 1) * abs(d) for s, d in zip(flatten(self.shape), flatten(self.stride)))

    @property
    def dims(self) -> tuple:
        """Size of each top-level mode (CuTe ``product_each``)."""
        if not isinstance(self.shape, tuple):
            return (self.shape,)
        return tuple(size(m) for m in self.shape)

    def __str__(self) -> str:
        lay = f"{fmt_int_tuple(self.shape)}:{fmt_int_tuple(self.stride)}"
        if self.swizzle is None:
            return lay
        return f"S<{self.swizzle.bits},{self.swizzle.base},{self.swizzle.shift}> o {self.offset} o {lay}"

    # -- evaluation
    def outer_offsets(self) -> np.ndarray:
        """Outer-layout offsets (elements, before any swizzle) as an array shaped like ``dims``.

        Entry ``[c0, c1, ...]`` holds the offset of the coordinate whose top-level mode ``k`` has
        1-D index ``ck`` (each mode's own sub-modes in CuTe's colexicographic order).
        """
        modes = [self.mode(k) for k in range(self.rank)]
        out = np.zeros(self.dims, dtype=np.int64)
        for k, m in enumerate(modes):
            idx = np.arange(m.size, dtype=np.int64)
            off = np.zeros_like(idx)
            div = 1
            for s, d in zip(flatten(m.shape), flatten(m.stride)):
                off += (idx // div) % s * d
                div *= s
            shape = [1] * len(modes)
            shape[k] = m.size
            out = out + off.reshape(shape)
        return out

    def offsets(self) -> np.ndarray:
        """Functional values ``L(c)`` in elements (the swizzle applied to element offsets), as the DSL
        returns them when calling the layout."""
        y = self.outer_offsets() + self.offset
        return self.swizzle(y) if self.swizzle is not None else y

    def byte_offsets(self, elem_bytes: int) -> np.ndarray:
        """Shared-memory byte offsets as a Hopper kernel addresses them: the outer layout in elements
        times ``elem_bytes``, then the swizzle on the byte address (pointer swizzle, 1024 B-aligned base).
        ``elem_bytes`` must be one of :data:`ELEM_BYTES` (``ValueError``/``TypeError`` otherwise) and fill the
        rows of a Hopper swizzle atom the way the layout's own element size does (see :func:`check_swizzle_atom`)."""
        elem_bytes = check_elem_bytes(elem_bytes)
        outer = self.outer_offsets()
        check_swizzle_atom(self, elem_bytes, f"elem_bytes={elem_bytes}", outer)
        y = (outer + self.offset) * elem_bytes
        return self.swizzle(y) if self.swizzle is not None else y

    def unswizzled(self) -> "StaticLayout":
        return StaticLayout(self.shape, self.stride, None, self.offset, (self.name + " (no swizzle)").strip())

    def named(self, name: str) -> "StaticLayout":
        return StaticLayout(self.shape, self.stride, self.swizzle, self.offset, name)


def check_swizzle_atom(layout: StaticLayout, elem_bytes: int, given: str, outer: Optional[np.ndarray] = None) -> None:
    """``ValueError`` when ``elem_bytes``-byte elements do not fill the rows of ``layout``'s Hopper swizzle
    atom: such an atom's rows are ``16 << bits`` bytes (128 for the 128B swizzle, 16 for the interleave), so in
    a K-major tile row 1 starts ``(16 << bits) / elem_bytes`` elements after row 0 (column 1 in an MN-major
    one), which fixes the element size the layout was built for; read with another, its byte addresses, banks
    and TMA boxes would be another layout's.  Not checked (nothing to read it from): a layout without a
    Hopper swizzle, of rank 1 or one row or column, or with neither mode contiguous.  ``given`` names the
    caller's argument in the message (``"elem_bytes=4"``, ``"dtype='fp32'"``); ``outer``: the layout's
    :meth:`StaticLayout.outer_offsets` where the caller has them already."""
    sw = layout.swizzle
    if sw is None or (sw.base, sw.shift) != (4, 3) or layout.rank < 2 or min(layout.dims[:2]) < 2:
        return
    outer = layout.outer_offsets() if outer is None else outer
    corner = outer[(slice(0, 2), slice(0, 2)) + (0,) * (layout.rank - 2)]
    corner = corner - corner[0, 0]
    if corner[0, 1] == 1:  # K-major: a row of the tile is a row of the atom
        atom_row_elems = int(corner[1, 0])
    elif corner[1, 0] == 1:  # MN-major: a column is
        atom_row_elems = int(corner[0, 1])
    else:
        return
    atom_row_bytes = 16 << sw.bits
    if atom_row_elems * elem_bytes != atom_row_bytes:
        exact = atom_row_elems > 0 and atom_row_bytes % atom_row_elems == 0
        implied = f"{atom_row_bytes // atom_row_elems}-byte" if exact else "other"
        raise ValueError(f"{given} does not match {layout.name or layout}: its {sw.byte_swizzle_name} swizzle atom "
                         f"rows ({atom_row_bytes} B) hold {atom_row_elems} elements, "
                         f"i.e. {implied} elements; pass the layout's own element size")


def row_major(rows: int, cols: int, name: str = "") -> StaticLayout:
    """Plain ``(rows, cols):(cols, 1)`` layout (no swizzle), built in Python."""
    return StaticLayout((rows, cols), (cols, 1), None, 0, name or f"row-major {rows}x{cols}")


# ---------------------------------------------------------------------------- DSL bridge
def _from_dsl(obj, name: str = "") -> StaticLayout:
    import cutlass.cute as cute

    if not cute.is_static(obj):
        raise ValueError(f"layout {obj} is not static: only static layouts can be evaluated on the CPU")
    if hasattr(obj, "inner") and hasattr(obj, "outer"):
        sw = obj.inner
        spec = SwizzleSpec(int(sw.num_bits), int(sw.num_base), int(sw.num_shift))
        outer = obj.outer
        return StaticLayout(_py(outer.shape), _py(outer.stride), spec, int(obj.offset), name)
    return StaticLayout(_py(obj.shape), _py(obj.stride), None, 0, name)


def _py(t):
    if isinstance(t, (tuple, list)):
        return tuple(_py(e) for e in t)
    return int(t)


_PLAIN = (int, float, str, bool, type(None))


def _convert(value, name=""):
    """Convert what a builder returned: a layout, or a dict/list/tuple of them; plain Python values (int,
    float, str, bool, None) are kept.  Any other object (a DSL tensor, MMA or copy atom, ...) lives only
    inside the trace and would crash the process if used after it: ``TypeError``."""
    import cutlass.cute as cute

    if isinstance(value, dict):
        return {k: _convert(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_convert(v, name) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (cute.Layout, cute.ComposedLayout)):
        return _from_dsl(value, name)
    if isinstance(value, _PLAIN):
        return value
    raise TypeError(f"trace: the builder returned a {type(value).__name__}{f' ({name})' if name else ''}, which "
                    "exists only inside the DSL's trace; return layouts (or dicts, lists or tuples of them) and "
                    "plain Python values")


def trace(builder: Callable[[], Any]) -> Any:
    """Run ``builder()`` inside a ``@cute.jit`` function (CPU, no GPU) and return its layouts as
    :class:`StaticLayout` (a layout, or a dict/list/tuple of layouts; int, float, str, bool and None pass
    through; any other DSL object raises ``TypeError``: it cannot outlive the trace).

    ``builder`` may call any DSL layout helper (``cute.make_layout``, ``tile_to_shape``,
    ``warpgroup.make_smem_layout_atom``, a kernel module's own layout function, ...).
    Raises ``ValueError`` for a dynamic layout.
    """
    import cutlass.cute as cute

    box: dict = {}

    @cute.jit
    def _trace():
        box["value"] = _convert(builder())

    _trace()
    return box["value"]


def dsl_evaluate(builder: Callable[[], Any], coords) -> list[int]:
    """Values of the layout ``builder()`` at ``coords`` as the DSL computes them (functional reading),
    one traced call per coordinate.  For cross-checking :meth:`StaticLayout.offsets`."""
    import cutlass.cute as cute

    box: dict = {}

    @cute.jit
    def _eval():
        lay = builder()
        box["values"] = [int(lay(c)) for c in coords]

    _eval()
    return box["values"]
