"""Tensor-parallel Q/K RMSNorm: CPU compile per shipped (dtype, G, Q, K), protocol in the PTX, config, reference."""

import contextlib
import gc
import re
import socket
import weakref

import pytest
import torch

import cute_kernels
from cute_kernels.kernels import qknorm_tp as mod
from cute_kernels.runtime.cache import compile_record


@contextlib.contextmanager
def single_rank_group():
    """A one-rank gloo default process group on a free port (CI hosts may run several jobs), destroyed after."""
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("target", mod.compile_targets(), ids=lambda t: t.label)
def test_compiles_with_push_poll_protocol(target):
    target.build()
    rec = compile_record(target.kernel, target.key)
    ptx = rec.ptx
    assert ".target sm_90a" in ptx
    assert "ld.global.v4 (16B loads)" in rec.ptx_features
    assert "st.global.v4 (16B stores)" in rec.ptx_features
    assert "volatile/system-scope store" in rec.ptx_features
    assert "local memory (spill)" not in rec.ptx_features
    assert all(not r.stack_bytes for r in rec.resources), [(r.name, r.stack_bytes) for r in rec.resources]
    if rec.sass:
        assert "LDL/STL (local memory)" not in rec.sass_features  # no spills
    # push: a 32-bit system-scope store per peer and role (its half of the slot); poll: system-scope
    # loads; sentinel written back; the error flag is a 32-bit store as well
    assert re.search(r"st\.relaxed\.sys\.global\.b32", ptx)
    assert re.search(r"ld\.relaxed\.sys\.global\.b32", ptx)
    assert "%globaltimer" in ptx  # bounded wait
    assert re.search(r"atom\.global(\.acq_rel)?(\.gpu)?\.add", ptx)  # last-CTA epoch flip
    # q and k warps never share a named barrier: only ids 1 (q role), 2 (k role) and 0 (the final
    # CTA-wide one, reached by every thread from one place)
    ids = {int(m) for m in re.findall(r"\b(?:bar|barrier)(?:\.cta)?\.sync(?:\.aligned)?\s+(\d+)", ptx)}
    assert ids <= {0, 1, 2} and {1, 2} <= ids, ids


def test_sentinel_is_negative_zero_pair():
    import struct

    lo, hi = struct.unpack("<ff", struct.pack("<Q", mod.SENTINEL))
    assert lo == 0.0 and hi == 0.0 and str(lo) == "-0.0" and str(hi) == "-0.0"
    assert mod._sentinel_i64() & ((1 << 64) - 1) == mod.SENTINEL
    # a real (sum_q, sum_k) word of two +0.0 sums (zero row, eps = 0) is not the sentinel
    assert struct.unpack("<Q", struct.pack("<ff", 0.0, 0.0))[0] != mod.SENTINEL
    # each role polls its own half: -0.0 alone, and +0.0 is not it
    assert mod.SENTINEL_HALF == struct.unpack("<I", struct.pack("<f", -0.0))[0] == mod.SENTINEL & 0xFFFFFFFF
    assert mod.SENTINEL >> 32 == mod.SENTINEL_HALF and struct.unpack("<I", struct.pack("<f", 0.0))[0] != mod.SENTINEL_HALF


