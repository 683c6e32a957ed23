"""cute_kernels.layouts on the CPU: bank-conflict phases are formed by thread index (inactive threads
do not shift the others into another phase), and TMA boxes of unswizzled (interleave) layouts are the
16-byte atom wide, as the DSL's own TMA atoms are."""

from __future__ import annotations

import numpy as np
import pytest

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass loads)
from cute_kernels import layouts as L
from cute_kernels.layouts.kernel_layouts import parse_tma_type
from cute_kernels.layouts.static import StaticLayout

I = (-1, -1)  # an inactive thread


def _pattern(active: dict, vec: int, name: str = "p") -> L.AccessPattern:
    """One access of 32 threads: ``active`` maps thread -> (row, col); the others are inactive."""
    co = [I] * 32
    for t, rc in active.items():
        co[t] = rc
    return L.AccessPattern(name, np.array([co]), vec)


# ---------------------------------------------------------------------------- phases by thread index
def test_the_reviewers_gap_is_two_conflict_free_quarter_warps():
    """Threads 0-3 read row 0, threads 8-11 row 1 (16 B each, 128-byte rows): two quarter-warps of one
    wavefront each.  Dropping the inactive threads first packed all eight into one phase (2 wavefronts
    against an ideal of 1: '2.0x the ideal')."""
    pat = _pattern({**{t: (0, 8 * t) for t in range(4)}, **{8 + t: (1, 8 * t) for t in range(4)}}, 8, "gap")
    rep = L.bank_conflicts(L.row_major(8, 64), pat, 2)
    assert (rep.wavefronts, rep.ideal) == ([2], [2])
    assert rep.conflict_free and "conflict-free" in str(rep)


def test_an_inactive_thread_inside_a_quarter_warp_does_not_pull_in_the_next_one():
    """Thread 3 sits out; threads 0-7 read row 0, threads 8-15 row 1: still one wavefront per
    quarter-warp (thread 8 used to land in the first phase, on thread 0's banks)."""
    active = {t: (0, 8 * t) for t in range(8) if t != 3}
    active.update({8 + t: (1, 8 * t) for t in range(8)})
    rep = L.bank_conflicts(L.row_major(8, 64), _pattern(active, 8), 2)
    assert (rep.wavefronts, rep.ideal) == ([2], [2]) and rep.conflict_free


def test_8_byte_accesses_run_in_half_warps_by_thread_index():
    """Threads 0-7 read row 0, 8-15 sit out, 16-23 read row 1 (8 B each): two half-warps, one wavefront each."""
    active = {t: (0, 4 * t) for t in range(8)}
    active.update({16 + t: (1, 4 * t) for t in range(8)})
    rep = L.bank_conflicts(L.row_major(8, 64), _pattern(active, 4), 2)
    assert (rep.wavefronts, rep.ideal) == ([2], [2]) and rep.conflict_free


def test_phases_without_an_active_thread_cost_nothing():
    plain = L.row_major(8, 64)
    last = L.bank_conflicts(plain, _pattern({24 + t: (3, 8 * t) for t in range(8)}, 8), 2)  # quarter-warp 3 only
    assert (last.wavefronts, last.ideal) == ([1], [1])
    none = L.bank_conflicts(plain, _pattern({}, 8), 2)  # no thread at all
    assert (none.wavefronts, none.ideal) == ([0], [0]) and none.conflict_free
    # 4-byte accesses are one phase of the whole warp: gaps change nothing
    assert L.bank_conflicts(plain, _pattern({0: (0, 0), 31: (1, 0)}, 2), 2).wavefronts == [2]


def test_request_wavefronts_takes_one_address_per_thread_and_an_active_mask():
    addr = np.zeros(32, dtype=np.int64)
    addr[:4] = 16 * np.arange(4)  # quarter-warp 0: bytes 0..63 of row 0
    addr[8:12] = 128 + 16 * np.arange(4)  # quarter-warp 1: the same banks, next 128-byte row
    active = np.zeros(32, dtype=bool)
    active[:4] = active[8:12] = True
    assert L.request_wavefronts(addr, 16, active) == (2, 2)
    assert L.request_wavefronts(addr[active], 16) == (2, 1)  # packed: one phase, one conflict (the caller's choice)
    assert L.request_wavefronts(addr, 16) == L.request_wavefronts(addr, 16, np.ones(32, dtype=bool))  # default: all
    assert L.request_wavefronts(addr, 16, np.zeros(32, dtype=bool)) == (0, 0)
    with pytest.raises(ValueError, match="active: expected one flag per thread"):
        L.request_wavefronts(addr, 16, active[:8])
    with pytest.raises(ValueError, match="1-D"):
        L.request_wavefronts(addr.reshape(4, 8), 16)


