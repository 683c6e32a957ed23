"""CPU tests of the TMA + WGMMA hc_mix kernel (issue 7): compile, features, budget, and the accuracy of
its summation order (float32 emulation vs float64)."""

import dataclasses
import re

import pytest
import torch

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass is imported)
from cute_kernels.kernels import hc_mix as base
from cute_kernels.kernels import hc_mix_walk as walk
from cute_kernels.kernels.hc_mix_shared import SMEM_LIMIT
from cute_kernels.kernels import hc_mix_tma as mod
from cute_kernels.runtime.artifacts import find_features, PTX_FEATURES
from cute_kernels.runtime.cache import compile_record
from seeding import generator


CONFIGS = [mod.HcMixTmaConfig(), *(mod.config_for(m) for m in mod.LEVEL_EXAMPLE_M)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c.cta_level}-t{c.tile_m}s{c.stages}")
def test_compiles_with_tma_wgmma_setmaxnreg_and_no_spills(cfg):
    mod._compile(cfg)
    rec = compile_record(mod.NAME, cfg)
    feats = rec.ptx_features
    for f in ("wgmma", "tma load (cp.async.bulk.tensor)", "setmaxnreg", "mbarrier"):
        assert f in feats, (f, feats)
    assert "local memory (spill)" not in find_features(rec.ptx, PTX_FEATURES)
    assert all(not r.stack_bytes for r in rec.resources)
    if rec.sass:
        assert {"HGMMA", "UTMALDG", "USETMAXREG"} <= set(rec.sass_features)
        assert "LDL/STL (local memory)" not in rec.sass_features
    assert "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16" in rec.ptx
    assert "ld.shared.v4" in rec.ptx  # the squares read 16-byte vectors
    # the split warps: per k tile, 2 items of 8 columns per thread: 3 cvt.rn.bf16x2.f32 per pair of columns, three
    # 16-byte piece stores per item, the proxy fence before the arrive (WGMMA reads what they stored)
    assert rec.ptx.count("cvt.rn.bf16x2.f32") == 24
    assert len(re.findall(r"st\.shared\.v4\.b32", rec.ptx)) == 6
    assert "fence.proxy.async.shared::cta" in rec.ptx
    # the epilogue's reciprocals: rcp.approx / rsqrt.approx, no IEEE division or sqrt (slow-path branches)
    assert "rcp.approx" in rec.ptx and "rsqrt.approx" in rec.ptx
    assert "div.rn.f32" not in rec.ptx and "sqrt.rn.f32" not in rec.ptx
    # the walk and the reduction kernel, or the walk alone with the fused epilogue (no clusters, no DSMEM)
    assert rec.ptx.count(".entry") == (1 if cfg.fused_epilogue else 2)
    assert "barrier.cluster" not in rec.ptx and "ld.shared::cluster" not in rec.ptx
    assert "griddepcontrol.launch_dependents" in rec.ptx and "griddepcontrol.wait" in rec.ptx  # PDL
    if cfg.overlap:  # the second tile of a pair stays in flight: wait_group 1, then 0
        assert rec.ptx.count("wgmma.wait_group.sync.aligned \t1;") == 1
        if rec.sass:  # ptxas kept it (a serialized pipeline has only DEPBAR.LE gsb0, 0x0)
            assert "DEPBAR.LE gsb0, 0x1" in rec.sass


@pytest.mark.parametrize("kw,match", [(dict(tile_k=32), "tile_k"),
                                      (dict(stages=1), r"stages=1: must be in \[2, 8\]"),
                                      (dict(stages=0), r"stages=0: must be in \[2, 8\]"),  # (said load_group)
                                      (dict(tree=(3, 2)), "fan-outs"), (dict(tree=(32,)), "fan-outs"),
                                      (dict(tree=()), "fan-outs"), (dict(tree=(16, 16)), "at most 128"),
                                      (dict(cta_level=6), "cta_level"), (dict(cta_level=-1), "cta_level"),
                                      (dict(consumer_regs=100), "multiple of 8"),
                                      (dict(stages=8, consumer_regs=240), "register split"),
                                      (dict(producer_regs=32, consumer_regs=240), "register split"),
                                      (dict(tile_m=192), "tile_m"), (dict(reduce_rows=12), "reduce_rows"),
                                      (dict(tile_m=256, consumer_regs=176), "needs >="),
                                      (dict(tile_m=256, cta_level=1, consumer_regs=232), "more than the 232"),
                                      (dict(overlap=True, cta_level=0, consumer_regs=176), "needs >="),
                                      (dict(tile_m=256, overlap=True), "overlap"),
                                      (dict(producer_regs=24), "split warps"),
                                      (dict(load_group=0), "load_group"), (dict(stages=4, load_group=5), "load_group"),
                                      (dict(stages=4, load_group=4, overlap=True, cta_level=2), "hang")])
