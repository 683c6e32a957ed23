"""GPU: hc_mix_sinkhorn against the float64 reference, bitwise batch invariance, graphs, poisoning."""

import math

import pytest
import torch
from seeding import FUZZ_CASES, RUN_SEED, case_rng, generator
from side_stream import run_behind_a_sleep

import cute_kernels
from cute_kernels.kernels import hc_mix as mod
from cute_kernels.kernels import hc_mix_walk as walk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(m, k, seed=0):
    g = generator(seed)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    hc_fn = torch.randn(mod.N_MIX, k, device="cuda", generator=g) / math.sqrt(k)
    hc_scale = torch.rand(3, device="cuda", generator=g) + 0.5
    hc_base = torch.randn(mod.N_MIX, device="cuda", generator=g)
    return x, hc_fn, hc_scale, hc_base


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("k", [20480, 7168])
@pytest.mark.parametrize("m", [1, 7, 128, 511, 512, 4096, 16384])
def test_matches_float64_reference(m, k):
    if m == 16384 and k == 7168:
        pytest.skip("one 16384-row case is enough")
    x, hc_fn, hc_scale, hc_base = _inputs(m, k, seed=m + k)
    # raw a and sum of squares against float64
    a, sq = mod.hc_mix_raw(x, hc_fn)
    xd = x.double()
    a64 = xd @ hc_fn.double().t()
    sq64 = (xd * xd).sum(-1)
    err_a = _rel(a, a64)
    assert err_a <= 2e-6, f"norm-wise error of a {err_a:.3g}"
    assert _rel(sq, sq64) <= 2e-6
    # outputs, poisoned first
    out = tuple(torch.full(s, float("nan"), device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4)))
    mod._launch(x, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, out=out)
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    for name, got, want in zip(("pre", "post", "comb"), out, ref):
        assert torch.isfinite(got).all(), name
        err = (got.double() - want.double()).abs().max().item()
        assert err <= 1e-5, f"{name}: max abs error {err:.3g}"
        assert _rel(got, want) <= 5e-6, f"{name}: norm-wise error {_rel(got, want):.3g}"
    print(f"M={m} K={k}: |a| err {err_a:.2e}, sq err {_rel(sq, sq64):.2e}, "
          + ", ".join(f"{n} {(g.double() - w.double()).abs().max().item():.2e}"
                      for n, g, w in zip(("pre", "post", "comb"), out, ref)))


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_public_op_is_deterministic(method):
    x, hc_fn, hc_scale, hc_base = _inputs(1000, 20480, seed=3)
    r1 = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    r2 = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    for a, b in zip(r1, r2):
        assert torch.equal(a, b)
    assert r1[0].shape == (1000, 4) and r1[1].shape == (1000, 4) and r1[2].shape == (1000, 4, 4)


@pytest.mark.parametrize("method", ["walk", "tma"])
@pytest.mark.parametrize("k", [20480, 7168])
def test_batch_invariant_bitwise(k, method):
    """Each row of a 4096-row call equals the same row alone and inside 513-row calls (the configs
    each method picks for those M differ: walk SMALL / MEDIUM, tma other CTA levels)."""
    x, hc_fn, hc_scale, hc_base = _inputs(4096, k, seed=11)
    full = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    rows = [0, 1, 17, 513, 2047, 4095]
    for r in rows:  # the same row alone
        one = cute_kernels.hc_mix_sinkhorn(x[r:r + 1].clone(), hc_fn, hc_scale, hc_base, method=method)
        for got, want in zip(one, full):
            assert torch.equal(got[0], want[r]), f"row {r} alone differs"
    for start in (0, 1000, 3583):  # 513 rows at odd offsets (other tile neighbours)
        part = cute_kernels.hc_mix_sinkhorn(x[start:start + 513].clone(), hc_fn, hc_scale, hc_base, method=method)
        for got, want in zip(part, full):
            assert torch.equal(got, want[start:start + 513]), f"rows {start}+513 differ"
    if method == "walk":  # every walk config gives the same raw bits
        a_full, sq_full = mod.hc_mix_raw(x, hc_fn)
        for cfg in walk.SHIPPED:
            a, sq = mod.hc_mix_raw(x, hc_fn, config=cfg)
            assert torch.equal(a, a_full) and torch.equal(sq, sq_full), cfg