def test_config():
    cfg = mod.ParallelQKNormConfig.for_shape(8, 6144, 1024, torch.bfloat16)
    assert cfg.norm.q.width == 768 and cfg.norm.k.width == 128 and cfg.norm.q_dim == 6144
    assert cfg.norm.rows * 8 <= cfg.norm.q_threads
    with pytest.raises(ValueError, match="divisible"):
        mod.ParallelQKNormConfig.for_shape(3, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match=r"world=16 must be in \[1, 8\]"):
        mod.ParallelQKNormConfig.for_shape(16, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.ParallelQKNormConfig.for_shape(8, 4096 + 8, 1024, torch.bfloat16)
    with pytest.raises(TypeError, match="world must be an int"):
        mod.ParallelQKNormConfig.for_shape("2", 4096, 1024, torch.bfloat16)
    # the constructor checks its own fields too (session 37 review: only the nested tiling was checked)
    import dataclasses

    for kw, exc, msg in ((dict(world=0), ValueError, "world"), (dict(world=True), TypeError, "world"),
                         (dict(world=4), ValueError, "not the full sizes"), (dict(norm=None), TypeError, "norm")):
        with pytest.raises(exc, match=msg):
            dataclasses.replace(cfg, **kw)


def test_occupancy_model():
    assert mod.ctas_per_sm(160, 64) == 6  # 64 regs x 160 threads: registers limit
    assert mod.ctas_per_sm(128, 32) == 16  # threads limit
    assert mod.ctas_per_sm(32, 16) == 32  # CTA-slot limit
    assert mod.ctas_per_sm(1024, 255) == 0
    # 200 registers = 6400 per warp: two warps per 16384-register sub-partition, 8 per SM, 4 CTAs of 2 warps
    # (65536 / 6400 would say 5)
    assert mod.ctas_per_sm(64, 200) == 4
    # shared memory: 228 KB per SM, 1 KB of it reserved per CTA
    assert mod.ctas_per_sm(128, 32, smem_bytes=56 * 1024) == 4  # 4 x 57 KB = 228 KB
    assert mod.ctas_per_sm(128, 32, smem_bytes=56 * 1024 + 1) == 3


def test_resident_grid_takes_half_the_occupancy_shared_by_the_ranks(monkeypatch):
    """The push/poll grid cap: every CTA of every rank on the GPU resident with a 2x margin (SMs x half the
    modelled CTAs per SM, split over the ranks sharing the GPU; at least 1)."""
    import types

    monkeypatch.setattr(mod, "_compile", lambda *a: None)
    monkeypatch.setattr(mod, "compile_record", lambda *a: types.SimpleNamespace(resources=[]))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=132))

    def cap(per_sm, ranks):  # the grid cap where the occupancy model gives per_sm CTAs per SM
        monkeypatch.setattr(mod, "ctas_per_sm", lambda *a: per_sm)
        return mod.resident_ctas(torch.bfloat16, 4, 4096, 1024, ranks, device=0)

    assert (cap(8, 1), cap(8, 4)) == (132 * 4, 132)
    assert (cap(1, 1), cap(1, 4), cap(1, 200)) == (132, 33, 1)  # one CTA per SM: still one per SM (never 0)


def test_parallel_reference_equals_unsharded():
    q = torch.randn(5, 64, dtype=torch.float64)
    k = torch.randn(5, 16, dtype=torch.float64)
    wq, wk = torch.randn(64, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    full_q, full_k = cute_kernels.qk_rmsnorm_reference(q, k, wq, wk, 1e-6)
    for world in (2, 4, 8):
        outs = mod.parallel_reference(q, k, wq, wk, 1e-6, world)
        torch.testing.assert_close(torch.cat([o[0] for o in outs], 1), full_q)
        torch.testing.assert_close(torch.cat([o[1] for o in outs], 1), full_k)
    # shards must cover every column: Q and K multiples of world (ParallelQKNorm's rule)
    for world in (3, 0):
        with pytest.raises(ValueError, match="world"):
            mod.parallel_reference(q, k, wq, wk, 1e-6, world)


def test_unfused_scale_matches_reference():
    """The unfused path's scale, per rank: its shard over the full widths' sums (means over Q and K, not over
    the shard's width)."""
    q, k = torch.randn(6, 64), torch.randn(6, 16)
    wq, wk = torch.randn(64), torch.randn(16)
    ref = mod.parallel_reference(q, k, wq, wk, 1e-6, 2)
    sums = torch.stack([q.square().sum(-1), k.square().sum(-1)])  # what the all_reduce gives every rank
    for r in range(2):
        qs, ks = q[:, 32 * r:32 * (r + 1)].clone(), k[:, 8 * r:8 * (r + 1)].clone()
        mod._scale_in_place(qs, ks, wq[32 * r:32 * (r + 1)], wk[8 * r:8 * (r + 1)], 1e-6, sums, 64, 16)
        torch.testing.assert_close(qs, ref[r][0].float())
        torch.testing.assert_close(ks, ref[r][1].float())


def test_constructor_validation():
    with pytest.raises(TypeError, match="one of .*; got an unsupported torch.dtype torch.float64"):
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, torch.float64)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, one of .*torch.bfloat16.*; got str 'bfloat16'"):
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, "bfloat16")
    with pytest.raises(TypeError, match="got str 'bfloat16'"):
        mod.ParallelQKNorm.emulated(2, 16, 4096, 1024, "bfloat16")
    with pytest.raises(ValueError, match="max_tokens"):
        cute_kernels.ParallelQKNorm(None, 0, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="timeout_s"):
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, torch.bfloat16, timeout_s=0)