def test_config_rejections(kw, match):
    with pytest.raises(ValueError, match=match):
        mod.HcMixTmaConfig(**kw).validate()


def test_smem_message_names_the_stages_that_fit():
    with pytest.raises(ValueError, match="at most 4 stages fit at tile_m=256"):
        mod.HcMixTmaConfig(tile_m=256).validate()
    with pytest.raises(ValueError, match="at most 7 stages fit at tile_m=128"):
        mod.HcMixTmaConfig(stages=8).validate()
    mod.HcMixTmaConfig(tile_m=256, stages=4, cta_level=5).validate()
    mod.HcMixTmaConfig(stages=7).validate()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_shipped_configs_fit_and_share_one_tree(cfg):
    cfg.validate()
    assert cfg.smem_bytes() <= SMEM_LIMIT
    assert cfg.tree == mod.TREE  # the tree is part of the bits


def test_config_for_follows_the_wave_model():
    got = {m: mod.config_for(m).ctas_per_tile for m in (0, 1, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)}
    assert got == {0: 64, 1: 64, 128: 64, 256: 64, 512: 32, 1024: 16, 2048: 8, 4096: 4, 8192: 4, 16384: 1}
    for m in (1, 512, 4096, 16384):
        cfg = mod.config_for(m)
        assert cfg.consumer_regs == 0 and cfg.consumer_registers == cfg.min_consumer_regs()
        assert cfg.overlap == (cfg.cta_level <= 2)  # paired k tiles where a CTA walks 8+ splits
    assert {mod.config_for(m).cta_level for m in mod.LEVEL_EXAMPLE_M} == set(range(len(mod.TREE) + 1))
    assert mod.config_for(17 * 128).ctas_per_tile == 16  # 17 row tiles: 272 CTAs in 3 waves, not 136 in 2
    assert mod.config_for(1025).ctas_per_tile == 8  # 9 row tiles: one wave of 72, not 288 in 3
    rows = {m: mod.config_for(m).reduce_rows for m in (1, 512, 1024, 4096, 16384)}
    assert rows == {1: 8, 512: 8, 1024: 16, 4096: 16, 16384: 16}  # 8 where a sum folds 32+ node sums
    assert all(mod.config_for(m).l2_hints and mod.config_for(m).pdl for m in mod.LEVEL_EXAMPLE_M)


