"""cute_kernels.layouts on the CPU: layout evaluation, textbook bank conflicts, budgets, pictures, the
ranker forward's own layouts (as the kernel compiles with them) and the ``cute-kernels layouts`` command."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass loads)
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup
from cute_kernels import layouts as L
from cute_kernels.layouts import kernel_layouts as KL
from cute_kernels.layouts.hopper import build_hopper_smem_layout


# ---------------------------------------------------------------------------- evaluation
@pytest.mark.parametrize("rows,cols,major,stages", [(128, 64, "K", None), (64, 128, "K", 2), (64, 128, "MN", None)])
def test_numpy_evaluation_matches_the_dsl(rows, cols, major, stages):
    lay = L.hopper_smem_layout(rows, cols, "bf16", major=major, stages=stages)
    table = lay.offsets()
    rng = np.random.default_rng(0)
    coords = [tuple(int(rng.integers(0, d)) for d in lay.dims) for _ in range(200)]
    dsl = L.dsl_evaluate(lambda: build_hopper_smem_layout(rows, cols, "bf16", major, stages), coords)
    assert [int(table[c]) for c in coords] == dsl


def test_128b_swizzle_is_the_textbook_xor():
    lay = L.hopper_smem_layout(128, 64, "bf16")
    assert (lay.swizzle.bits, lay.swizzle.base, lay.swizzle.shift) == (3, 4, 3)
    assert lay.swizzle.byte_swizzle_name == "128B"
    chunk = lay.byte_offsets(2)[:, ::8] // 16  # 16-byte chunk of each (row, 8-column group)
    rows = np.arange(128)[:, None]
    cols = np.arange(8)[None, :]
    assert np.array_equal(chunk % 8, cols ^ (rows % 8))  # chunk c of row r lands at c ^ (r % 8)
    assert np.array_equal(chunk // 8, np.broadcast_to(rows, chunk.shape))  # and stays in its 128-byte row
    assert sorted(lay.byte_offsets(2).ravel()) == list(range(0, 128 * 64 * 2, 2))  # a bijection


def test_swizzle_choice_follows_the_row_width():
    assert L.hopper_smem_layout(64, 64, "bf16").swizzle.bits == 3  # 128 B rows
    assert L.hopper_smem_layout(64, 32, "bf16").swizzle.bits == 2  # 64 B
    assert L.hopper_smem_layout(64, 16, "bf16").swizzle.bits == 1  # 32 B
    assert L.hopper_smem_layout(64, 64, "bf16", swizzle="none").swizzle.bits == 0
    with pytest.raises(ValueError, match="16 bytes"):
        L.hopper_smem_layout(64, 4, "bf16")
    with pytest.raises(TypeError):
        L.hopper_smem_layout(64, 64, "int3")


class _SwizzleProbe:
    """Tiny kernel: write row ``tidx`` of a 128B-swizzled 64x64 bf16 smem tile, as the kernels do
    (``layout.inner`` attached to the smem pointer, ``layout.outer`` as the tensor's layout)."""

    @cute.jit
    def __call__(self, mO: cute.Tensor):
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, cutlass.BFloat16)
        self.kernel(mO, cute.tile_to_shape(atom, (64, 64), order=(0, 1))).launch(grid=[1, 1, 1], block=[32, 1, 1])

    @cute.kernel
    def kernel(self, mO: cute.Tensor, lay: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        buf = cutlass.memory.SmemAllocator().allocate_array(cutlass.BFloat16, 64 * 64, byte_alignment=1024)
        sT = cute.make_tensor(cute.recast_ptr(buf, lay.inner, dtype=cutlass.BFloat16), lay.outer)
        sT[(tidx, 0)] = cutlass.BFloat16(1.0)
        cute.arch.sync_threads()
        mO[tidx] = sT[(0, tidx)]


def test_pointer_swizzle_acts_on_byte_addresses(tmp_path):
    """The PTX must XOR byte-address bits [7,10) into [4,7) (shr 3, and 0x70): the reading that
    StaticLayout.byte_offsets models."""
    import re

    import torch

    from cute_kernels.runtime.fake import fake_tensor

    compiled = cute.compile(_SwizzleProbe(), fake_tensor(torch.bfloat16, (64,)),
                            options=f"--keep-ptx --dump-dir {tmp_path}")
    ptx = compiled.artifacts.PTX
    assert re.search(r"shr\.u32\s+(%r\d+), %r\d+, 3;\s+and\.b32\s+(%r\d+), \1, 112;\s+xor\.b32", ptx), ptx[-2000:]


# ---------------------------------------------------------------------------- bank conflicts
def test_row_major_64x64_bf16_read_by_columns_conflicts():
    rep = L.bank_conflicts(L.row_major(64, 64), L.column_read(32, 0), elem_bytes=2)
    assert rep.wavefronts == [32] and rep.ideal == [1]  # 128-byte rows: every thread hits one bank
    assert not rep.conflict_free


def test_row_read_and_broadcast_are_conflict_free():
    assert L.bank_conflicts(L.row_major(64, 64), L.row_read(0, 1), 2).conflict_free
    assert L.request_wavefronts(np.zeros(32, dtype=np.int64), 4) == (1, 1)  # one word: broadcast


def test_128b_swizzle_16B_vectors_by_8_rows_do_not_conflict():
    sw = L.hopper_smem_layout(128, 64, "bf16")
    plain = L.row_major(128, 64)
    for chunk in range(8):
        pat = L.row_vector_read(8, chunk, vec=8)
        assert L.bank_conflicts(sw, pat, 2).wavefronts == [1]
        assert L.bank_conflicts(plain, pat, 2).wavefronts == [8]  # same 4 banks, 8 rows
    full = L.bank_conflicts(sw, L.row_vector_read(32, 5, vec=8), 2)
    assert full.wavefronts == [4] and full.ideal == [4]


@pytest.mark.parametrize("dtype,wrong", [("bf16", 4), ("bf16", 1), ("fp32", 2), ("fp8", 2)])
@pytest.mark.parametrize("major", ["K", "MN"])
def test_element_size_other_than_the_layouts_is_refused(dtype, wrong, major):
    """A swizzled layout's atom rows fix its element size: bank_conflicts / bank_table / the pictures with
    another elem_bytes would describe another layout (2.0x the ideal for a conflict-free bf16 read)."""
    lay = L.hopper_smem_layout(64, 64, dtype, major=major)
    right = L.elem_bytes(dtype)
    L.bank_table(lay, right)  # its own size is fine
    with pytest.raises(ValueError, match=f"elem_bytes={wrong} does not match .*{right}-byte elements"):
        L.bank_table(lay, wrong)
    with pytest.raises(ValueError, match="does not match"):
        L.bank_conflicts(lay, L.row_read(0, 1), wrong)
    L.bank_table(L.row_major(64, 64), wrong)  # no swizzle: no element size to read


def test_vector_split_by_the_layout_is_reported():
    with pytest.raises(ValueError, match="not contiguous"):
        L.bank_conflicts(L.hopper_smem_layout(64, 64, "bf16", major="MN"), L.row_vector_read(8, 0, 8), 2)


# ---------------------------------------------------------------------------- pictures
def test_pictures_are_written_and_not_empty(tmp_path):
    from cute_kernels.layouts import viz

    lay = L.hopper_smem_layout(16, 64, "bf16")
    files = viz.save(viz.draw_offsets(lay, elem_bytes=2), str(tmp_path / "offsets"))
    files += viz.save(viz.draw_banks(lay, 2), str(tmp_path / "banks.png"))
    files += viz.save(viz.draw_conflicts([L.row_major(64, 64), lay], L.row_vector_read(8, 0, 8), 2),
                      str(tmp_path / "conflicts"))
    tv = L.StaticLayout(((4, 8), 2), ((16, 1), 8), name="toy TV")  # 32 threads x 2 values over 8x8
    files += viz.save(viz.draw_tv(tv, (8, 8)), str(tmp_path / "tv"))
    assert len(files) == 8
    for f in files:
        assert os.path.getsize(f) > 1000, f
    assert {os.path.splitext(f)[1] for f in files} == {".png", ".svg"}


# ---------------------------------------------------------------------------- ranker forward
rf = pytest.importorskip("cute_kernels.kernels.ranker_fwd")


@pytest.mark.parametrize("head_dim", sorted(rf.CONFIGS))
def test_ranker_shipped_configs_layouts_and_budget(head_dim):
    cfg = rf.CONFIGS[head_dim]
    kl = KL.ranker_fwd_layouts(cfg, "bf16")
    assert kl.smem["sQ"].dims == (cfg.tile_m, cfg.head_dim)
    assert kl.smem["sK"].dims == (cfg.tile_n, cfg.head_dim, cfg.stages)
    for name in ("sQ", "sK", "sV"):
        assert kl.smem[name].swizzle.byte_swizzle_name == "128B"  # head dims 64..256 bf16: >= 128-byte rows
    for name, box in kl.tma.items():  # the DSL's TMA atom agrees with the box read off the swizzle atom
        assert box["dsl_box"] == box["box"], (name, box)
        assert box["dsl_box_bytes"] * box["boxes"] == box["bytes"], (name, box)
    assert kl.budget.total == cfg.smem_bytes(2)  # the same accounting validate() uses
    assert kl.budget.fits
    assert kl.budget.per_stage == 2 * cfg.tile_n * cfg.head_dim * 2
    # the epilogue's stmatrix writes are conflict-free on the kernel's layout, 8x worse unswizzled
    stsm = [r for r in kl.conflicts if r.pattern.startswith("epilogue stmatrix")]
    assert stsm[0].conflict_free and stsm[1].ratio == 8.0
    # self_kv_tma (D=128): the self term's ldmatrix reads of sQ (and of a K/V stage, same layout) likewise
    ldsm = [r for r in kl.conflicts if r.pattern.startswith("self term ldmatrix")]
    assert bool(ldsm) == rf.self_kv_tma_taken(cfg)
    if ldsm:
        assert ldsm[0].conflict_free and ldsm[1].ratio == 8.0


def test_ranker_layouts_follow_the_kernels_rules():
    """The forward report analyses what the kernel does: float16 starts from its own shipped config (the
    online max), and ``self_kv_tma`` where the kernel takes it only (not at D=256, where it
    would spill: session 25; there the kernel compiles to global reads, no ldmatrix, no stack).  (The online
    max: the shipped D=256 config's checked_max spills 80 B at tile_n=128.)"""
    import torch

    from cute_kernels.runtime.cache import compile_record

    fp16 = KL.ranker_fwd_layouts(None, "fp16")
    assert not fp16.config.checked_max and fp16.config == rf.shipped_config(torch.float16, 128)
    text = "head_dim=256,tile_n=128,intra_wg_overlap=false,stages=1,self_kv_tma=true,checked_max=false"
    kl = KL.ranker_fwd_layouts(text)
    assert kl.config.self_kv_tma and not rf.self_kv_tma_taken(kl.config)
    assert "self term ldmatrix (src)" not in kl.tv
    rf._compile(torch.bfloat16, kl.config, 1, "none", False)
    rec = compile_record(rf.NAME, (str(torch.bfloat16), kl.config, 1, "none", False))
    assert "ldmatrix" not in rec.ptx and all(r.stack_bytes == 0 for r in rec.resources)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_ranker_layouts_are_the_ones_the_kernel_compiles_with(monkeypatch, head_dim):
    """Record the layouts RankerAttentionFwd.__call__ builds while it is traced for a real sm_90a compile,
    for every shipped config (one per head dim)."""
    import torch

    from cute_kernels.layouts.static import _from_dsl

    seen = []  # (the kernel and the layouts tool both take them from rf.smem_layouts: this checks the kernel does)
    orig = rf.smem_layouts

    def spy(*a, **k):
        out = orig(*a, **k)
        seen.extend(_from_dsl(v, n) for n, v in dict(out).items())
        return out

    monkeypatch.setattr(rf, "smem_layouts", spy)
    # the WGMMA accumulators and the epilogue's stmatrix copy, as traced in the kernel
    tv_seen = []
    make_mma, make_copy_c = rf.sm90_utils.make_trivial_tiled_mma, rf.cute.make_tiled_copy_C

    def spy_mma(*a, **k):
        mma = make_mma(*a, **k)
        tv_seen.append(_from_dsl(mma.tv_layout_C_tiled))
        return mma

    def spy_copy_c(*a, **k):
        tc = make_copy_c(*a, **k)
        tv_seen.append(_from_dsl(tc.layout_dst_tv_tiled))
        return tc

    monkeypatch.setattr(rf.sm90_utils, "make_trivial_tiled_mma", spy_mma)
    monkeypatch.setattr(rf.cute, "make_tiled_copy_C", spy_copy_c)
    monkeypatch.setenv("CUTE_KERNELS_CACHE", "0")  # force a trace (no disk hit)
    cfg = rf.CONFIGS[head_dim]
    rf._compile(torch.bfloat16, cfg, 3, "none", False)  # GQA 3: a key no other test compiles
    compiled = {(lay.shape, lay.stride, lay.swizzle) for lay in seen}
    compiled_tv = {(lay.shape, lay.stride) for lay in tv_seen}
    kl = KL.ranker_fwd_layouts(cfg, "bf16")
    for name in ("sQ", "sK", "sV", "sO"):
        lay = kl.smem[name]
        assert (lay.shape, lay.stride, lay.swizzle) in compiled, name
    for name in ("S=QK^T accumulator", "O=PV accumulator", "epilogue stmatrix (dst)"):
        lay = kl.tv[name].layout
        assert (lay.shape, lay.stride) in compiled_tv, name
    regs = L.registers(rf.NAME, (str(torch.bfloat16), cfg, 3, "none", False))  # from the compile record
    assert regs and all(r["registers"] and r["registers"] <= 255 for r in regs)


@pytest.mark.parametrize("text,reason", [
    ("tile_n=176", "register"),        # D=128: S + O + P accumulators do not fit 240 registers
    ("stages=4", "shared memory"),     # 32 KB Q + 4 x 64 KB K/V > 227 KB
    ("tile_m=192", "tile_m"),
    ("head_dim=96", "head_dim"),
])
def test_ranker_config_validation_rejects_with_reason(text, reason):
    with pytest.raises(ValueError, match=reason):
        KL.ranker_fwd_layouts(text)


def test_ranker_new_tile_shapes_that_fit():
    # D=128 ships persistent (a separate sO): three stages fit only with one tile per CTA (sO aliases sQ)
    three = KL.ranker_fwd_layouts("head_dim=128,stages=3,persistent=False")
    assert three.budget.fits and three.budget.total > 225 * 1024
    narrow = KL.ranker_fwd_layouts("head_dim=64,tile_n=96")  # D=64 ships three consumer warpgroups
    assert narrow.smem["sK"].dims == (96, 64, narrow.config.stages) and narrow.smem["sQ"].dims[0] == 192


def test_enumerate_configs_splits_by_validate():
    one_tile_per_cta = dataclasses.replace(rf.CONFIGS[128], persistent=False)
    ok, bad = KL.enumerate_configs(one_tile_per_cta, tile_n=(128, 176), stages=(2, 3, 4))
    assert {(c.tile_n, c.stages) for c in ok} == {(128, 2), (128, 3)}
    reasons = {(c["tile_n"], c["stages"]): r for c, r in bad}  # (a rejected config never exists: its fields)
    assert "shared memory" in reasons[(128, 4)] and "register" in reasons[(176, 2)]
    with pytest.raises(ValueError, match="no field tile_N"):  # a typo, not "nothing fits"
        KL.enumerate_configs(one_tile_per_cta, tile_N=(128,))
    np_ok, np_bad = KL.enumerate_configs(one_tile_per_cta, tile_n=np.array([128, 176]), stages=np.arange(2, 5),
                                         persistent=np.array([False]))  # NumPy values count as Python ones
    assert np_ok == ok and [{**c, "persistent": False} for c, _ in bad] == [c for c, _ in np_bad]
    with pytest.raises(TypeError, match="tile_n"):  # a wrong type is the caller's mistake, not "does not fit"
        KL.enumerate_configs(one_tile_per_cta, tile_n=(128.0,))


def test_config_parsers_read_head_dim_as_the_other_fields():
    """The base config comes from head_dim read the way every field is (whitespace around an item, a
    sign), so the other fields are not replaced on the wrong head dim's shipped config (session 37 review)."""
    for text in ("tile_n=96,\thead_dim=64", "head_dim=+64,tile_n=96", "tile_n=96, head_dim=64"):
        cfg = KL.ranker_config(text)
        assert (cfg.head_dim, cfg.tile_m, cfg.consumer_wgs) == (64, 192, 3), text
    assert KL.ranker_bwd_config("head_dim=+64").head_dim == 64
    with pytest.raises(ValueError, match="takes an integer"):
        KL.ranker_bwd_config("head_dim=x")


def test_ranker_config_fixed_row_max_turns_checked_max_off():
    """A capped config written from the uncapped shipped one (checked_max on) is usable as given."""
    cfg = KL.ranker_config("head_dim=128,tile_m=192,tile_n=64,stages=3,consumer_wgs=3,producer_regs=32,"
                           "consumer_regs=160,fixed_row_max=true")
    assert cfg.fixed_row_max and not cfg.checked_max
    cfg.validate()
    with pytest.raises(ValueError, match="exclude each other"):  # said explicitly: kept, so refused
        KL.ranker_config("fixed_row_max=true,checked_max=true")


def test_parse_config_errors():
    with pytest.raises(ValueError, match="unknown"):
        KL.ranker_config("tile_q=3")
    with pytest.raises(ValueError, match="key=value"):
        KL.ranker_config("tile_n")


def test_cli_layouts_writes_report_and_pictures(tmp_path, capsys):
    from cute_kernels.cli import main

    assert main(["layouts", "--kernel", "ranker_fwd", "--config", "head_dim=64", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.txt").read_text()
    assert "128B swizzle" in report and "shared memory budget" in report and "conflict-free" in report
    pngs = list(tmp_path.glob("*.png"))
    svgs = list(tmp_path.glob("*.svg"))
    assert len(pngs) >= 8 and len(svgs) == len(pngs)
    assert all(p.stat().st_size > 1000 for p in pngs + svgs)
    assert main(["layouts", "--kernel", "ranker_fwd", "--config", "stages=9", "--out", str(tmp_path)]) == 2
    assert "stages" in capsys.readouterr().err
    fresh = tmp_path / "not_made"
    assert main(["layouts", "--kernel", "ranker_fwd", "--config", "stages=9", "--out", str(fresh)]) == 2
    assert not fresh.exists()  # nothing written for a rejected config
    assert main(["layouts", "--kernel", "ranker_fwd", "--config", "head_dim=abc", "--out", str(fresh)]) == 2
    assert "'head_dim' takes an integer" in capsys.readouterr().err
    for field in ("head_dim", "tile_m"):  # the backward's config names the field too
        assert main(["layouts", "--kernel", "ranker_bwd", "--config", f"{field}=abc", "--out", str(fresh)]) == 2
        assert f"'{field}' takes an integer, got 'abc'" in capsys.readouterr().err
    afile = tmp_path / "report.txt"
    assert main(["layouts", "--kernel", "ranker_fwd", "--out", str(afile)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["layouts", "--kernel", "qknorm", "--config", "head_dim=128", "--out", str(fresh)]) == 2
    assert "applies to ranker_fwd, ranker_bwd and hc_mix only" in capsys.readouterr().err


def test_layouts_cap_option_and_the_run_config(tmp_path, capsys, monkeypatch):
    """``--cap`` picks the shipped config the fields come from and the compiled variant (rankers only); the
    forward's record compiles its config as the op runs it (checked_max dropped for float16 or a cap: it raised
    before, where the op runs such a config with a warning); a self_kv_tma the tile cannot take is said in the
    report (a newcomer's findings; session 72's: ``--cap`` started from the uncapped config, e.g. the backward's
    tile_m=128 at D=64, whose capped variant spills, where capped calls run tile_m=64)."""
    from cute_kernels.cli import main
    from cute_kernels.kernels import ranker_bwd as rb
    from cute_kernels.kernels import ranker_fwd as rf

    out = str(tmp_path / "x")
    assert main(["layouts", "--kernel", "hc_mix", "--cap", "tanh", "--compile", "--out", out]) == 2
    assert "ranker_fwd / ranker_bwd" in capsys.readouterr().err
    for cap in ("exp", "True"):
        with pytest.raises(ValueError, match="one of none, tanh, soft_sign"):
            KL.write_report("ranker_bwd", None, out, compile=True, cap_method=cap)
    assert KL.ranker_bwd_config("head_dim=64", "tanh") == rb.config_for(64, True) != rb.config_for(64, False)
    assert KL.ranker_bwd_config("head_dim=64") == rb.config_for(64, False) == KL.ranker_bwd_config("head_dim=64", "none")
    assert KL.ranker_bwd_layouts(None, "bf16", "soft_sign").config == rb.config_for(128, True)
    capped = KL.ranker_config("stages=2", "bf16", "tanh")
    assert capped == dataclasses.replace(rf.shipped_config(rf.torch.bfloat16, 128, "tanh"), stages=2)
    assert capped.fixed_row_max and capped.tile_m == 192 and capped != KL.ranker_config("stages=2")
    assert KL.ranker_fwd_layouts("head_dim=64", "fp16", "tanh").config == rf.shipped_config(rf.torch.float16, 64,
                                                                                             "tanh")
    assert main(["layouts", "--kernel", "ranker_fwd", "--cap", "tanh", "--out", out]) == 0  # (no --compile needed)
    assert f"config {rf.shipped_config(rf.torch.bfloat16, 128, 'tanh')}" in (tmp_path / "x" / "report.txt").read_text()
    from cute_kernels import cli

    assert cli.CAP_CHOICES == rf.CAP_METHODS  # the CLI's --cap (kept literal: `--help` imports no DSL)
    shipped = rf.shipped_config(rf.torch.bfloat16, 128, "none")
    assert shipped.checked_max
    assert KL.ranker_run_config(shipped, "bf16", "none") is shipped
    for dtype, capm in (("fp16", "none"), ("bf16", "tanh"), ("bf16", "soft_sign")):
        run = KL.ranker_run_config(shipped, dtype, capm)
        assert not run.checked_max and not run.fixed_row_max and run.tile_n == shipped.tile_n
    compiled = []
    monkeypatch.setattr(rf, "_compile", lambda *a: compiled.append(a))
    import cute_kernels.runtime.cache as cache
    monkeypatch.setattr(cache, "compile_record", lambda name, key: key)
    key = KL.ranker_compile_record(shipped, "fp16")
    assert not compiled[-1][1].checked_max and key[1] is compiled[-1][1]
    report = KL.format_report(KL.ranker_fwd_layouts("head_dim=128,tile_n=96"))
    assert "self_kv_tma and prefetch_self_kv not taken" in report and "(here 128 and 96)" in report
    assert "not taken" not in KL.format_report(KL.ranker_fwd_layouts("head_dim=128"))


def test_config_messages_say_what_to_change():
    """A tuple written with commas, consumer_wgs changed without tile_m, hc_mix's register limit: each message names
    the fix (and hc_mix's only the changes that apply)."""
    from cute_kernels.kernels import hc_mix_tma

    with pytest.raises(ValueError, match="joined by x, e.g. tree=8x4x4"):
        KL.hc_mix_tma_config("tree=(8,4,4),cta_level=1")
    with pytest.raises(ValueError, match=r"set tile_m=128 with consumer_wgs=2"):
        KL.ranker_config("head_dim=64,consumer_wgs=2")
    base = hc_mix_tma.config_for(4096)
    with pytest.raises(ValueError, match=r"use tile_m=128 or a higher cta_level") as exc:
        dataclasses.replace(base, tile_m=256, overlap=False)
    assert "overlap=False or" not in str(exc.value) and "HcMixTmaConfig(" not in str(exc.value)
    # session 72: the smallest tile_n was told to shrink; the backward's 64 read as allowed
    with pytest.raises(ValueError, match="no tile_n fits .64 is the smallest.: use fewer consumer warpgroups"):
        KL.ranker_config("head_dim=256,tile_m=192,consumer_wgs=3,producer_regs=32,consumer_regs=160,tile_n=64")
    with pytest.raises(ValueError, match="use a smaller tile_n"):
        KL.ranker_config("head_dim=128,tile_n=256")
    with pytest.raises(ValueError, match="tile_n=64 only with split_head_dim"):
        KL.ranker_bwd_config("tile_n=64")


def test_cli_layouts_names_older_pictures(tmp_path, capsys):
    """A second run into a folder that holds the first run's pictures: report.txt lists only its own
    pictures, and the command names the older ones (nothing is deleted)."""
    from cute_kernels.cli import main

    assert main(["layouts", "--kernel", "ranker_fwd", "--config", "head_dim=64", "--out", str(tmp_path)]) == 0
    first = {p.name for p in tmp_path.iterdir()} - {"report.txt"}
    assert "older picture" not in capsys.readouterr().err
    assert main(["layouts", "--kernel", "hc_mix", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    report = (tmp_path / "report.txt").read_text()
    listed = {line.strip() for line in report.split("pictures of this report:\n")[1].splitlines()}
    now = {p.name for p in tmp_path.iterdir()} - {"report.txt"}
    older = now - listed
    assert listed and listed <= now and older and older <= first  # the first run's files all stay
    assert f"also holds {len(older)} older picture files" in err


def test_hc_mix_tma_layouts_match_the_kernel_and_draw(tmp_path):
    """hc_mix (its default TMA kernel): the rings the kernel builds (128B swizzle, one TMA box per
    stage and ring), squares conflict-free only with the swizzle, the budget equal to the config's
    own smem accounting; a config string with a tree; rejections before anything is written."""
    from cute_kernels.kernels import hc_mix_tma
    from cute_kernels.layouts.kernel_layouts import hc_mix_tma_layouts, write_report

    kl = hc_mix_tma_layouts()
    assert kl.smem["sX"].dims == (128, 64, 6) and kl.smem["sW"].dims == (hc_mix_tma.N_W, 64, 6)
    assert all(kl.smem[k].swizzle.byte_swizzle_name == "128B" for k in ("sX", "sW"))
    assert kl.smem["sWf"].dims == (hc_mix_tma.N_MIX, 64, 6) and kl.smem["sWf"].swizzle is None
    assert kl.tma["sX"]["dsl_box"] == (128, 64) and kl.tma["sWf"]["dsl_box"] == (hc_mix_tma.N_MIX, 64)
    swizzled, plain, split_stores, split_plain = kl.conflicts
    assert swizzled.conflict_free and plain.ratio == 4.0
    assert split_stores.conflict_free and split_plain.conflict_free
    assert kl.budget.total == kl.config.smem_bytes() and kl.budget.fits
    big = hc_mix_tma_layouts("tile_m=256,stages=4,tree=4x8,cta_level=2")
    assert big.smem["sX"].dims == (256, 64, 4) and big.config.tree == (4, 8)
    with pytest.raises(ValueError, match="tile_k"):
        hc_mix_tma_layouts("tile_k=32")
    with pytest.raises(ValueError, match="joined by 'x'"):
        hc_mix_tma_layouts("tree=4-2")
    text, files = write_report("hc_mix", "stages=3", str(tmp_path / "hc"))
    assert "squares: 16-byte reads" in text and "conflict-free" in text
    assert any(f.endswith("sX_banks.png") for f in files)
    with pytest.raises(ValueError):
        write_report("hc_mix", "stages=1", str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()


def test_ranker_bwd_layouts_match_the_kernel_and_draw(tmp_path):
    """ranker_bwd (the mainloop): the buffers the kernel builds (through ranker_bwd.smem_layouts, also
    what RankerAttentionBwd.__call__ uses), 64-column TMA boxes (32 float32 columns for the dQ
    reduce-add), the dS^T stmatrix and dQ^T stores conflict-free only with the 128B swizzle, the budget
    equal to the config's accounting; D=64 and the dQ = dS K form; rejections before anything is
    written; the CLI."""
    from cute_kernels.cli import main as cli_main
    from cute_kernels.kernels import ranker_bwd as rb
    from cute_kernels.layouts.kernel_layouts import ranker_bwd_layouts, write_report

    kl = ranker_bwd_layouts()
    cfg = rb.CONFIGS[128]
    assert kl.config == cfg
    assert kl.smem["sQ"].dims == (cfg.tile_m, 128, cfg.stages) and kl.smem["sK"].dims == (cfg.tile_n, 128)
    assert kl.smem["sdSt"].dims == (cfg.tile_n, cfg.tile_m, cfg.ds_stages) and kl.smem["sdQ"].dims == (cfg.tile_m, 128)
    assert kl.tma["sQ"]["dsl_box"] == (cfg.tile_m, 64) and kl.tma["sdQpart"]["dsl_box"] == (cfg.tile_m, 32)
    ds, ds_plain, dq, dq_plain = kl.conflicts
    assert ds.conflict_free and ds_plain.ratio == 8.0 and dq.conflict_free and dq_plain.ratio == 4.0
    assert kl.tv["dQ accumulator"].tile == (128, cfg.tile_m)  # dq_swap_ab: dQ^T
    assert kl.budget.total == cfg.smem_bytes() and kl.budget.fits
    d64 = ranker_bwd_layouts("head_dim=64")
    assert d64.config == rb.config_for(64, False) and d64.smem["sdQ"].dims == (128, 64)
    # D=64 (no dq_swap_ab): autovec_copy stores two neighbouring dQ values at once (st.shared.v2.b32 in its PTX,
    # test_ranker_bwd's PTX checks): 8 B per thread, 4 wavefronts where 2 would do; 8 without the swizzle
    _, _, dq64, dq64_plain = d64.conflicts
    assert dq64.access_bytes == 8 and len(dq64.wavefronts) == 16 and dq64.ratio == 2.0 and dq64_plain.ratio == 4.0
    plain = ranker_bwd_layouts("dq_swap_ab=False")
    assert plain.tv["dQ accumulator"].tile == (cfg.tile_m, 128) and plain.conflicts[2].layout.startswith("sdQ")
    # D=64, 128 q rows, dQ = dS K split by head dim: the warpgroups' 64 x 64 MMA tile, which the kernel repeats
    # over the rows (until session 83 the tool read the accumulator's layout over the whole tile and refused it)
    rows = ranker_bwd_layouts("head_dim=64,dq_split_rows=False")
    assert rows.config.tile_m == 128 and rows.tv["dQ accumulator"].tile == (64, 64)
    assert "one 64 x 64 MMA tile of the 128 x 64 tile" in rows.tv["dQ accumulator"].note
    assert rows.conflicts[2].access_bytes == 8 and rows.conflicts[2].ratio == 2.0
    assert d64.tv["dQ accumulator"].tile == (128, 64) and "MMA tile" not in d64.tv["dQ accumulator"].note
    with pytest.raises(ValueError, match="ds_stages"):
        ranker_bwd_layouts("ds_stages=3")
    text, files = write_report("ranker_bwd", "stages=1", str(tmp_path / "bwd"))
    assert "dQ accumulator stores" in text and "conflict-free" in text
    assert f"tile 128x{cfg.tile_m} (dQ^T: head dim x q rows)" in KL.format_report(kl)  # (said since session 72)
    assert any(f.endswith("sdQ_banks.png") for f in files) and any(f.endswith("sdSt_banks.png") for f in files)
    with pytest.raises(ValueError):
        write_report("ranker_bwd", "tile_n=64", str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    assert cli_main(["layouts", "--kernel", "ranker_bwd", "--config", "head_dim=64", "--out", str(tmp_path / "c")]) == 0


@pytest.mark.parametrize("script", ["swizzle_banks", "trace_your_own"])
def test_example_scripts_run(script, tmp_path, capsys):
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "layouts", f"{script}.py")
    spec = importlib.util.spec_from_file_location(f"layouts_example_{script}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "conflict-free" in out and "8" in out
    assert all(p.stat().st_size > 1000 for p in tmp_path.glob("*.png"))
    # --out naming a file: argparse's clean exit 2 before any work, not os.makedirs' FileExistsError traceback
    # after the results (session 73, a newcomer's finding)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as info:
        mod.main(["--out", str(tmp_path / "a_file")])
    assert info.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err


def test_smem_layout_refuses_partial_atoms_and_tma_box_refuses_mn_major():
    from cute_kernels.layouts.hopper import hopper_smem_layout, tma_box

    for rows, cols in ((7, 64), (100, 64)):
        with pytest.raises(ValueError, match="swizzle atoms"):
            hopper_smem_layout(rows, cols, "bf16")
    with pytest.raises(ValueError, match="K-major"):
        tma_box(hopper_smem_layout(128, 64, "bf16", major="MN"), "bf16")
    assert tma_box(hopper_smem_layout(64, 128, "bf16", stages=2), "bf16")["boxes"] == 2


def test_bank_conflicts_refuse_accesses_outside_the_tile():
    """A pattern reaching outside the tile (a negative column would wrap around in numpy) is an error."""
    import cutlass

    from cute_kernels.kernels import sm90_helpers
    from cute_kernels.layouts import analysis
    from cute_kernels.layouts.static import trace

    lay = trace(lambda: sm90_helpers.smem_layout(cutlass.BFloat16, 64, 64))
    assert analysis.bank_conflicts(lay, analysis.column_read(32, 5), 2).wavefronts
    for pattern in (analysis.column_read(32, 64), analysis.row_vector_read(32, 0, vec=8, row0=40),
                    analysis.row_read(0, vec=8, threads=9)):
        with pytest.raises(ValueError, match="outside the"):
            analysis.bank_conflicts(lay, pattern, 2)
    with pytest.raises(ValueError, match="threads <= 32"):  # one warp's access: the banks serve a warp at a time
        analysis.column_read(33, 0)
    with pytest.raises(ValueError, match="col=-5"):  # a negative column is refused where the pattern is built
        analysis.column_read(32, -5)


# ---------------------------------------------------------------------------- argument checks
def test_pattern_from_tv_refuses_a_warp_the_layout_does_not_have():
    """A warp index outside the thread layout is an error, not an empty pattern that bank_conflicts
    would call conflict-free; the missing threads of a partial last warp are inactive, not dropped."""
    tv = L.row_major(32, 4)  # 32 threads x 4 values: thread t owns column t of a 4 x 32 tile (one warp)
    assert L.pattern_from_tv(tv, (4, 32), 1, "warp 0", warp=0).coords.shape == (4, 32, 2)
    for warp in (5, 1, -1):
        with pytest.raises(ValueError, match=rf"warp={warp}: .*32 threads = 1 warp\(s\) of 32; expected None or 0\.\."):
            L.pattern_from_tv(tv, (4, 32), 1, "no such warp", warp=warp)
    with pytest.raises(TypeError, match="warp"):
        L.pattern_from_tv(tv, (4, 32), 1, "x", warp=0.5)
    with pytest.raises(ValueError, match=r"tile=\(4, 16\)"):  # the layout reaches outside a smaller tile
        L.pattern_from_tv(tv, (4, 16), 1, "x")
    pat = L.pattern_from_tv(L.row_major(48, 2), (2, 48), 1, "48 threads", warp=None)
    assert pat.coords.shape == (4, 32, 2)  # warp 0 and the 16 threads of warp 1, 2 accesses each
    assert np.all(pat.coords[2:, 16:] == -1) and np.all(pat.coords[2:, :16] >= 0)
    assert L.bank_conflicts(L.row_major(64, 64), pat, 2).wavefronts == [1, 1, 1, 1]


def test_negative_indices_other_than_the_inactive_marker_are_refused(tmp_path):
    """Only (-1, -1) marks an inactive thread: builders refuse negative arguments, AccessPattern and
    bank_conflicts / draw_conflicts refuse other negative rows or columns (rows -5..-1 were silently
    taken as inactive threads while the report still said 32 rows)."""
    from cute_kernels.layouts import viz

    with pytest.raises(ValueError, match=r"row0=-5: expected an integer >= 0"):
        L.row_vector_read(row0=-5)
    with pytest.raises(ValueError, match="row=-1"):
        L.row_read(-1)
    with pytest.raises(ValueError, match="chunk=-1"):
        L.row_vector_read(chunk=-1)
    for bad in ((-5, 0), (-1, 3), (2, -1)):
        with pytest.raises(ValueError, match=r"only \(-1, -1\) marks an inactive thread"):
            L.AccessPattern("bad", np.array([[bad, (0, 0)]]))
    plain = L.row_major(64, 64)  # 128-byte rows: a column read puts every thread on bank 0
    coords = np.stack([np.arange(32), np.zeros(32, dtype=np.int64)], -1)[None]
    coords[0, 0] = (-1, -1)  # thread 0 sits this access out
    pat = L.AccessPattern("31 threads down column 0", coords)
    assert L.bank_conflicts(plain, pat, 2).wavefronts == [31]
    fig = viz.draw_conflicts([plain], pat, 2)  # the inactive thread draws nothing (it used to wrap to (63, 63))
    assert [p.get_height() for p in fig.axes[0].patches if p.get_fill()] == [31] + [0] * 31  # (+ a conflict outline)
    pat.coords[0, 1] = (-5, 0)  # coords is an array: checked again where it is used
    with pytest.raises(ValueError, match=r"\(row, col\) = \(-5, 0\)"):
        L.bank_conflicts(plain, pat, 2)
    with pytest.raises(ValueError, match=r"\(row, col\) = \(-5, 0\)"):
        viz.draw_conflicts([plain], pat, 2)


@pytest.fixture(scope="module")
def bf16_64x64():
    return dict(flat=L.hopper_smem_layout(64, 64, "bf16"), staged=L.hopper_smem_layout(64, 64, "bf16", stages=3))


_BAD_ARGUMENTS = {  # id: (call on the bf16_64x64 layouts, exception, message)
    "bank_conflicts elem_bytes=0": (lambda t: L.bank_conflicts(t["flat"], L.column_read(), 0), ValueError,
                                    r"elem_bytes=0: .*one of \(1, 2, 4, 8\)"),
    "bank_conflicts elem_bytes=3": (lambda t: L.bank_conflicts(t["flat"], L.column_read(), 3), ValueError,
                                    r"elem_bytes=3: .*one of \(1, 2, 4, 8\)"),
    "bank_conflicts elem_bytes='2'": (lambda t: L.bank_conflicts(t["flat"], L.column_read(), "2"), TypeError,
                                      "elem_bytes='2'"),
    "bank_conflicts 32-byte vectors": (lambda t: L.bank_conflicts(t["flat"], L.row_vector_read(8, 0, vec=16), 2),
                                       ValueError, r"\(vec=16 x elem_bytes=2\)=32: expected bytes per thread of one "
                                                   r"shared-memory load/store, one of"),
    "request_wavefronts access_bytes=0": (lambda t: L.request_wavefronts(np.zeros(32, dtype=np.int64), 0),
                                          ValueError, r"access_bytes=0: expected bytes per thread.*\(1, 2, 4, 8, 16\)"),
    "pattern_from_tv vec=0": (lambda t: L.pattern_from_tv(L.row_major(32, 4), (4, 32), 0, "x"), ValueError,
                              r"vec=0: expected an integer >= 1"),
    "bank_conflicts stage=5 of 3": (lambda t: L.bank_conflicts(t["staged"], L.column_read(), 2, stage=5),
                                    ValueError, r"stage=5: .*has 3 stages; expected None or 0\.\.2"),
    "bank_table stage=9 of 3": (lambda t: L.bank_table(t["staged"], 2, stage=9), ValueError,
                                r"stage=9: .*has 3 stages"),
    "bank_conflicts stage=2 without stages": (lambda t: L.bank_conflicts(t["flat"], L.column_read(), 2, stage=2),
                                              ValueError, r"stage=2: .*has no stage mode; expected None or 0"),
    "bank_table stage=2 without stages": (lambda t: L.bank_table(t["flat"], 2, stage=2), ValueError,
                                          "has no stage mode"),
    "hopper_smem_layout major=None": (lambda t: L.hopper_smem_layout(64, 64, "bf16", major=None), TypeError,
                                      r"major=None: expected one of \['K', 'row', 'MN', 'col'\]"),
    "hopper_smem_layout stages=0": (lambda t: L.hopper_smem_layout(64, 64, "bf16", stages=0), ValueError,
                                    "stages=0"),
    "tma_box fp32 on a bf16 layout": (lambda t: L.tma_box(t["flat"], "fp32"), ValueError,
                                      r"dtype='fp32' \(4 B elements\) does not match .* 64 elements, i\.e\. 2-byte"),
    "tma_box fp8 on a bf16 layout": (lambda t: L.tma_box(t["staged"], "fp8"), ValueError, "does not match"),
    "elem_bytes of a 4-bit type": (lambda t: L.elem_bytes(cutlass.Float4E2M1FN), ValueError, "4 bits"),
    "request_wavefronts 33 threads": (lambda t: L.request_wavefronts(np.arange(33) * 4, 4), ValueError,
                                      "at most 32 threads, got 33"),
    "request_wavefronts float addresses": (lambda t: L.request_wavefronts(np.arange(32) * 4.5, 4), ValueError,
                                           "integer byte addresses"),
    "request_wavefronts unaligned": (lambda t: L.request_wavefronts(np.arange(32) * 4 + 1, 4), ValueError,
                                     "multiples of access_bytes=4"),
    "request_wavefronts negative": (lambda t: L.request_wavefronts(np.arange(32) * 4 - 8, 4), ValueError,
                                    r"must be >= 0 .*got -8"),
    "SmemBudget negative buffer": (lambda t: L.SmemBudget({"a": -100}, 2, 50), ValueError,
                                   r"buffers\['a'\]=-100"),
    "SmemBudget 0 stages": (lambda t: L.SmemBudget({"a": 100}, 0, 50), ValueError, "stages=0"),
    "StaticLayout stride of another rank": (lambda t: L.StaticLayout((4, 4), (1,)), ValueError, "not congruent"),
    "StaticLayout shape 0": (lambda t: L.StaticLayout((4, 0), (1, 4)), ValueError, r"shape entry 1=0"),
    "StaticLayout float stride": (lambda t: L.StaticLayout((4, 4), (1, 4.0)), TypeError, r"stride entry 1=4\.0"),
    "SwizzleSpec negative bits": (lambda t: L.SwizzleSpec(-1, 4, 3), ValueError, r"SwizzleSpec\.bits=-1"),
}


@pytest.mark.parametrize("case", sorted(_BAD_ARGUMENTS))
def test_bad_arguments_raise_a_clear_error(case, bf16_64x64):
    """Each used to raise ZeroDivisionError / IndexError / AttributeError, or to return a wrong answer."""
    call, exc, message = _BAD_ARGUMENTS[case]
    with pytest.raises(exc, match=message):
        call(bf16_64x64)


def test_the_allowed_stage_and_dtype_arguments_still_work(bf16_64x64):
    flat, staged = bf16_64x64["flat"], bf16_64x64["staged"]
    assert L.bank_conflicts(staged, L.row_vector_read(8, 0, 8), 2, stage=2).wavefronts == [1]
    assert L.bank_conflicts(flat, L.row_vector_read(8, 0, 8), 2, stage=0).wavefronts == [1]  # its own stage 0
    assert np.array_equal(L.bank_table(staged, 2, stage=2), L.bank_table(staged, 2, stage=None))
    assert L.tma_box(L.hopper_smem_layout(64, 64, "fp32"), "fp32")["box"] == (64, 32)
    assert L.tma_box(L.row_major(64, 64), "fp32")["bytes"] == 64 * 64 * 4  # no swizzle: no element size to check


def test_readme_names_the_smem_limit_each_report_uses():
    """layouts/README.md used to say 232448 B was used everywhere; the ranker_bwd report uses 1 KiB less."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "layouts", "README.md")).read()
    assert "used everywhere" not in readme
    limits = {"ranker_fwd": KL.ranker_fwd_layouts().budget.limit, "ranker_bwd": KL.ranker_bwd_layouts().budget.limit,
              "hc_mix": KL.hc_mix_tma_layouts().budget.limit}
    assert limits["ranker_bwd"] == limits["ranker_fwd"] - 1024
    for report, limit in limits.items():
        row = [line for line in readme.splitlines() if line.startswith(f"| `{report}` | {limit} B")]
        assert len(row) == 1, (report, limit)


def test_session_17_tile_shape_review():
    """A newcomer adding a tile shape (session 17): setmaxnreg's range is checked in validate() (the compiler
    rejected 8/16 with an MLIR error), the backward's smem rejection lists its buffers and names the lever,
    the ranker layouts refuse dtypes the kernels do not take, and the backward budget names the LSE/dPsum
    staging buffers instead of counting them as alignment."""
    import dataclasses

    from cute_kernels.kernels import ranker_bwd as rb, ranker_fwd as rf
    from cute_kernels.layouts import kernel_layouts as kl

    for base, kw in ((rf.CONFIGS[128], dict(producer_regs=8, consumer_regs=248)),
                     (rb.CONFIGS[128], dict(producer_regs=16))):
        with pytest.raises(ValueError, match=r"setmaxnreg takes a multiple of 8 in \[24, 256\]"):
            dataclasses.replace(base, **kw)
    # the hint names what fits: fewer Q/dO stages, or one sdS^T buffer where that keeps more of them
    with pytest.raises(ValueError, match=r"sdS\^T 2 x 128x80.*fits with stages=1 \(or ds_stages=1\)"):
        dataclasses.replace(rb.CONFIGS[128], tile_m=80).validate()
    with pytest.raises(ValueError, match=r"sP\^T 1 x 64x64.*fits with stages=1$"):  # D=256: only one stage fits
        dataclasses.replace(rb.CONFIGS[256], stages=2, ds_stages=1)
    for fn in (kl.ranker_fwd_layouts, kl.ranker_bwd_layouts):
        with pytest.raises(ValueError, match="bf16 or fp16"):
            fn(None, "fp32")
    budget = kl.ranker_bwd_layouts().budget
    assert any(k.startswith("sLSE + sdPsum") for k in budget.buffers)
    assert budget.total == rb.CONFIGS[128].smem_bytes()


def test_trace_converts_tuples_and_refuses_objects_that_cannot_leave_the_trace():
    """A builder returning a tuple gets StaticLayouts back (a raw DSL layout used after the trace crashed the
    process); a DSL object that is not a layout (a tensor, ...) raises TypeError; plain values pass."""
    import cutlass.cute as cute

    from cute_kernels.layouts import StaticLayout, trace

    a, b, n, t = trace(lambda: (cute.make_layout(4), cute.make_layout((2, 8)), 3, (1, 2)))
    assert isinstance(a, StaticLayout) and isinstance(b, StaticLayout) and b.cosize == 16
    assert (n, t) == (3, (1, 2))
    with pytest.raises(TypeError, match="only inside the DSL's trace"):
        trace(lambda: {"t": cute.make_identity_tensor((4, 4))})


def test_drawing_arguments_are_checked():
    """Bad sizes are clear errors before drawing (a negative ``rows`` used to drop the last row silently, a zero
    region and a tile too small for the TV layout failed deep in numpy); zooms beyond the picture draw it whole."""
    from cute_kernels.layouts import viz

    sw = L.hopper_smem_layout(64, 64, "bf16", stages=2)
    for bad in (-1, 0):
        with pytest.raises(ValueError, match="rows"):
            viz.draw_banks(sw, 2, rows=bad)
    with pytest.raises(TypeError, match="rows"):
        viz.draw_banks(sw, 2, rows=2.5)
    with pytest.raises(ValueError, match="region"):
        viz.draw_offsets(sw, elem_bytes=2, region=(0, 4))
    with pytest.raises(ValueError, match="region"):
        viz.draw_offsets(sw, elem_bytes=2, region=4)
    with pytest.raises(TypeError, match="region"):
        viz.draw_offsets(sw, elem_bytes=2, region=(4, 2.5))
    assert viz.draw_offsets(L.row_major(4, 8), region=(16, 32)).axes[0].images[0].get_array().shape == (4, 8)
    assert viz.draw_banks(L.row_major(4, 64), 2, rows=100).axes[0].images[0].get_array().shape == (4, 64)
    with pytest.raises(ValueError, match="beyond the 4 x 4 tile"):
        viz.draw_tv(L.row_major(32, 8), (4, 4))
    with pytest.raises(ValueError, match="tile"):
        viz.draw_tv(L.row_major(32, 8), 16)
    with pytest.raises(ValueError, match="region"):
        viz.draw_tv(L.row_major(32, 8), (16, 16), region=(-1, 4))
    with pytest.raises(ValueError, match="at least one layout"):
        viz.draw_conflicts([], L.row_vector_read(8, 0, 8), 2)
    with pytest.raises(TypeError, match="StaticLayout"):
        viz.draw_conflicts(["sK"], L.row_vector_read(8, 0, 8), 2)
    assert len(viz.draw_conflicts(sw, L.row_vector_read(8, 0, 8), 2).axes) == 1


def test_ranker_bwd_dq_store_width_is_the_compiled_one():
    """The layouts model dQ's accumulator stores at the width the compiled mainloop issues them: 8-byte
    ``st.shared.v2.b32`` without ``dq_swap_ab`` (D=64), 4-byte ``st.shared.b32`` with it (D=128; session 61: D=64's
    were modelled as 4-byte stores, halving the swizzle's figures)."""
    import re

    import torch
    from cute_kernels.kernels import ranker_bwd as rb
    from cute_kernels.layouts.kernel_layouts import ranker_bwd_layouts
    from cute_kernels.runtime.cache import compile_record

    for d in (64, 128):
        cfg = rb.config_for(d, False)
        rb._compile(torch.bfloat16, cfg, 1, "none", False)
        ptx = compile_record(rb.NAME, (str(torch.bfloat16), cfg, 1, "none", False)).ptx
        stores = set(re.findall(r"st\.shared\.(?:v2\.)?b32", ptx))
        model = ranker_bwd_layouts(f"head_dim={d}").conflicts[2]
        assert model.access_bytes == (4 if cfg.dq_swap_ab else 8), (d, model)
        assert stores == ({"st.shared.b32"} if cfg.dq_swap_ab else {"st.shared.v2.b32"}), (d, stores)


def test_layouts_review_mends(tmp_path):
    """Session 61's layouts review: an unknown hc_mix dtype is a ValueError (was a TypeError, unlike the rankers'),
    and a swizzled layout drawn without ``elem_bytes`` says its picture is not the kernel's addressing."""
    from cute_kernels import layouts as L
    from cute_kernels.layouts import viz
    from cute_kernels.layouts.kernel_layouts import write_report

    with pytest.raises(ValueError, match="hc_mix takes bf16 x only"):
        write_report("hc_mix", None, str(tmp_path / "h"), dtype="float64")
    sw = L.hopper_smem_layout(128, 64, "bf16")
    assert "functional offsets" in viz.draw_offsets(sw, region=(8, 8)).axes[0].get_title()
    assert viz.draw_offsets(sw, elem_bytes=2, region=(8, 8)).axes[0].get_title().startswith("offsets of")


def test_compile_record_refuses_bad_arguments():
    """``ranker_compile_record`` (README's step 4 of a new tile shape) checks its arguments before compiling: a GQA
    ratio of 0 reached the compiler (an MLIR division by zero), -2 and True compiled and were cached, and float32
    raised a bare KeyError (session 72, a newcomer's findings)."""
    from cute_kernels.kernels import ranker_fwd as rf

    cfg = rf.CONFIGS[128]
    for kw, err, msg in ((dict(qhead_per_kvhead=0), ValueError, "qhead_per_kvhead=0 must be in"),
                         (dict(qhead_per_kvhead=-2), ValueError, "qhead_per_kvhead=-2"),
                         (dict(qhead_per_kvhead=True), TypeError, "qhead_per_kvhead must be an int"),
                         (dict(dtype="fp32"), ValueError, "bf16 or fp16 only"),
                         (dict(dtype=rf.torch.float32), ValueError, "bf16 or fp16 only"),
                         (dict(varlen=1), TypeError, "varlen must be a bool"),
                         (dict(cap_method="exp"), ValueError, "cap_method must be one of")):
        with pytest.raises(err, match=msg):
            KL.ranker_compile_record(cfg, **kw)
    with pytest.raises(TypeError, match="config must be a RankerFwdConfig"):
        KL.ranker_compile_record("head_dim=128")
    with pytest.raises(ValueError, match="bf16 or fp16 only"):
        KL.ranker_run_config(cfg, "fp32")