def test_single_rank_group_constructs_without_push_buffers():
    """G = 1 needs no peers: the object only routes to the one-GPU kernel (checked here up to the launch)."""
    with single_rank_group():
        p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
        assert (p.rank, p.world, p.fused) == (0, 1, False)
        p.check_error(synchronize=False)
        q, k = torch.zeros(9, 64, dtype=torch.bfloat16), torch.zeros(9, 16, dtype=torch.bfloat16)
        w = (torch.ones(64, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="CUDA device"):
            p(q, k, *w, 1e-6)
        with pytest.raises(ValueError, match="CUDA device"):  # validation precedes the capacity check
            p(q[:4], k[:4], *w, 1e-6)


def test_built_under_inference_mode_resets_outside_it():
    """Serving code builds the object under torch.inference_mode(): its buffers are normal tensors all the same,
    so reset() (in-place fills, which torch refuses on inference tensors outside inference mode) works in and
    out of it.  (Before session 69 reset() raised RuntimeError outside.)"""
    with single_rank_group():
        with torch.inference_mode():
            p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
            assert torch.is_inference_mode_enabled()  # (the constructor leaves the caller's mode as it was)
        assert not p._error.is_inference()
        p.reset()
        with torch.inference_mode():
            p.reset()


def test_copies_are_the_object_and_pickling_is_refused():
    """``copy.copy`` / ``copy.deepcopy`` (of the object, or of a module holding it: an EMA copy of a model) give
    the object itself; pickling raises TypeError.  (Until session 69 a copy shared the original's handle, so
    closing the copy broke the original, and an unpickled one called whatever instance had its number.)"""
    import copy
    import pickle

    with single_rank_group():
        p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
        assert copy.copy(p) is p and copy.deepcopy(p) is p
        holder = torch.nn.Module()
        holder.norm = p
        assert copy.deepcopy(holder).norm is p
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(p)
        assert not p.closed
        m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
        with torch.inference_mode():
            iq, ik = m(4, 64), m(4, 16)
        with pytest.raises(RuntimeError, match="inference tensor"):  # (as qk_rmsnorm_: torch's in-place rule)
            p(iq, ik, m(64), m(16), 1e-6)
        p(m(4, 64), m(4, 16), m(64), m(16), 1e-6)
        p.close()


def test_widths_are_checked_by_the_kernel_that_runs_them():
    """Per-rank widths near the limit (bf16 q 24576 beside k 4096): the tensor-parallel kernel's tiling takes
    them, the one-GPU kernel's does not.  One rank runs the one-GPU op, so construction refuses them there;
    with several ranks the call checks them against the constructor's (tensor-parallel) config only."""
    from cute_kernels.kernels import qknorm

    wide = (24576, 4096)
    mod.ParallelQKNormConfig.for_shape(2, 2 * wide[0], 2 * wide[1], torch.bfloat16)  # fits the TP tiling
    m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    args = (m(4, wide[0]), m(4, wide[1]), m(wide[0]), m(wide[1]), 1e-6)
    with pytest.raises(ValueError, match="narrower"):
        qknorm.validate_qk_shapes(*args, cuda=False)  # the one-GPU kernel's rule
    qknorm.validate_qk_shapes(*args, cuda=False, one_gpu_tiling=False)
    with single_rank_group(), pytest.raises(ValueError, match="narrower"):
        cute_kernels.ParallelQKNorm(None, 16, *wide, torch.bfloat16)


def test_check_shards_raises_what_it_documents():
    """``check_shards`` called directly (public): a q or k that is not 2-D is a ValueError and a non-tensor a
    TypeError, as documented (session 73, a docstring audit: IndexError / AttributeError before)."""
    with single_rank_group():
        p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
        q, k = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(4, 16, dtype=torch.bfloat16)
        p.check_shards(q, k)
        with pytest.raises(ValueError, match=r"rank shards must be q \[N, 64\]"):
            p.check_shards(torch.zeros(64, dtype=torch.bfloat16), k)
        with pytest.raises(ValueError, match=r"rank shards must be q \[N, 64\]"):
            p.check_shards(q, torch.zeros(2, 4, 16, dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="must be torch.Tensors, got list and Tensor"):
            p.check_shards([[0.0] * 64], k)


def test_traced_call_checks_the_instance_rules():
    """Under a fake-tensor trace (what torch.compile runs) the registered op's fake applies the argument rules
    and the instance's own (shard widths, dtype, capacity), as an eager call does; a right call passes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with single_rank_group():
        p = cute_kernels.ParallelQKNorm(None, 8, 64, 16, torch.bfloat16)
        with FakeTensorMode():
            def call(n=4, qw=64, kw=16, dtype=torch.bfloat16, weights=None, q_dtype=None, q_shape=None):
                q = torch.zeros(q_shape or (n, qw), dtype=q_dtype or dtype)
                k = torch.zeros(n, kw, dtype=dtype)
                wq, wk = weights or (qw, kw)
                p(q, k, torch.ones(wq, dtype=dtype), torch.ones(wk, dtype=dtype), 1e-6)

            call()
            with pytest.raises(ValueError, match=r"rank shards must be q \[N, 64\]"):
                call(qw=72)
            with pytest.raises(ValueError, match=r"rank shards must be q \[N, 64\]"):
                call(qw=60)
            # the shard is named, not its (right) weight; and the odd dtype out is q's, not k's
            with pytest.raises(ValueError, match=r"rank shards must be q \[N, 64\] and k \[N, 16\]"):
                call(qw=72, weights=(64, 16))
            with pytest.raises(ValueError, match=r"rank shards must be"):
                call(kw=8, weights=(64, 16))
            with pytest.raises(TypeError, match="built for torch.bfloat16"):
                call(dtype=torch.float16)
            with pytest.raises(TypeError, match="q has dtype torch.float16; this ParallelQKNorm was built for"):
                call(q_dtype=torch.float16)
            with pytest.raises(ValueError, match="max_tokens=8"):
                call(n=9)
            with pytest.raises(ValueError, match="2 dims"):
                call(q_shape=(4, 8, 8))


def test_compiled_function_takes_several_instances():
    """A compiled function called with a second instance as an argument (torch.compile makes the op's int
    handle symbolic): the fake specializes it, so each call is checked against its own instance's capacity."""
    torch._dynamo.reset()
    try:
        with single_rank_group():
            big, other, small = (cute_kernels.ParallelQKNorm(None, n, 64, 16, torch.bfloat16) for n in (16, 16, 8))
            m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
            f = torch.compile(lambda norm, q, k, wq, wk: norm(q, k, wq, wk, 1e-6), fullgraph=True, backend="eager")
            for norm in (big, other, big):
                f(norm, m(12, 64), m(12, 16), m(64), m(16))
            with pytest.raises(Exception, match="max_tokens=8"):  # (Dynamo wraps the ValueError)
                f(small, m(12, 64), m(12, 16), m(64), m(16))
            f(small, m(8, 64), m(8, 16), m(64), m(16))
    finally:
        torch._dynamo.reset()


def test_width_errors_name_the_full_sizes():
    with pytest.raises(ValueError, match=r"q_dim=100, k_dim=1024 over 2 ranks \(per-rank widths 50 and 512\)"):
        mod.ParallelQKNormConfig.for_shape(2, 100, 1024, torch.bfloat16)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(max_tokens="16"), TypeError, "max_tokens"),
    (dict(max_tokens=16.0), TypeError, "max_tokens"),
    (dict(max_tokens=True), TypeError, "max_tokens"),
    (dict(max_tokens=2**31), ValueError, "max_tokens"),
    (dict(q_dim="4096"), TypeError, "q_dim"),
    (dict(q_dim=4096.0), TypeError, "q_dim"),
    (dict(k_dim=None), TypeError, "k_dim"),
    (dict(k_dim=0), ValueError, "k_dim"),
    (dict(q_dim=-8), ValueError, "q_dim"),
    (dict(timeout_s=float("inf")), ValueError, "timeout_s"),
    (dict(timeout_s=float("nan")), ValueError, "timeout_s"),
    (dict(timeout_s=1e10), ValueError, "int64 nanoseconds"),
    (dict(timeout_s=1e300), ValueError, "int64 nanoseconds"),  # (1e300 * 1e9 is inf: no OverflowError)
    (dict(timeout_s=10**400), ValueError, "timeout_s"),
    (dict(timeout_s=-1.0), ValueError, "timeout_s"),
    (dict(timeout_s=1e-12), ValueError, "1 ns"),
    (dict(timeout_s="10"), TypeError, "timeout_s"),
    (dict(timeout_s=True), TypeError, "timeout_s"),
])
def test_constructor_argument_types_and_ranges(kw, exc, msg):
    a = dict(max_tokens=16, q_dim=4096, k_dim=1024)
    a.update(kw)
    with pytest.raises(exc, match=msg):
        cute_kernels.ParallelQKNorm(None, a.pop("max_tokens"), a.pop("q_dim"), a.pop("k_dim"), torch.bfloat16, **a)
    a = dict(max_tokens=16, q_dim=4096, k_dim=1024)
    a.update(kw)
    with pytest.raises(exc, match=msg):  # the emulation checks them before it needs a GPU
        mod.ParallelQKNorm.emulated(2, a.pop("max_tokens"), a.pop("q_dim"), a.pop("k_dim"), torch.bfloat16, **a)