def test_a_callers_config_is_checked_before_anything_is_sized(monkeypatch):
    """launch validates a caller's config first (a bad one used to reach the workspace arithmetic:
    ZeroDivisionError, unhashable lists, a workspace sized for a cta_level past the tree)."""
    monkeypatch.setattr(mod, "run_compiled", lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(24, 64)
    for kw, exc in ((dict(tile_m=0), ValueError), (dict(tree=[4, 2]), TypeError), (dict(cta_level=9), ValueError),
                    (dict(tile_m="128"), TypeError)):
        with pytest.raises(exc):
            mod.launch(x, w, torch.ones(3), torch.zeros(24), 20, 1e-6, 1e-6, config=mod.HcMixTmaConfig(**kw))
    with pytest.raises(ValueError, match="232"):
        mod.HcMixTmaConfig(tile_m=256, cta_level=1, consumer_regs=232).validate()
    with pytest.raises(ValueError, match="fan-outs"):
        mod.emulate_mix(x, w, mod.HcMixTmaConfig(tree=(3,)))


@pytest.mark.parametrize("m,k", [(5, 2048), (3, 20480), (2, 1344)])
def test_summation_order_meets_the_accuracy_target(m, k):
    """a = x . hc_fn^T summed the kernel's way (float32 chunks of 64, three bf16 pieces, the tree's order)
    is within the issue's 2e-6 norm-wise of float64; the sum of squares within 1e-6."""
    g = generator(11, device="cpu")
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(24, k, generator=g) * 0.05
    got = mod.emulate_mix(x, w)
    a64 = x.double() @ w.double().t()
    sq64 = (x.double() ** 2).sum(-1)
    err_a = ((got[:, :24].double() - a64).norm() / a64.norm()).item()
    err_sq = ((got[:, 24].double() - sq64).abs() / sq64).max().item()
    assert err_a <= 2e-6, err_a
    assert err_sq <= 1e-6, err_sq


def test_emulation_is_row_independent():
    g = generator(12, device="cpu")
    x = torch.randn(6, 1024, generator=g).bfloat16()
    w = torch.randn(24, 1024, generator=g)
    assert torch.equal(mod.emulate_mix(x, w)[2:3], mod.emulate_mix(x[2:3], w))


def test_register_split_bound_is_the_launch_pool():
    """setmaxnreg redistributes the registers the launch gave the CTA (384 x 168 = 64512), not 65536: a
    split above that makes the consumers' setmaxnreg.inc retry forever."""
    from cute_kernels.kernels import ranker_bwd, ranker_fwd, sm90_helpers

    assert sm90_helpers.register_pool(384) == 64512
    sm90_helpers.check_register_split(24, 240, 2)  # the ranker kernels' split: exactly the pool
    for cls in (ranker_fwd.RankerFwdConfig, ranker_bwd.RankerBwdConfig):  # (refused when constructed)
        with pytest.raises(ValueError, match="register split"):
            cls(producer_regs=32)


def test_mix_buffer_is_checked_before_launch(monkeypatch):
    """The epilogue writes mix[row, 0:25] for every row: a short, mistyped or strided mix is refused
    (the tensor rules of the op are stubbed so that the CPU tensors get as far as the mix rule)."""
    import functools

    from cute_kernels.runtime.validate import check_tensor

    monkeypatch.setattr(mod, "_validate", lambda *a, **k: None)
    monkeypatch.setattr(mod, "check_tensor", functools.partial(check_tensor, cuda=False))
    monkeypatch.setattr(mod, "run_compiled", lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    x, w, s, b = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(24, 64), torch.ones(3), torch.zeros(24)
    for bad in (torch.zeros(3, 25), torch.zeros(4, 25, dtype=torch.float64), torch.zeros(25, 4).t()):
        with pytest.raises((ValueError, TypeError)):
            mod.hc_mix_sinkhorn_tma(x, w, s, b, mix=bad)
    with pytest.raises(ValueError, match="mix shares memory with hc_fn"):  # written while hc_fn is read
        mod.hc_mix_sinkhorn_tma(x, w, s, b, mix=w.view(-1)[:100].view(4, 25))
    with pytest.raises(AssertionError, match="launched"):  # a right-sized mix gets to the launch
        mod.hc_mix_sinkhorn_tma(x, w, s, b, mix=torch.zeros(4, 25))


def test_a_workspace_past_32_bit_offsets_is_refused(monkeypatch):
    """A caller's config with 128 CTAs per row tile makes a workspace of ceil(M / 128) * 128 * 128 rows of 25:
    past 2**31 elements at M ~ 671k (the op's limit is 1048560), which the kernels' 32-bit offsets would
    wrap; the shipped picks stay far below it."""
    monkeypatch.setattr(mod, "run_compiled", lambda *a, **k: "launched")
    cfg = mod.HcMixTmaConfig(tree=(16, 8), cta_level=2)
    args = (torch.empty(24, 64, device="meta"), torch.empty(3, device="meta"), torch.empty(24, device="meta"),
            20, 1e-6, 1e-6)
    with pytest.raises(ValueError, match="32-bit offsets"):
        mod.launch(torch.empty(700_000, 64, dtype=torch.bfloat16, device="meta"), *args, config=cfg)
    assert mod.launch(torch.empty(600_000, 64, dtype=torch.bfloat16, device="meta"), *args, config=cfg) == "launched"
    big = base.MAX_ROWS
    assert mod.workspace_rows(big, mod.config_for(big)) * base.SP_COLS < 2**31


@pytest.mark.parametrize("m", [1, 127, 300])
@pytest.mark.parametrize("with_mix", [False, True])
def test_launch_arguments_are_aligned(m, with_mix):
    """run_compiled (CPU tensors, the compiled kernel replaced by a recorder): every tensor argument
    starts 16-byte aligned (the compiled kernel needs it of x, hc_fn and the buffers made here)
    and the workspace has a row per (row tile, CTA, row), covering every row the
    reduction kernel reads (one row with the fused epilogue: config_for(16384))."""
    from cute_kernels.kernels.hc_mix import run_compiled

    for cfg in (mod.config_for(m) for m in mod.LEVEL_EXAMPLE_M):
        seen = []
        x = torch.zeros(m, 128, dtype=torch.bfloat16)
        mix = torch.zeros(m, 25) if with_mix else None
        run_compiled(lambda: lambda *a: seen.extend(a), x, torch.zeros(24, 128), torch.ones(3), torch.zeros(24), 20,
                     1e-6, 1e-6, mix=mix, workspace_rows=mod.workspace_rows(m, cfg))
        tensors = [a for a in seen if isinstance(a, torch.Tensor)]
        assert len(tensors) == 9 and all(t.data_ptr() % 16 == 0 for t in tensors)
        assert tensors[-1].shape == (mod.workspace_rows(m, cfg), 25)
        # the reduction reads the node sums of rows < m: up to the last row's tile (the fused epilogue:
        # none; its workspace is the raw-statistics dummy row)
        need = 1 if cfg.fused_epilogue else ((m - 1) // cfg.tile_m + 1) * cfg.ctas_per_tile * cfg.tile_m
        assert tensors[-1].shape[0] >= need


@pytest.mark.parametrize("tile_m", [128, 256])
def test_squares_read_the_swizzled_vectors_without_bank_conflicts(tile_m):
    """The squares' index math (vector v of row r at position v ^ (r % 8), stages tile_m * 128 bytes
    apart) matches the kernel's own smem layout, and the 16-byte reads are conflict-free where the
    earlier 2-byte reads of half a row per thread cost 4 wavefronts per access (the GPU showed it)."""
    import numpy as np
    from cutlass import BFloat16

    from cute_kernels.kernels import sm90_helpers as sm90
    from cute_kernels.layouts import AccessPattern, bank_conflicts, trace

    stages = 3
    lay = trace(lambda: sm90.smem_layout(BFloat16, tile_m, 64, stages)).named(f"sX {tile_m}x64x{stages}")
    table = lay.byte_offsets(2)  # (rows, cols, stages) -> byte offset
    for s in range(stages):
        for r in range(tile_m):
            for v in range(8):
                assert table[r, 8 * v, s] == ((s * tile_m + r) * 8 + (v ^ (r % 8))) * 16
    t = np.arange(32)
    vectors = AccessPattern("squares, 16-byte", np.array(
        [np.stack([t // 2, 8 * ((t % 2) * 4 + v)], -1) for v in range(4)]), vec=8)
    assert bank_conflicts(lay, vectors, 2).conflict_free
    scalars = AccessPattern("squares, 2-byte", np.array(
        [np.stack([t // 2, (t % 2) * 32 + c], -1) for c in range(32)]), vec=1)
    assert bank_conflicts(lay, scalars, 2).ratio == 4.0


def test_split_stores_follow_the_pieces_swizzle_without_bank_conflicts():
    """The split warps' index math (vector c of row n of stage s at ``(s * 72 + n) * 8 + (c ^ (n % 8))``)
    matches the kernel's own sW layout, and a warp's 16-byte stores (8 lanes per row) are conflict-free."""
    import numpy as np
    from cutlass import BFloat16

    from cute_kernels.kernels import sm90_helpers as sm90
    from cute_kernels.layouts import AccessPattern, bank_conflicts, trace

    stages = 3
    lay = trace(lambda: sm90.smem_layout(BFloat16, mod.N_W, 64, stages)).named(f"sW 72x64x{stages}")
    table = lay.byte_offsets(2)
    for s in range(stages):
        for n in range(mod.N_W):
            for c in range(8):
                assert table[n, 8 * c, s] == ((s * mod.N_W + n) * 8 + (c ^ (n % 8))) * 16
    t = np.arange(32)
    stores = AccessPattern("split stores", np.array([np.stack([t // 8, 8 * (t % 8)], -1)]), vec=8)
    assert bank_conflicts(lay, stores, 2).conflict_free


@pytest.mark.parametrize("kw", [dict(tile_m=256, stages=4, cta_level=5),
                                dict(overlap=True, tree=(8, 4), cta_level=1),
                                *(dict(overlap=True, cta_level=lv) for lv in range(6))])
def test_other_configs_compile_without_spills(kw):
    """256-row tiles (two m64 atoms per warpgroup) and overlap (two accumulators) at the register
    counts ``min_consumer_regs`` gives them; the workspace covers every (row tile, CTA, row)."""
    cfg = mod.HcMixTmaConfig(**kw)
    cfg.validate()
    mod._compile(cfg)
    rec = compile_record(mod.NAME, cfg)
    assert all(not r.stack_bytes for r in rec.resources) and len(rec.resources) == 2
    assert "local memory (spill)" not in find_features(rec.ptx, PTX_FEATURES)
    assert mod.workspace_rows(cfg.tile_m + 1, cfg) == 2 * cfg.ctas_per_tile * cfg.tile_m
    if cfg.overlap:  # the second tile of a pair stays in flight (wait_group 1); the odd tail waits for 0
        assert "wgmma.wait_group.sync.aligned \t1;" in rec.ptx
        if rec.sass:
            assert "DEPBAR.LE gsb0, 0x1" in rec.sass


def test_l2_hints_reach_the_tma_loads():
    """l2_hints: x's loads carry the evict-first policy word, the float32 hc_fn tiles' the evict-last one."""
    cfg = mod.HcMixTmaConfig(cta_level=1, l2_hints=True)
    mod._compile(cfg)
    ptx = compile_record(mod.NAME, cfg).ptx
    loads = [line for line in ptx.splitlines() if "cp.async.bulk.tensor" in line]
    assert len(loads) == 2 and all(".L2::cache_hint" in line for line in loads)
    assert str(mod.L2_EVICT_FIRST) in ptx and str(mod.L2_EVICT_LAST) in ptx
    assert mod.config_for(4096).l2_hints  # shipped on
    plain = mod.HcMixTmaConfig(cta_level=1, l2_hints=False)
    mod._compile(plain)
    plain_ptx = compile_record(mod.NAME, plain).ptx  # (the DSL always emits .L2::cache_hint, with policy 0)
    assert str(mod.L2_EVICT_FIRST) not in plain_ptx and str(mod.L2_EVICT_LAST) not in plain_ptx


@pytest.mark.parametrize("group", [1, 2, 3])
def test_load_group_issues_the_group_back_to_back(group):
    """load_group: the producer acquires the group's stages (both rings), then issues their TMA loads together (one
    x and one hc_fn load per stage of the group, then the single-tile loop of the last tiles: 2 * (group + 1) TMA
    instructions in the PTX; 2 for load_group=1, whose tail loop is empty and compiled away); spill-free."""
    cfg = dataclasses.replace(mod.config_for(4096), load_group=group)
    mod._compile(cfg)
    rec = compile_record(mod.NAME, cfg)
    assert rec.ptx.count("cp.async.bulk.tensor") == (2 if group == 1 else 2 * (group + 1))
    assert all(not r.stack_bytes for r in rec.resources)


@pytest.mark.parametrize("m", mod.LEVEL_EXAMPLE_M)
def test_config_for_groups_loads_where_it_pairs_k_tiles(m):
    """config_for: load_group 2 exactly where it sets overlap (a CTA walking 8 or more splits: the levels where
    the H100 measured it faster, session 68), 1 elsewhere; its group-2 configs compile spill-free."""
    cfg = mod.config_for(m)
    assert cfg.load_group == (2 if cfg.overlap else 1) and cfg.overlap == (cfg.cta_level <= 2)
    if cfg.load_group == 2:
        mod._compile(cfg)
        assert all(not r.stack_bytes for r in compile_record(mod.NAME, cfg).resources)


def test_the_tree_sets_the_bits():
    """Another tree is another summation order (other bits).  That the CTA level does not change the
    bits is a property of the kernel (the emulation has no CTAs): tests/gpu/test_hc_mix_gpu.py checks it
    on the GPU for every level."""
    g = generator(13, device="cpu")
    x = torch.randn(3, 4096, generator=g).bfloat16()
    w = torch.randn(24, 4096, generator=g)
    assert not torch.equal(mod.emulate_mix(x, w), mod.emulate_mix(x, w, mod.HcMixTmaConfig(tree=(8, 8), cta_level=2)))


@pytest.mark.parametrize("kw", [dict(stages=2.5), dict(tile_m=128.0), dict(overlap="no"), dict(tree=[4, 2]),
                                dict(cta_level=True), dict(tree=(4, 2.0))])
def test_config_field_types(kw):
    with pytest.raises(TypeError, match=next(iter(kw))):
        mod.HcMixTmaConfig(**kw).validate()


@pytest.mark.parametrize("m,exc", [(-5, ValueError), (3.7, TypeError), (True, TypeError), ("12", TypeError),
                                   (None, TypeError)])
def test_config_for_checks_m(m, exc):
    with pytest.raises(exc, match="m"):
        mod.config_for(m)


def test_launch_refuses_a_foreign_config_and_emulation_checks_k():
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(24, 64)
    for bad in ("fast", walk.HcMixConfig()):
        with pytest.raises(TypeError, match="HcMixTmaConfig"):
            mod.launch(x, w, torch.ones(3), torch.zeros(24), 20, 1e-6, 1e-6, config=bad)
    with pytest.raises(ValueError, match="multiple of 64"):
        mod.emulate_mix(torch.zeros(2, 100, dtype=torch.bfloat16), torch.zeros(24, 100))
    with pytest.raises(ValueError, match="hc_fn"):
        mod.emulate_mix(torch.zeros(128, dtype=torch.bfloat16), torch.zeros(24, 128))
    with pytest.raises(ValueError, match="hc_fn"):
        mod.emulate_mix(torch.zeros(2, 128, dtype=torch.bfloat16), torch.zeros(23, 128))
    meta = mod.emulate_mix(torch.zeros(3, 128, dtype=torch.bfloat16, device="meta"), torch.zeros(24, 128))
    assert meta.shape == (3, 25) and meta.device.type == "meta"


def test_walk_is_a_programmatic_dependent_launch():
    """pdl (default): the walk waits (griddepcontrol.wait) before its loads and the reduction kernel
    triggers the next launch after its own wait; pdl=False keeps only the walk -> reduction pair."""
    def ptx_of(cfg):
        mod._compile(cfg)
        return compile_record(mod.NAME, cfg).ptx

    shipped = mod.config_for(1)
    assert shipped.pdl
    ptx = ptx_of(shipped)
    assert ptx.count("griddepcontrol.wait") == 2 and ptx.count("griddepcontrol.launch_dependents") == 2
    plain = ptx_of(mod.dataclasses.replace(shipped, pdl=False))
    assert plain.count("griddepcontrol.wait") == 1 and plain.count("griddepcontrol.launch_dependents") == 2


def test_fused_epilogue_is_one_kernel_at_level_0_only():
    """config_for's level-0 config (M = 16384) runs the epilogue in the walk: one kernel, spill-free,
    writing the outputs (no reduction kernel and no workspace); other levels refuse it."""
    import dataclasses

    cfg = mod.config_for(16384)
    assert cfg.cta_level == 0 and cfg.fused_epilogue and not mod.config_for(4096).fused_epilogue
    mod._compile(cfg)
    rec = compile_record(mod.NAME, cfg)
    assert rec.ptx.count(".entry") == 1 and len(rec.resources) == 1
    assert all(not r.stack_bytes for r in rec.resources)
    assert "local memory (spill)" not in find_features(rec.ptx, PTX_FEATURES)
    assert "ex2.approx" in rec.ptx and "rcp.approx" in rec.ptx  # the epilogue's sigmoids and Sinkhorn
    assert mod.workspace_rows(16384, cfg) == 1
    with pytest.raises(ValueError, match="fused_epilogue needs cta_level=0"):
        dataclasses.replace(mod.config_for(4096), fused_epilogue=True).validate()


def test_level_range_brackets_config_for():
    """level_range(m): every M inside gets config_for(m)'s CTA level, the M just outside another; the
    pick is not monotone in M (level 0 at 16384, level 1 at 20000, level 0 again at 32768)."""
    for m in (0, 1, 300, 4096, 5000, 16384, 20000, 32768, 100000):
        lo, hi = mod.level_range(m)
        assert lo <= m <= hi
        level = mod.config_for(m).cta_level
        assert all(mod.config_for(v).cta_level == level for v in (lo, (lo + hi) // 2, hi))
        if lo > 0:
            assert mod.config_for(lo - 1).cta_level != level
        assert mod.config_for(hi + 1).cta_level != level
    assert [mod.config_for(m).cta_level for m in (16384, 20000, 32768)] == [0, 1, 0]
    with pytest.raises(ValueError):
        mod.level_range(-1)


def test_validate_says_when_a_config_needs_too_many_registers():
    """256-row tiles low in the tree need more registers than a consumer thread can get: the message
    says so and what to change (not a setmaxnreg range error about a count the user never set)."""
    for kw in (dict(tile_m=256, cta_level=0), dict(tile_m=256, cta_level=0, fused_epilogue=True),
               dict(tile_m=256, cta_level=2)):
        with pytest.raises(ValueError, match="registers per consumer thread.*tile_m=128"):
            mod.HcMixTmaConfig(**kw).validate()


def test_emulate_mix_refuses_non_bf16_x():
    with pytest.raises(TypeError, match="bfloat16"):
        mod.emulate_mix(torch.zeros(2, 64), torch.zeros(24, 64))
    with pytest.raises(TypeError, match="torch tensors"):
        mod.emulate_mix([[0.0] * 64], torch.zeros(24, 64))


def test_consumer_register_limit_is_the_split_with_the_smallest_producer():
    """MAX_CONSUMER_REGS (the limit the config errors name) is the largest consumer count that a split with the
    producer at MIN_PRODUCER_REGS passes; the overlap error names it (it named the ranker's 240)."""
    from cute_kernels.kernels import sm90_helpers

    sm90_helpers.check_register_split(mod.MIN_PRODUCER_REGS, mod.MAX_CONSUMER_REGS, 2)
    with pytest.raises(ValueError, match="register split"):
        sm90_helpers.check_register_split(mod.MIN_PRODUCER_REGS, mod.MAX_CONSUMER_REGS + 8, 2)
    with pytest.raises(ValueError, match=f"past the {mod.MAX_CONSUMER_REGS} registers"):
        mod.HcMixTmaConfig(tile_m=256, overlap=True)


def test_hc_configs_take_exact_ints_and_bools_as_every_config():
    """Both hc_mix configs check their fields with the shared check_config_fields (numpy ints and 0/1 for a bool
    are refused, naming the field and type), and the TMA tree must be a tuple."""
    import numpy as np

    for make, match in ((lambda: walk.HcMixConfig(m_tiles=np.int64(2)), "HcMixConfig.m_tiles"),
                        (lambda: walk.HcMixConfig(store_mix=1), "must be a bool"),
                        (lambda: mod.HcMixTmaConfig(pdl=1), "HcMixTmaConfig.pdl"),
                        (lambda: mod.HcMixTmaConfig(stages=np.int32(4)), "numpy.int32"),
                        (lambda: mod.HcMixTmaConfig(tree=[4, 2, 2, 2, 2]), "tuple")):
        with pytest.raises(TypeError, match=match):
            make()
