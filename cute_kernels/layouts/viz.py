"""Pictures of layouts with matplotlib (PNG and SVG; a notebook shows the returned Figure inline).

* :func:`draw_offsets`: a layout as a grid of offsets (colour = offset, the number = offset in elements when
  the grid is small enough to read; pass ``elem_bytes`` for a swizzled layout's real addresses);
* :func:`draw_banks`: a swizzle as a colour map of the shared-memory bank of each element, with the
  16-byte chunk number (``byte offset // 16 % 8``) written in each chunk's first cell;
* :func:`draw_tv`: a thread-value layout as threads over a tile (colour = thread, label T/V);
* :func:`draw_conflicts`: words per bank of one warp-wide access, for one or more layouts.

Every function returns a ``matplotlib.figure.Figure`` and, given ``path`` (with or without a
suffix), writes ``<path>.png`` and ``<path>.svg``.  Figures are built without pyplot, so this
works headless (no display, no GPU).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from .analysis import (BANK_BYTES, NUM_BANKS, AccessPattern, check_coords, check_stage, extents_pair,
                       request_phases, request_wavefronts, stage_slice, thread_addresses)
from .static import StaticLayout, check_elem_bytes, require_int


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(max(w, 3.0), max(h, 2.0)), layout="constrained")


def save(fig, path: Optional[str]) -> list[str]:
    """Write ``fig`` as ``<path>.png`` and ``<path>.svg`` (suffix of ``path`` dropped); returns the files."""
    if not path:
        return []
    base, ext = os.path.splitext(path)
    if ext.lower() not in (".png", ".svg", ".pdf"):
        base = path
    os.makedirs(os.path.dirname(os.path.abspath(base)) or ".", exist_ok=True)
    files = []
    for suffix in (".png", ".svg"):
        fig.savefig(base + suffix, dpi=110)
        files.append(base + suffix)
    return files


def _grid_axes(fig, rows: int, cols: int, title: str):
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("column (contiguous mode)", fontsize=8)
    ax.set_ylabel("row", fontsize=8)
    step_r = max(1, rows // 16)
    step_c = max(1, cols // 16)
    ax.set_xticks(range(0, cols, step_c))
    ax.set_yticks(range(0, rows, step_r))
    ax.tick_params(labelsize=6)
    return ax


def _cell_size(rows: int, cols: int, annotate: bool) -> float:
    if annotate:
        return 0.42
    return float(np.clip(9.0 / max(rows, cols), 0.06, 0.3))


def _check_drawable(layout: StaticLayout, stage: Optional[int]) -> int:
    """The stage to draw (:func:`.analysis.check_stage`: rank 2 or staged rank 3; a rank-1 layout is
    drawn as one row, without stages)."""
    if len(layout.dims) == 1:
        layout = StaticLayout((1, layout.shape), (0, layout.stride), name=layout.name)
    return check_stage(layout, stage)


def _table2d(layout: StaticLayout, values: np.ndarray, stage: Optional[int]) -> np.ndarray:
    values = stage_slice(values, _check_drawable(layout, stage))
    return values[None] if values.ndim == 1 else values


def draw_offsets(layout: StaticLayout, path: Optional[str] = None, elem_bytes: Optional[int] = None,
                 stage: Optional[int] = None, annotate: Optional[bool] = None, title: Optional[str] = None,
                 region: Optional[tuple[int, int]] = None):
    """A layout as a grid of offsets (colour = offset; the number written in each cell when the grid
    has at most 1024 cells; ``region=(rows, cols)`` zooms on the top-left corner).

    With ``elem_bytes`` the offsets are the kernel's swizzled byte addresses divided back into
    elements (:meth:`StaticLayout.byte_offsets`); without it, the functional values ``L(r, c)``.
    ``ValueError`` for ``elem_bytes`` not in :data:`.static.ELEM_BYTES` (or not a swizzled layout's own element
    size: :func:`.static.check_swizzle_atom`), a ``stage`` the layout
    does not have (None or 0 without a stage mode) and a ``region`` that is not two sizes >= 1 (``TypeError``
    for a non-integer size; a region beyond the layout draws it whole).
    """
    if elem_bytes is not None:
        check_elem_bytes(elem_bytes)
    _check_drawable(layout, stage)
    if elem_bytes:
        vals = _table2d(layout, layout.byte_offsets(elem_bytes), stage) // elem_bytes
    else:
        vals = _table2d(layout, layout.offsets(), stage)
    if region is not None:
        r, c = extents_pair("region", region, "(rows, cols)")  # (a picture smaller than it: drawn whole)
        vals = vals[:r, :c]
    rows, cols = vals.shape
    annotate = rows * cols <= 1024 if annotate is None else annotate
    cs = _cell_size(rows, cols, annotate)
    fig = _figure(cols * cs + 1.5, rows * cs + 1.0)
    if title is None:  # (a swizzled layout read without elem_bytes is not the kernel's addressing: say so)
        what = ("functional offsets (swizzle on elements, not the kernel's byte addresses: pass elem_bytes)"
                if layout.swizzle is not None and not elem_bytes else "offsets")
        title = f"{what} of {layout.name or layout}\n{layout}"
    ax = _grid_axes(fig, rows, cols, title)
    im = ax.imshow(vals, cmap="viridis", interpolation="nearest", aspect="equal")
    fig.colorbar(im, ax=ax, label="offset (elements)", shrink=0.6)
    if annotate:
        mid = (vals.max() + vals.min()) / 2
        for r in range(rows):
            for c in range(cols):
                ax.text(c, r, str(vals[r, c]), ha="center", va="center", fontsize=5,
                        color="white" if vals[r, c] < mid else "black")
    save(fig, path)
    return fig


def draw_banks(layout: StaticLayout, elem_bytes: int, path: Optional[str] = None, stage: Optional[int] = None,
               rows: Optional[int] = None, title: Optional[str] = None):
    """A swizzle as a colour map of banks: colour = bank (0..31) of each element's first byte, under the
    kernel's pointer swizzle; each 16-byte chunk's first cell carries its chunk number in the 128-byte
    row (``byte // 16 % 8``).  ``rows`` limits the picture to the first rows (the pattern repeats
    every 8 rows for a 128B swizzle; more rows than the layout has draw it whole).  ``ValueError`` as
    :func:`.analysis.bank_table`, and for ``rows`` below 1 (``TypeError`` for a non-integer)."""
    from matplotlib import colormaps

    elem_bytes = check_elem_bytes(elem_bytes)
    _check_drawable(layout, stage)
    byts = _table2d(layout, layout.byte_offsets(elem_bytes), stage)
    banks = (byts // BANK_BYTES) % NUM_BANKS  # as analysis.bank_table
    if rows is not None:
        rows = require_int("rows", rows, 1)
        banks, byts = banks[:rows], byts[:rows]
    nr, nc = banks.shape
    per_chunk = max(1, 16 // elem_bytes)
    annotate = nr * (nc // per_chunk) <= 1024
    cs = float(np.clip(12.0 / max(nr, nc), 0.08, 0.3))
    fig = _figure(nc * cs + 2.2, nr * cs + 1.0)
    sw = layout.swizzle.byte_swizzle_name if layout.swizzle is not None else "no"
    ax = _grid_axes(fig, nr, nc, title or f"banks of {layout.name or layout} ({sw} swizzle, {elem_bytes} B elements)")
    im = ax.imshow(banks, cmap=colormaps["hsv"].resampled(NUM_BANKS), vmin=-0.5, vmax=NUM_BANKS - 0.5,
                   interpolation="nearest", aspect="equal")
    fig.colorbar(im, ax=ax, label="bank", shrink=0.6, ticks=range(0, NUM_BANKS, 4))
    if annotate:
        for r in range(nr):
            for c in range(0, nc, per_chunk):
                ax.text(c + (per_chunk - 1) / 2, r, str(int(byts[r, c] // 16 % 8)), ha="center", va="center",
                        fontsize=6, color="black")
    save(fig, path)
    return fig


def draw_tv(tv: StaticLayout, tile: tuple[int, int], path: Optional[str] = None, title: Optional[str] = None,
            region: Optional[tuple[int, int]] = None, annotate: Optional[bool] = None):
    """A thread-value layout as threads over an ``(M, N)`` tile (``tv(thread, value)`` = index of a
    column-major tile, as the DSL's ``tv_layout_*`` give it).  Colour = thread; small tiles (or a
    ``region`` of the top-left corner) get "T<thread>/V<value>" labels.  ``ValueError`` for a tile that
    does not hold every index of ``tv`` and a tile or ``region`` that is not two sizes >= 1 (``TypeError`` for
    a non-integer size)."""
    m_, n_ = extents_pair("tile", tile)
    idx = tv.outer_offsets()
    nthr, nval = idx.shape
    if idx.min() < 0 or idx.max() >= m_ * n_:
        raise ValueError(f"{tv.name or 'the TV layout'} {tv} reaches index {int(idx.max())}: beyond the "
                         f"{m_} x {n_} tile ({m_ * n_} elements)")
    owner = np.full((m_, n_), -1, dtype=np.int64)
    value = np.full((m_, n_), -1, dtype=np.int64)
    for t in range(nthr):
        r, c = idx[t] % m_, idx[t] // m_
        free = owner[r, c] < 0
        owner[r[free], c[free]] = t
        value[r[free], c[free]] = np.arange(nval)[free]
    if region is not None:
        r_, c_ = extents_pair("region", region, "(rows, cols)")
        owner, value = owner[:r_, :c_], value[:r_, :c_]
    nr, nc = owner.shape
    annotate = nr * nc <= 512 if annotate is None else annotate
    cs = 0.55 if annotate else float(np.clip(10.0 / max(nr, nc), 0.06, 0.3))
    fig = _figure(nc * cs + 2.0, nr * cs + 1.0)
    title = title or f"{tv.name or 'TV layout'} {tv}\n{nthr} threads x {nval} values over {m_}x{n_}"
    ax = _grid_axes(fig, nr, nc, title)
    ax.set_xlabel("N (column)", fontsize=8)
    ax.set_ylabel("M (row)", fontsize=8)
    im = ax.imshow(np.ma.masked_less(owner, 0), cmap="turbo", interpolation="nearest", aspect="equal")
    fig.colorbar(im, ax=ax, label="thread", shrink=0.6)
    if annotate:
        for r in range(nr):
            for c in range(nc):
                if owner[r, c] >= 0:
                    ax.text(c, r, f"T{owner[r, c]}\nV{value[r, c]}", ha="center", va="center", fontsize=4.5)
    save(fig, path)
    return fig


def draw_conflicts(layouts: Sequence[StaticLayout], pattern: AccessPattern, elem_bytes: int,
                   path: Optional[str] = None, access: int = 0, title: Optional[str] = None):
    """Distinct 4-byte words each bank must deliver for access ``access`` of ``pattern``, one panel per
    layout (stage 0 of a staged one), one stacked colour per phase of the request (the phases of
    :func:`.analysis.request_wavefronts`: ``128 / access bytes`` threads by thread index, e.g. the four
    quarter-warps of 16-byte accesses, served one after another): a phase's tallest bar is its
    wavefronts, and a bank is drawn red where some phase asks it for more than one word (a conflict).
    Each panel's title gives the request's wavefronts and ideal.  Inactive threads draw nothing.
    (A single layout draws one panel.)  ``ValueError`` before drawing for no layouts, an ``access`` the
    pattern does not have, and for what :func:`.analysis.bank_conflicts` refuses (``elem_bytes``, coords,
    accesses outside a tile); ``TypeError`` for a layout that is not a :class:`.static.StaticLayout`."""
    elem_bytes = check_elem_bytes(elem_bytes)
    layouts = [layouts] if isinstance(layouts, StaticLayout) else list(layouts)
    if not layouts:
        raise ValueError("draw_conflicts needs at least one layout (one panel each)")
    for lay in layouts:
        if not isinstance(lay, StaticLayout):
            raise TypeError(f"layouts: expected StaticLayout objects, got {type(lay).__name__}")
    coords = check_coords(pattern.coords, pattern.name)
    if not 0 <= require_int("access", access) < len(coords):
        raise ValueError(f"access={access}: {pattern.name} has {len(coords)} access(es); expected 0..{len(coords) - 1}")
    acc = coords[access]
    access_bytes = pattern.vec * elem_bytes
    threads = [thread_addresses(stage_slice(lay.byte_offsets(elem_bytes), check_stage(lay, 0)), acc, pattern.vec,
                                elem_bytes, f"{pattern.name} over {lay.name or lay}") for lay in layouts]
    fig = _figure(7.0, 1.9 * len(layouts) + 0.6)
    axes = fig.subplots(len(layouts), 1, squeeze=False)[:, 0]
    for ax, lay, (addr, active) in zip(axes, layouts, threads):
        bottom = np.zeros(NUM_BANKS, dtype=np.int64)
        conflict = np.zeros(NUM_BANKS, dtype=bool)
        phases = request_phases(addr, access_bytes, active)
        ends = [p for p, _, _ in phases[1:]] + [len(addr)]  # (a phase's threads run to the next one's first)
        for n, ((p, _, counts), end) in enumerate(zip(phases, ends)):
            conflict |= counts > 1
            ax.bar(range(NUM_BANKS), counts, bottom=bottom, color=f"C{n % 10}", edgecolor="white", linewidth=0.3,
                   label=f"threads {p}-{end - 1}" if len(phases) > 1 else None)
            bottom += counts
        for b in np.flatnonzero(conflict):
            ax.bar(b, bottom[b], fill=False, edgecolor="tab:red", linewidth=1.2)
        waves, ideal = request_wavefronts(addr, access_bytes, active)
        ax.set_xlim(-0.5, NUM_BANKS - 0.5)
        ax.set_ylim(0, max(int(bottom.max()), 1) * 1.3)  # (room for the legend)
        ax.set_ylabel("words", fontsize=8)
        ax.set_title(f"{lay.name or lay}: {waves} wavefront{'s' if waves != 1 else ''} (ideal {ideal})", fontsize=8)
        ax.tick_params(labelsize=6)
        if len(phases) > 1:
            ax.legend(fontsize=5, loc="upper right", ncol=4)
    axes[-1].set_xlabel(f"bank  ({int(np.sum(acc[:, 0] >= 0))} active threads, stacked by phase; red outline: "
                        "a conflict within a phase)", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    save(fig, path)
    return fig