def test_timeout_conversion():
    assert mod._timeout_ns(10.0) == 10_000_000_000
    assert mod._timeout_ns(1) == 1_000_000_000
    assert mod._timeout_ns(9.2e9) <= 2**63 - 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_emulated_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        mod.ParallelQKNorm.emulated(2, 16, 4096, 1024, torch.bfloat16)
    with pytest.raises(TypeError, match="world"):
        mod.ParallelQKNorm.emulated(2.0, 16, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="world size"):
        mod.ParallelQKNorm.emulated(9, 16, 4096, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match=r"world size 0 must be in \[2, 8\]"):  # one range in every message
        mod.ParallelQKNorm.emulated(0, 16, 4096, 1024, torch.bfloat16)
    with pytest.raises(TypeError, match="world must be an int, got bool"):
        mod.ParallelQKNorm.emulated(True, 16, 4096, 1024, torch.bfloat16)


def test_emulated_on_cuda_without_an_index_lives_on_the_current_device(monkeypatch):
    """``emulated(device="cuda")`` (or ``torch.device("cuda")``) builds ranks on the current device by its index:
    calls compare q.device (always indexed, e.g. cuda:1) with the ranks' device, and an unindexed "cuda" never
    equals it (every call raised "q is on cuda:1; this ParallelQKNorm lives on cuda").  No GPU here: the
    buffers are CPU stand-ins and the ranks record the device they are given."""
    seen = []

    class Probe(mod.ParallelQKNorm):
        def __init__(self, *a, _emulation=None, **kw):
            seen.append(_emulation["device"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch, "full", lambda shape, value, dtype=None, device=None: torch.zeros(shape, dtype=dtype))
    for device in ("cuda", torch.device("cuda"), None, "cuda:1"):
        seen.clear()
        Probe.emulated(2, 16, 4096, 1024, torch.bfloat16, device=device)
        assert seen == [torch.device("cuda", 1)] * 2, device
    seen.clear()
    Probe.emulated(2, 16, 4096, 1024, torch.bfloat16, device="cuda:0")
    assert seen == [torch.device("cuda", 0)] * 2


def test_group_of_the_wrong_type_is_a_type_error():
    """A group that is not a ProcessGroup (or None) is a TypeError before any collective (newcomer review:
    a string reached torch.distributed and raised an AttributeError there)."""
    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup or None"):
        mod.ParallelQKNorm("world", 16, 4096, 1024, torch.bfloat16)


def test_any_width_is_supported():
    """Each role's exchange loops over the (row, rank) pairs, so narrow shards need no minimum width."""
    for dtype in (torch.bfloat16, torch.float32):
        vec = mod.vec_elems(dtype)
        for g in (2, 4, 8):
            for qn in (1, 2, 3, 4 * g, 4 * g + 7):
                for kn in (1, 3, 16, 128):
                    mod.ParallelQKNormConfig.for_shape(g, qn * vec * g, kn * vec * g, dtype)
    cfg = mod.ParallelQKNormConfig.for_shape(8, 64, 64, torch.bfloat16)  # 32 rows x 8 ranks, 32 q threads
    assert cfg.norm.rows * cfg.world > cfg.norm.q_threads


def _emulated_cpu_ranks(monkeypatch, world=2):
    """Fused emulated ranks with CPU buffers (no launch): the stand-ins replace the compile and GPU queries."""
    monkeypatch.setattr(mod, "_compile", lambda *a: (lambda *args: None))
    monkeypatch.setattr(mod, "resident_ctas", lambda *a, **k: 1)
    dev = torch.device("cpu")
    bufs = [torch.full((2, 16, world), mod._sentinel_i64(), dtype=torch.int64) for _ in range(world)]
    ranks = [mod.ParallelQKNorm(None, 16, 4096, 1024, torch.bfloat16,
                                _emulation=dict(rank=r, world=world, device=dev, buffers=bufs)) for r in range(world)]
    return ranks, [weakref.ref(b) for b in bufs]


def test_dropped_instances_free_their_buffers(monkeypatch):
    ranks, buf_refs = _emulated_cpu_ranks(monkeypatch)
    handles = [r.handle for r in ranks]
    assert handles[0] != handles[1] and all(mod._instances[h] is r for h, r in zip(handles, ranks))
    inst_refs = [weakref.ref(r) for r in ranks]
    del ranks[0]
    gc.collect()
    assert inst_refs[0]() is None and handles[0] not in mod._instances
    assert all(b() is not None for b in buf_refs)  # rank 1 still pushes into both buffers
    del ranks[0]
    gc.collect()
    assert inst_refs[1]() is None and handles[1] not in mod._instances
    assert all(b() is None for b in buf_refs)
    with pytest.raises(RuntimeError, match="closed or freed"):
        mod.parallel_qk_rmsnorm_(torch.zeros(1, 8), torch.zeros(1, 8), torch.ones(8), torch.ones(8), 1e-6, handles[0])
    meta = lambda *s: torch.empty(*s, device="meta")
    for handle in (handles[0], -1):  # the op's fake (meta tensors, tracing) refuses a dead handle too
        with pytest.raises(RuntimeError, match="closed or freed"):
            mod.parallel_qk_rmsnorm_(meta(1, 8), meta(1, 8), meta(8), meta(8), 1e-6, handle)


def test_handles_differ_between_processes():
    """Each process counts its handles from its own random offset, so a handle recorded in one process (a saved
    torch.export program) names no instance of another, whose call then raises saying so (session 72: every
    process counted from 1, and a program loaded elsewhere ran with that process's first instance)."""
    import subprocess
    import sys

    code = "from cute_kernels.kernels import qknorm_tp as m; print(next(m._handles))"
    firsts = {int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
              for _ in range(2)}
    assert len(firsts) == 2 and min(firsts) > 2**20
    foreign = next(iter(firsts))
    meta = lambda *s: torch.empty(*s, device="meta")
    with pytest.raises(RuntimeError, match="recorded in another process"):
        mod.parallel_qk_rmsnorm_(meta(1, 8), meta(1, 8), meta(8), meta(8), 1e-6, foreign)


def test_close_and_context_manager(monkeypatch):
    ranks, buf_refs = _emulated_cpu_ranks(monkeypatch)
    with ranks[0] as r0:
        assert not r0.closed
    assert r0.closed and r0.handle not in mod._instances
    r0.close()  # idempotent
    q, k = torch.zeros(1, 2048, dtype=torch.bfloat16), torch.zeros(1, 512, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="closed"):
        r0(q, k, torch.ones(2048, dtype=torch.bfloat16), torch.ones(512, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(RuntimeError, match="closed"):
        r0.reset()
    ranks[1].close()
    gc.collect()
    assert all(b() is None for b in buf_refs)  # the objects are still referenced here; their buffers are not


def test_call_checks_eps_before_float(monkeypatch):
    ranks, _ = _emulated_cpu_ranks(monkeypatch)
    q, k = torch.zeros(1, 2048, dtype=torch.bfloat16), torch.zeros(1, 512, dtype=torch.bfloat16)
    w = (torch.ones(2048, dtype=torch.bfloat16), torch.ones(512, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="eps"):
        ranks[0](q, k, *w, True)
    with pytest.raises(TypeError, match="eps"):
        ranks[0](q, k, *w, "1e-6")


def test_more_than_8_ranks_use_the_unfused_path_shape_rules_only():
    assert mod._config_for_world(16, 4096, 1024, torch.bfloat16) is None
    assert mod._config_for_world(4, 4096, 1024, torch.bfloat16) is not None
    with pytest.raises(ValueError, match="divisible"):
        mod._config_for_world(16, 4100, 1024, torch.bfloat16)
    with pytest.raises(ValueError, match="16-byte"):
        mod._config_for_world(16, 16 * 12, 1024, torch.bfloat16)
    import cute_kernels

    assert cute_kernels.PeerTimeoutError is mod.PeerTimeoutError


def _agreement_rank(rank, port, q_dims, max_tokens, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(q_dims))
    try:
        p = cute_kernels.ParallelQKNorm(None, max_tokens[rank], q_dims[rank], 1024, torch.bfloat16)
        out.put((rank, "ok", p.fused))
    except Exception as exc:  # noqa: BLE001 (reported to the parent)
        out.put((rank, type(exc).__name__, str(exc)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("q_dims,max_tokens,want", [
    ((4096, 4096), (16, 16), ("ok", "ok")),
    ((4096, 2048), (16, 16), ("ValueError", "ValueError")),  # different sizes: every rank refuses
    ((4096, 4096), (16, 0), ("ValueError", "ValueError")),  # one rank's own check fails: no rank hangs
])
def test_ranks_agree_on_constructor_arguments(q_dims, max_tokens, want):
    """Two CPU ranks over gloo (no GPU: the unfused path): a mismatch or one rank's bad argument makes
    every rank raise at construction, instead of wrong results or a rank waiting in a collective."""
    import multiprocessing as mp
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_agreement_rank, args=(r, port, q_dims, max_tokens, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (kind, msg)) for r, kind, msg in (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    assert tuple(got[r][0] for r in range(2)) == want, got
    if want[0] == "ValueError" and q_dims[0] != q_dims[1]:
        assert all("differ across ranks" in got[r][1] for r in range(2)), got


def test_default_group_without_init_is_a_clear_error():
    """group=None without torch.distributed.init_process_group raised torch's own error from inside a
    collective; now a ValueError saying what to do (newcomer review, session 20)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(ValueError, match="group=None means the default process group"):  # (not torch's text)
        cute_kernels.ParallelQKNorm(None, 16, 4096, 1024, torch.bfloat16)


def test_parallel_reference_checks_its_weights_and_world():
    """parallel_reference takes the full-row weights only (session 61: a [2048] wq_full for Q=1024 was sliced and
    its tail ignored; a [1000] one failed with a per-shard message), and a non-int world is a TypeError."""
    q, k = torch.randn(4, 1024), torch.randn(4, 256)
    for wq, wk in ((torch.ones(2048), torch.ones(256)), (torch.ones(1000), torch.ones(256)),
                   (torch.ones(1024), torch.ones(1, 256))):
        with pytest.raises(ValueError, match=r"w[qk]_full must be \[(1024|256)\]"):
            mod.parallel_reference(q, k, wq, wk, 1e-6, 2)
    for world in (True, 2.0):
        with pytest.raises(TypeError, match="world must be an int"):
            mod.parallel_reference(q, k, torch.ones(1024), torch.ones(256), 1e-6, world)
    assert len(mod.parallel_reference(q, k, torch.ones(1024), torch.ones(256), 1e-6, 2)) == 2