def test_empty_and_odd_shapes():
    x, hc_fn, hc_scale, hc_base = _inputs(0, 20480)
    for method in ("walk", "tma"):
        pre, post, comb = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
        assert pre.shape == (0, 4) and post.shape == (0, 4) and comb.shape == (0, 4, 4)
    for m, k in ((3, 64), (33, 192), (65, 2112)):
        x, hc_fn, hc_scale, hc_base = _inputs(m, k, seed=m)
        out = tuple(torch.full(s, float("nan"), device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4)))
        mod._launch(x, hc_fn, hc_scale, hc_base, 7, 1e-5, 1e-4, out=out)
        ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base, 7, 1e-5, 1e-4)
        for got, want in zip(out, ref):
            assert (got.double() - want.double()).abs().max().item() <= 1e-5


def test_row_stride_and_does_not_write_past_the_end():
    base_x = torch.randn(40, 20480 + 64, device="cuda").bfloat16()
    x = base_x[:, :20480]  # row stride 20544 elements (16-byte aligned)
    _, hc_fn, hc_scale, hc_base = _inputs(1, 20480)
    buf = torch.full((50, 4), 7.0, device="cuda")
    out = (buf[:40], torch.empty(40, 4, device="cuda"), torch.empty(40, 4, 4, device="cuda"))
    mod._launch(x, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, out=out)
    assert torch.all(buf[40:] == 7.0)
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    assert (out[0] - ref[0]).abs().max().item() <= 1e-5
    for got, want in zip(cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method="tma"), ref):
        assert (got.double() - want.double()).abs().max().item() <= 1e-5  # the TMA descriptor's row stride


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_cuda_graph_capture(method):
    x, hc_fn, hc_scale, hc_base = _inputs(128, 20480, seed=5)
    eager = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    want = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    for a, b, e in zip(out, want, eager):
        assert torch.equal(a, b) and not torch.equal(a, e)


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_torch_compile(method):
    x, hc_fn, hc_scale, hc_base = _inputs(64, 1024, seed=9)
    f = torch.compile(lambda *a: cute_kernels.hc_mix_sinkhorn(*a, method=method), fullgraph=True)
    for a, b in zip(f(x, hc_fn, hc_scale, hc_base),
                    cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_opcheck(method):
    """``torch.library.opcheck`` of ``torch.ops.cute_kernels.hc_mix_sinkhorn``: schema (no input mutated or
    aliased), the fake's output metadata against the real op's, and the op under AOT dispatch with dynamic shapes."""
    x, hc_fn, hc_scale, hc_base = _inputs(300, 2048, seed=27)
    torch.library.opcheck(mod.hc_mix_sinkhorn.op, (x, hc_fn, hc_scale, hc_base), dict(method=method))


@pytest.mark.parametrize("m", [1, 300, 4096])
@pytest.mark.parametrize("method", ["walk", "tma"])
def test_runs_on_the_current_stream(method, m):
    """On a side stream whose x and hc_fn are written there behind a long sleep
    (:func:`side_stream.run_behind_a_sleep`), every kernel of the call (the tma method's walk and its PDL-launched
    reduction kernel) launches on that stream, without waiting for the device: the bits of the default stream's
    call."""
    x, hc_fn, hc_scale, hc_base = _inputs(m, 2048, seed=69)
    want = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    got = run_behind_a_sleep(lambda fill: cute_kernels.hc_mix_sinkhorn(fill(x), fill(hc_fn), hc_scale, hc_base,
                                                                      method=method))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_inference_mode(method):
    """Under ``torch.inference_mode()`` (serving), on inference tensors and on normal ones: the bits of the call
    outside it."""
    x, hc_fn, hc_scale, hc_base = _inputs(300, 2048, seed=65)
    want = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    with torch.inference_mode():
        inf = [t.clone() for t in (x, hc_fn, hc_scale, hc_base)]
        for args in (inf, (x, hc_fn, hc_scale, hc_base)):
            for a, b in zip(cute_kernels.hc_mix_sinkhorn(*args, method=method), want):
                assert torch.equal(a, b)


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_reduce_overhead_with_weights_changed_in_place(method):
    """torch.compile(mode="reduce-overhead") (CUDA-graph trees: warm-up, recording, replays) with hc_fn a
    parameter changed in place between calls, as an optimizer step does: every call gives the eager op's bits
    on the current weights.  (Session 34 found the old pre-split cache wrong here both ways: a split cached at
    the warm-up, where the compiled call comes first, was the trees' pool memory (their default asserts failed
    on it), and a graph recorded from the cache, filled by the eager call just before, replayed stale pieces
    after the next update.)"""
    torch._dynamo.reset()
    x, hc_fn, hc_scale, hc_base = _inputs(64, 2048, seed=31)

    class Mix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hc_fn = torch.nn.Parameter(hc_fn.clone(), requires_grad=False)

        def forward(self, x):
            return cute_kernels.hc_mix_sinkhorn(x, self.hc_fn, hc_scale, hc_base, method=method)

    mix = Mix()
    compiled = torch.compile(mix, mode="reduce-overhead", fullgraph=True)
    g = generator(32)
    for step in range(5):
        if step == 0:  # the warm-up: a cache miss, so the old code cached a split made from the trees' pool
            got = [t.clone() for t in compiled(x)]
            want = mix(x)
        else:  # the eager call fills the cache first: step 1 records, later steps replay
            want = [t.clone() for t in mix(x)]
            got = compiled(x)
        for name, a, b in zip(("pre", "post", "comb"), got, want):
            assert torch.equal(a, b), f"step {step}: {name}"
        with torch.no_grad():
            mix.hc_fn.mul_(0.5).add_(torch.randn(mix.hc_fn.shape, device="cuda", generator=g) / 64)
    torch._dynamo.reset()


@pytest.mark.parametrize("k,row_stride", [(64, 64), (192, 256), (2048, 2052), (7232, 7232)])
def test_the_walks_split_of_hc_fn_is_exact(k, row_stride):
    """The TMA walk's split warps make the torch split's pieces (split_pieces): with x the identity, row r of
    the raw mix is ((lo + mid) + hi) of hc_fn's column r in float32 (each product with 1.0 exact, every other
    term zero), for values over a wide range (1e-20 to 1e20, both signs, zeros, float32's last bits), hc_fn
    with a padded row stride, mix NaN-poisoned."""
    from cute_kernels.kernels import hc_mix_tma as tma

    g = generator(k + row_stride)
    base = torch.empty(mod.N_MIX, row_stride, device="cuda")
    w = base[:, :k]
    mag = torch.pow(10.0, torch.empty(mod.N_MIX, k, device="cuda").uniform_(-20, 20, generator=g))
    w.copy_(torch.randn(mod.N_MIX, k, device="cuda", generator=g).sign() * mag)
    w[0, :6] = torch.tensor([0.0, -0.0, 1.0, 1 + 2**-23, 1 - 2**-24, 3 * 2**-9], device="cuda")
    x = torch.eye(k, device="cuda", dtype=torch.bfloat16)
    mix = torch.full((k, mod.SP_COLS), float("nan"), device="cuda")
    _, _, hc_scale, hc_base = _inputs(1, 64, seed=3)
    tma.hc_mix_sinkhorn_tma(x, w, hc_scale, hc_base, mix=mix)
    lo, mid, hi = mod.split_pieces(w).float().view(3, mod.N_MIX, k)
    want = ((lo + mid) + hi).t()
    assert torch.equal(mix[:, :mod.N_MIX], want)  # (values: -0.0 == 0.0)
    assert torch.equal(mix[:, mod.N_MIX], torch.ones(k, device="cuda"))


@pytest.mark.parametrize("m", [1, 300, 4096])
def test_weight_writes_are_always_seen(m):
    """method="tma" splits the float32 hc_fn inside the walk on every call: writes torch's version counter does
    not see (through .data, a fused Adam step) change the next call's result, eagerly and in a CUDA graph captured
    before them."""
    x, hc_fn, hc_scale, hc_base = _inputs(m, 2048, seed=51 + m)
    call = lambda w: cute_kernels.hc_mix_sinkhorn(x, w, hc_scale, hc_base)  # noqa: E731
    first = call(hc_fn)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(hc_fn)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(hc_fn)
    g = generator(52)
    hc_fn.data.copy_(torch.randn(hc_fn.shape, device="cuda", generator=g) / 45)  # (no version bump)
    p = torch.nn.Parameter(hc_fn)
    p.grad = torch.randn_like(p) / 10
    torch.optim.Adam([p], lr=0.05, fused=True).step()  # (a fused step: no version bump either)
    for got in (call(hc_fn), None):
        if got is None:
            graph.replay()
            torch.cuda.synchronize()
            got = captured
        want = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
        for a, w, f in zip(got, want, first):
            assert (a.double() - w.double()).abs().max().item() <= 1e-5 and not torch.equal(a, f)


def test_op_method_tma_is_the_tma_entry_point():
    """hc_mix_sinkhorn(method="tma") gives hc_mix_sinkhorn_tma's bits, batch invariant, near float64."""
    from cute_kernels.kernels import hc_mix_tma as tma

    x, hc_fn, hc_scale, hc_base = _inputs(600, 20480, seed=21)
    got = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method="tma")
    for a, b in zip(got, tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base)):
        assert torch.equal(a, b)
    one = cute_kernels.hc_mix_sinkhorn(x[517:518], hc_fn, hc_scale, hc_base, method="tma")
    for a, b in zip(got, one):
        assert torch.equal(a[517:518], b)
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    for a, w in zip(got, ref):
        assert (a.double() - w.double()).abs().max().item() <= 1e-5


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_in_place_weight_update_is_seen(method):
    x, hc_fn, hc_scale, hc_base = _inputs(300, 2048, seed=21)
    cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)  # tma: fills the pre-split cache
    hc_fn.mul_(-0.5)
    got = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=method)
    want = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    for g, w in zip(got, want):
        assert (g.double() - w.double()).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- the TMA + WGMMA kernel (hc_mix_tma)