@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_an_inactive_thread_counts_like_one_repeating_a_neighbour_of_its_phase(vec):
    """Reading a word another thread of the phase reads is free (broadcast), so an inactive thread and
    one that repeats an active thread of its own phase must cost the same, on any layout."""
    rng = np.random.default_rng(vec)
    per_phase = min(32, 128 // (2 * vec))
    for lay in (L.row_major(64, 64), L.hopper_smem_layout(64, 64, "bf16"),
                L.hopper_smem_layout(64, 64, "bf16", swizzle="32B")):
        for _ in range(40):
            co = np.stack([rng.integers(0, 64, 32), vec * rng.integers(0, 64 // vec, 32)], -1)
            off = rng.random(32) < 0.4
            gaps = co.copy()
            gaps[off] = I
            filled = gaps.copy()
            for t in np.flatnonzero(off):
                phase = np.arange(t // per_phase * per_phase, (t // per_phase + 1) * per_phase)
                live = phase[~off[phase]]
                if len(live):
                    filled[t] = gaps[live[0]]
            empty = [p for p in range(0, 32, per_phase) if off[p:p + per_phase].all()]
            a = L.bank_conflicts(lay, L.AccessPattern("gaps", gaps[None], vec), 2)
            for p in empty:  # a phase with no active thread is left out of both
                filled[p:p + per_phase] = I
            b = L.bank_conflicts(lay, L.AccessPattern("filled", filled[None], vec), 2)
            assert (a.wavefronts, a.ideal) == (b.wavefronts, b.ideal)


def test_partial_last_warp_of_a_tv_layout_is_unchanged():
    """pattern_from_tv marks only the missing threads at the end of a last warp inactive: those sit in the
    last phases, so their numbers are what they were (the kernels' reports rely on this)."""
    pat = L.pattern_from_tv(L.row_major(48, 2), (2, 48), 1, "48 threads", warp=None)
    rep = L.bank_conflicts(L.row_major(64, 64), pat, 2)
    assert rep.wavefronts == [1, 1, 1, 1] and rep.ideal == [1, 1, 1, 1]
    tv = StaticLayout((40, 8), (1, 40))  # thread t owns row t of a 40 x 8 tile: one 16-byte vector
    pat = L.pattern_from_tv(tv, (40, 8), 8, "40 threads x 16 B", warp=1)  # threads 32..39, then 24 missing
    assert np.all(pat.coords[0, :8, 0] == np.arange(32, 40)) and np.all(pat.coords[0, 8:] == -1)
    rep = L.bank_conflicts(L.row_major(40, 8), pat, 2)  # 16-byte rows: 8 rows fill the 32 banks once
    assert (rep.wavefronts, rep.ideal) == ([1], [1])


# ---------------------------------------------------------------------------- TMA boxes
@pytest.mark.parametrize("rows,cols,dtype,swizzle,box,boxes", [
    (64, 24, "bf16", "auto", (64, 8), 3),  # the reviewer's case: auto picks the interleave
    (64, 64, "bf16", "none", (64, 8), 8),
    (128, 40, "bf16", "auto", (128, 8), 5),
    (64, 256, "bf16", "none", (64, 8), 32),
    (64, 32, "fp32", "none", (64, 4), 8),
    (64, 64, "fp8", "none", (64, 16), 4),
    (256, 64, "bf16", "none", (256, 8), 8),
])
def test_interleave_boxes_are_one_16_byte_atom_wide(rows, cols, dtype, swizzle, box, boxes):
    lay = L.hopper_smem_layout(rows, cols, dtype, swizzle=swizzle)
    assert lay.swizzle.byte_swizzle_name == "none (interleave)"
    b = L.tma_box(lay, dtype)
    assert (b["box"], b["boxes"]) == (box, boxes)
    assert b["box"][0] * b["box"][1] * b["boxes"] == rows * cols


@pytest.mark.parametrize("rows,cols,dtype,swizzle,box,boxes", [
    (64, 64, "bf16", "32B", (64, 16), 4),
    (64, 96, "bf16", "32B", (64, 16), 6),
    (64, 48, "bf16", "auto", (64, 16), 3),  # auto: 32B
    (64, 64, "bf16", "64B", (64, 32), 2),
    (64, 64, "bf16", "128B", (64, 64), 1),
    (64, 128, "bf16", "128B", (64, 64), 2),
    (128, 128, "bf16", "auto", (128, 64), 2),
    (64, 64, "fp32", "auto", (64, 32), 2),
    (64, 128, "fp8", "auto", (64, 128), 1),
    (64, 64, "fp8", "64B", (64, 64), 1),
])
def test_swizzled_boxes_are_the_swizzle_width(rows, cols, dtype, swizzle, box, boxes):
    b = L.tma_box(L.hopper_smem_layout(rows, cols, dtype, swizzle=swizzle), dtype)
    assert (b["box"], b["boxes"]) == (box, boxes)


def test_staged_layout_box_is_the_box_of_one_stage():
    b = L.tma_box(L.hopper_smem_layout(64, 24, "bf16", stages=3), "bf16")
    assert (b["box"], b["boxes"]) == ((64, 8), 3)


def _dsl_box(rows, cols, dtype, build):
    """Box and box count of the TMA atom the DSL's make_tiled_tma_atom makes for the smem layout ``build()``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    def atom_type():
        el = {"bf16": cutlass.BFloat16, "fp32": cutlass.Float32, "fp8": cutlass.Float8E4M3FN}[dtype]
        ptr = cute.make_ptr(el, 0, cute.AddressSpace.gmem, assumed_align=16)
        g = cute.make_tensor(ptr, cute.make_layout((rows * 4, cols * 4), stride=(cols * 4, 1)))
        atom, _ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), g, build(), (rows, cols))
        return str(atom.type)

    t = parse_tma_type(L.trace(atom_type))
    return t["dsl_box"], rows * cols * L.elem_bytes(dtype) // t["dsl_box_bytes"]


@pytest.mark.parametrize("rows,cols,dtype,swizzle", [
    (64, 24, "bf16", "auto"), (64, 64, "bf16", "none"), (128, 40, "bf16", "auto"), (64, 32, "fp32", "none"),
    (64, 64, "fp8", "none"), (64, 64, "bf16", "32B"), (64, 64, "bf16", "64B"), (64, 128, "bf16", "128B"),
    (512, 64, "bf16", "128B"), (512, 64, "bf16", "none"),
])
def test_tma_box_is_the_dsl_atoms_box(rows, cols, dtype, swizzle):
    """The DSL's own TMA atom over the same layout: the box and the number of copies per tile agree
    (boxes are at most 256 elements per dimension: 512 rows take two)."""
    from cute_kernels.layouts.hopper import build_hopper_smem_layout

    b = L.tma_box(L.hopper_smem_layout(rows, cols, dtype, swizzle=swizzle), dtype)
    assert (b["box"], b["boxes"]) == _dsl_box(rows, cols, dtype,
                                              lambda: build_hopper_smem_layout(rows, cols, dtype, "K", None, swizzle))


@pytest.mark.parametrize("rows,cols,shape,stride,box", [
    (64, 64, (64, 64), (64, 1), (64, 64)),  # row-major 128-byte rows: one box
    (64, 512, (64, 512), (512, 1), (1, 256)),  # rows longer than a box: one row per box
    (64, 64, (64, 64), (72, 1), (1, 64)),  # padded rows
    (64, 64, ((8, 8), (8, 8)), ((8, 128), (1, 64)), (8, 8)),  # 8-row groups not at the box's stride
])
def test_tma_box_of_plain_layouts_is_the_dsl_atoms_box(rows, cols, shape, stride, box):
    import cutlass.cute as cute

    b = L.tma_box(StaticLayout(shape, stride), "bf16")
    assert b["box"] == box
    assert (b["box"], b["boxes"]) == _dsl_box(rows, cols, "bf16", lambda: cute.make_layout(shape, stride=stride))


def test_conflict_picture_counts_each_phase_on_its_own():
    """draw_conflicts summed all threads of a 16-byte access over its four quarter-warp phases, so a
    conflict-free swizzled read showed 4 words per bank (drawn as a conflict); now the phases are stacked,
    only a conflict within a phase is outlined, and each panel's title gives wavefronts and ideal
    (session 20)."""
    pytest.importorskip("matplotlib")
    from cute_kernels.layouts import viz

    pat = L.row_vector_read(32, 0, 8)
    fig = viz.draw_conflicts([L.hopper_smem_layout(64, 64, "bf16", swizzle="128B"), L.row_major(64, 64)], pat, 2)
    swizzled, plain = fig.axes[0], fig.axes[1]
    assert swizzled.get_title().endswith("4 wavefronts (ideal 4)") and plain.get_title().endswith("32 wavefronts (ideal 4)")

    def outlined(ax):
        return sum(1 for p in ax.patches if not p.get_fill())

    assert outlined(swizzled) == 0 and outlined(plain) == 4


def test_tma_box_refuses_rows_that_are_not_16_byte_multiples():
    """64x257 bf16 gave a (1, 1) box of 2 bytes, which TMA cannot issue (review, session 20)."""
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        L.tma_box(L.row_major(64, 257), "bf16")
    assert L.tma_box(L.row_major(64, 24), "bf16")["box"] == (64, 24)  # 48-byte rows: fine