@pytest.mark.parametrize("m,k", [(1, 20480), (7, 20480), (130, 20480), (1000, 7168), (5, 192)])
def test_tma_kernel_matches_float64_reference(m, k):
    """hc_mix_tma: a and sum x^2 within 2e-6 of float64,
    near its CPU emulation, outputs as the reference; k=192 (3 k tiles for 64 splits) leaves most splits
    without k tiles."""
    from cute_kernels.kernels import hc_mix_tma as tma

    x, hc_fn, hc_scale, hc_base = _inputs(m, k, seed=100 + m)
    mix = torch.full((m, mod.SP_COLS), float("nan"), device="cuda")
    out = tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, mix=mix)
    torch.cuda.synchronize()
    xd = x.double()
    a64, sq64 = xd @ hc_fn.double().t(), (xd * xd).sum(-1)
    assert _rel(mix[:, :24], a64) <= 2e-6 and _rel(mix[:, 24], sq64) <= 2e-6
    emu = tma.emulate_mix(x.cpu(), hc_fn.cpu())
    assert _rel(mix.cpu(), emu) <= 1e-6
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    for name, got, want in zip(("pre", "post", "comb"), out, ref):
        assert torch.isfinite(got).all(), name
        assert (got.double() - want.double()).abs().max().item() <= 1e-5, name


def test_tma_kernel_is_batch_invariant():
    from cute_kernels.kernels import hc_mix_tma as tma

    x, hc_fn, hc_scale, hc_base = _inputs(300, 20480, seed=7)
    full = tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base)
    for i in (0, 129, 299):
        one = tma.hc_mix_sinkhorn_tma(x[i:i + 1], hc_fn, hc_scale, hc_base)
        for a, b in zip(full, one):
            assert torch.equal(a[i:i + 1], b)


def test_tma_kernel_tiles_give_the_same_bits():
    """config_for moves the walk's CTAs between levels of the K tree with M, and the tile and stage
    choices must not matter either: all give the same bits (batch invariance across the switch); with
    another tree too, and overlap (paired k tiles; a split's odd last tile alone) gives the plain loop's
    bits.  K = 7232 (113 k tiles) makes uneven splits, odd and even."""
    from cute_kernels.kernels import hc_mix_tma as tma

    for k in (20480, 7232):
        x, hc_fn, hc_scale, hc_base = _inputs(300, k, seed=11)
        make = tma.HcMixTmaConfig
        for family in ([*(tma.config_for(m) for m in tma.LEVEL_EXAMPLE_M), make(stages=3), make(stages=3, cta_level=0),
                        make(tile_m=256, stages=4), make(cta_level=1, overlap=True),
                        make(cta_level=5, pdl=False), make(cta_level=1, pdl=False), make(cta_level=1, l2_hints=False),
                        make(reduce_rows=32), make(cta_level=1, reduce_rows=16),
                        make(cta_level=5, overlap=True)],
                       [make(tree=(4, 8), cta_level=1), make(tree=(4, 8), cta_level=1, overlap=True),
                        make(tree=(4, 8), cta_level=2, overlap=True)]):
            mixes = []
            for cfg in family:
                mix = torch.full((300, mod.SP_COLS), float("nan"), device="cuda")
                tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, config=cfg, mix=mix)
                mixes.append(mix)
            for other in mixes[1:]:
                assert torch.equal(other, mixes[0])


@pytest.mark.parametrize("m", [1, 4096])
def test_tma_kernel_keeps_stream_order(m):
    """The walk is a programmatic dependent launch: it must still see x as written by the kernel just
    before it, and the previous call's reduction must finish before the walk reuses a workspace.  Eight
    calls in flight without a sync, x rewritten in place by a torch kernel before each."""
    from cute_kernels.kernels import hc_mix_tma as tma

    x, hc_fn, hc_scale, hc_base = _inputs(m, 20480, seed=31)
    g = generator(32)
    xs = [torch.randn(m, 20480, device="cuda", generator=g).bfloat16() for _ in range(8)]
    mixes = [torch.full((m, mod.SP_COLS), float("nan"), device="cuda") for _ in xs]
    torch.cuda.synchronize()
    for src, mix in zip(xs, mixes):
        x.copy_(src)
        tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, mix=mix)
    torch.cuda.synchronize()
    for src, mix in zip(xs, mixes):
        a64 = src.double() @ hc_fn.double().t()
        assert _rel(mix[:, :24], a64) <= 2e-6


def test_tma_fused_epilogue_gives_the_two_kernel_bits():
    """fused_epilogue (cta_level 0: each walk CTA runs its row tile's epilogue; no reduction kernel) gives
    the two-kernel form's bits, every output compared whole (poisoned first), for a ragged last tile,
    one row, another tree and an uneven k-tile split; eight calls in flight with x rewritten before
    each (the walk is a programmatic dependent launch: it must see x as written just before it); and
    eight fused walks back to back on different x, into their own outputs and then into shared ones
    (the last call's values must remain)."""
    import dataclasses

    from cute_kernels.kernels import hc_mix_tma as tma

    fused = [tma.config_for(16384), tma.HcMixTmaConfig(tree=(4, 8), cta_level=0, stages=3, fused_epilogue=True)]
    assert fused[0].fused_epilogue and fused[0].cta_level == 0
    for k in (20480, 7232):
        for m in (1, 300, 129):
            x, hc_fn, hc_scale, hc_base = _inputs(m, k, seed=41 + m)
            for cfg in fused:
                outs = []
                for c in (cfg, dataclasses.replace(cfg, fused_epilogue=False)):
                    out = tuple(torch.full(s, float("nan"), device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4)))
                    mix = torch.full((m, mod.SP_COLS), float("nan"), device="cuda")
                    tma.launch(x, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, config=c, mix=mix, out=out)
                    outs.append((*out, mix))
                for a, b in zip(*outs):
                    assert torch.equal(a, b), (k, m, cfg)
    m = 300
    x, hc_fn, hc_scale, hc_base = _inputs(m, 20480, seed=47)
    g = generator(48)
    xs = [torch.randn(m, 20480, device="cuda", generator=g).bfloat16() for _ in range(8)]
    torch.cuda.synchronize()
    got = []
    for src in xs:
        x.copy_(src)
        got.append(tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, config=fused[0]))
    torch.cuda.synchronize()
    two = dataclasses.replace(fused[0], fused_epilogue=False)
    for src, out in zip(xs, got):
        want = tma.hc_mix_sinkhorn_tma(src, hc_fn, hc_scale, hc_base, config=two)
        for a, b in zip(out, want):
            assert torch.equal(a, b)
    # fused walks back to back (each triggers the next as it starts): own outputs, then shared ones
    out = tuple(torch.full(s, float("nan"), device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4)))
    got = [tma.hc_mix_sinkhorn_tma(src, hc_fn, hc_scale, hc_base, config=fused[0]) for src in xs]
    for src in xs:
        tma.launch(src, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, config=fused[0], out=out)
    torch.cuda.synchronize()
    for src, o in zip(xs, got):
        for a, b in zip(o, tma.hc_mix_sinkhorn_tma(src, hc_fn, hc_scale, hc_base, config=two)):
            assert torch.equal(a, b)
    for a, b in zip(out, got[-1]):  # the last call's values
        assert torch.equal(a, b)


@pytest.mark.parametrize("i", range(FUZZ_CASES), ids=lambda i: f"case{i}")  # (ids the same in every process)
def test_random_shapes_strides_and_parameters(i):
    """Random cases drawn from the run's seed (``CUTE_KERNELS_FUZZ_CASES``, default 12, sets how many): K (a
    multiple of 64 up to 32768, or the shipped 20480 / 7168), 1 to 6000 rows, padded rows, both methods, Sinkhorn
    iterations, both eps, scaled inputs and a row of zeros: the public op against the float64 reference."""
    rng = case_rng(9000 + i)
    k = rng.choice([20480, 7168, 64 * rng.randint(1, 512)])
    m = rng.choice([1, rng.randint(2, 600), rng.randint(601, 6000)])
    pad = 8 * rng.choice([0, 0, rng.randint(1, 32)])
    method = rng.choice(["tma", "walk"])
    iters = rng.choice([1, 5, 20, 20, 30])
    rms_eps, hc_eps = rng.choice([1e-6, 1e-3]), rng.choice([1e-6, 1e-3])
    scale = rng.choice([1e-2, 1.0, 1.0, 30.0])
    x_full, hc_fn, hc_scale, hc_base = _inputs(m, k + pad, seed=9000 + i)
    x = (x_full.float() * scale).bfloat16()[:, :k]
    if m > 1:
        x[rng.randrange(m)] = 0  # (rms_eps > 0: r = 1 / sqrt(rms_eps))
    hc_fn = hc_fn[:, :k].contiguous()
    print(f"hc_mix fuzz case {i}: M={m} K={k} pad={pad} {method} iters={iters} eps={rms_eps},{hc_eps} scale={scale}")
    got = cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=iters, rms_eps=rms_eps,
                                       hc_eps=hc_eps, method=method)
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base, sinkhorn_iters=iters, rms_eps=rms_eps,
                                                 hc_eps=hc_eps)
    for name, g, w in zip(("pre", "post", "comb"), got, ref):
        assert torch.isfinite(g).all(), name
        err = (g.double() - w.double()).abs().max().item()
        assert err <= 1e-5, f"case {i} {name}: max abs error {err:.3g} (CUTE_KERNELS_SEED={RUN_SEED})"
        assert _rel(g, w) <= 5e-6, f"case {i} {name}: norm-wise error {_rel(g, w):.3g} (CUTE_KERNELS_SEED={RUN_SEED})"


def test_tma_load_group_gives_the_same_bits():
    """load_group (the producer issues a group of stages' TMA loads back to back) changes only when the loads
    issue: every output (poisoned first) bitwise equal to load_group=1's, at the shipped CTA levels of M = 1, 129,
    4096 and a level-0 fused walk, K = 20480 and 7232 (a CTA's tile count not a multiple of the group: the
    single-tile tail loop runs)."""
    import dataclasses

    from cute_kernels.kernels import hc_mix_tma as tma

    for k in (20480, 7232):
        for m in (1, 129, 4096):
            x, hc_fn, hc_scale, hc_base = _inputs(m, k, seed=51 + m)
            base = tma.config_for(m)
            for cfg in (base, tma.HcMixTmaConfig(tree=(4, 8), cta_level=0, stages=3, fused_epilogue=True)):
                outs = []
                for group in (1, 2, 3):
                    c = dataclasses.replace(cfg, load_group=group)
                    out = tuple(torch.full(s, float("nan"), device="cuda") for s in ((m, 4), (m, 4), (m, 4, 4)))
                    mix = torch.full((m, mod.SP_COLS), float("nan"), device="cuda")
                    tma.launch(x, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, config=c, mix=mix, out=out)
                    outs.append((*out, mix))
                for other in outs[1:]:
                    for a, b in zip(outs[0], other):
                        assert not a.isnan().any() and torch.equal(a, b), (k, m, cfg)
