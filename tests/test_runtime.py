"""Runtime: target arch, compile cache (memory + disk, concurrent processes), artifacts."""

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import cute_kernels
from cute_kernels.runtime import arch, artifacts, cache
from cute_kernels.kernels import scale
from thread_helpers import held_before, line_of, run_threads  # (tests/ is on sys.path)


def test_target_arch_is_hopper():
    assert os.environ["CUTE_DSL_ARCH"] == "sm_90a"
    assert arch.target_arch() == "sm_90a"


def test_feature_regexes_on_known_text():
    ptx = "ld.global.v4.b32 {%r1,%r2,%r3,%r4}, [%rd1];\nwgmma.mma_async.sync.aligned.m64n128k16\nbar.sync 3, 256;\nsetmaxnreg.inc.sync.aligned.u32 240;"
    found = artifacts.find_features(ptx, artifacts.PTX_FEATURES)
    assert {"ld.global.v4 (16B loads)", "wgmma", "named barrier", "setmaxnreg"} <= set(found)
    assert "named barrier" not in artifacts.find_features("bar.sync 0;", artifacts.PTX_FEATURES)
    assert artifacts.find_features("", artifacts.PTX_FEATURES) == []


def test_sass_loops_finds_backward_branches_and_their_spills():
    """Two functions with addresses that restart: a loop nest (an inner loop with a reload and a predicated
    spill, an outer one around it) and a forward branch, which is no loop; ``[]`` without SASS."""
    sass = textwrap.dedent("""\
        \t.section\t.text.kernel_a,"ax",@progbits
                /*0000*/                   MOV R1, c[0x0][0x28] ;
        .L_x_0:
                /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        .L_x_1:
                /*0020*/                   LDL.LU R4, [R1+0x4] ;
                /*0030*/              @!P1 STL [R1], R4 ;
                /*0040*/               @P0 BRA `(.L_x_1) ;
                /*0050*/               @P2 BRA `(.L_x_0) ;
                /*0060*/                   BRA `(.L_x_2) ;
        .L_x_2:
                /*0070*/                   EXIT ;
        \t.section\t.text.kernel_b,"ax",@progbits
        .L_x_3:
                /*0000*/                   NOP ;
                /*0010*/                   BRA `(.L_x_3) ;
        """)
    loops = artifacts.sass_loops(sass)
    assert loops == [
        artifacts.SassLoop("kernel_a", 0x20, 0x40, 3, 2, True),
        artifacts.SassLoop("kernel_a", 0x10, 0x50, 5, 2, False),
        artifacts.SassLoop("kernel_b", 0x0, 0x10, 2, 0, True),
    ]
    assert artifacts.sass_loops(None) == [] and artifacts.sass_loops("") == []


def test_cubin_resources_reads_registers(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[1]
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.ptx and ".target sm_90a" in rec.ptx
    (res,) = rec.resources
    assert 8 <= res.registers <= 255
    assert res.static_smem_bytes == 0


def test_disk_cache_roundtrip_is_faster_than_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    t.build()
    first = cache.compile_record(t.kernel, t.key)
    assert first.compile_s is not None and first.load_s is None
    objs = list(tmp_path.rglob("*.o"))
    assert len(objs) == 1 and objs[0].stat().st_size > 0
    assert objs[0].with_suffix(".ptx").exists() and objs[0].with_suffix(".json").exists()
    cache.clear_memory_cache()
    fn = t.build()
    second = cache.compile_record(t.kernel, t.key)
    assert callable(fn)
    assert second.compile_s is None and second.load_s is not None
    assert second.load_s < first.compile_s / 5
    assert second.ptx == first.ptx  # PTX survives the round trip, for feature tests


def test_corrupt_cache_entry_recompiles(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    t.build()
    (obj,) = tmp_path.rglob("*.o")
    obj.write_bytes(b"not an object file")
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is not None  # recompiled, not loaded
    assert obj.read_bytes()[:4] == b"\x7fELF"


def _fresh_scale_entry(tmp_path, monkeypatch):
    """(target, its .o): scale's first target compiled into an empty cache at ``tmp_path`` (skips without nvdisasm,
    which the SASS tests need)."""
    if not cache.nvdisasm_available():
        pytest.skip("no nvdisasm here")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    t.build()
    (obj,) = tmp_path.rglob("*.o")
    return t, obj


def test_sass_is_disassembled_from_the_cubin_when_first_read(tmp_path, monkeypatch):
    """A compile keeps the cubin and writes no SASS (nvdisasm costs ~1 s of a forward's compile); the first read
    of ``CompileRecord.sass`` disassembles it (``nvdisasm -g -c``, as the DSL's ``--keep-sass``) into the
    entry's ``.sass``, which later loads read; without nvdisasm it is None and a later read tries again.
    An entry of an older cache with neither ``.sass`` nor ``.cubin`` is recompiled once nvdisasm is there."""
    from cute_kernels.runtime import artifacts

    t, obj = _fresh_scale_entry(tmp_path, monkeypatch)
    sass_file = obj.with_suffix(".sass")
    assert obj.with_suffix(".cubin").exists() and not sass_file.exists()
    rec = cache.compile_record(t.kernel, t.key)
    monkeypatch.setattr(artifacts, "disassemble", lambda cubin: None)  # as without nvdisasm
    assert rec.sass is None and not sass_file.exists()
    assert rec.summary().endswith("; no SASS (no nvdisasm, or the cached cubin is missing or unreadable)")
    monkeypatch.undo()
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    sass = rec.sass
    assert sass and re.search(r"\bEXIT\b", sass) and sass_file.read_text() == sass
    cache.clear_memory_cache()
    t.build()
    loaded = cache.compile_record(t.kernel, t.key)
    assert loaded.compile_s is None and loaded.sass == sass  # loaded, SASS from the file
    cache.clear_memory_cache()
    sass_file.unlink()
    t.build()
    loaded = cache.compile_record(t.kernel, t.key)
    assert loaded.compile_s is None and loaded.sass == sass  # loaded, SASS from the cubin again
    cache.clear_memory_cache()
    sass_file.unlink()
    obj.with_suffix(".cubin").unlink()  # an entry of an older cache: recompiled (with a cubin now)
    t.build()
    assert cache.compile_record(t.kernel, t.key).compile_s is not None and obj.with_suffix(".cubin").exists()


def test_memory_cache_returns_same_object(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[2]
    assert t.build() is t.build()


def test_concurrent_processes_share_one_entry(tmp_path):
    code = textwrap.dedent("""
        import cute_kernels
        from cute_kernels.kernels import scale
        from cute_kernels.runtime.cache import compile_record
        t = scale.compile_targets()[0]
        t.build()
        r = compile_record(t.kernel, t.key)
        print("compiled" if r.compile_s is not None else "loaded")
    """)
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted(outs) == ["compiled", "loaded"], outs  # the lock serialises: one compiles, one loads
    assert len(list(tmp_path.rglob("*.o"))) == 1


def test_unsupported_target_arch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80a")
    with pytest.raises(RuntimeError, match="sm_90a \\(Hopper\\) only"):
        arch.check_target_arch()


def test_non_hopper_gpu_is_a_clear_error(monkeypatch):
    from cute_kernels.runtime.validate import check_tensor

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100")
    monkeypatch.setattr(arch, "_DEVICE_OK", set())
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*A100 \\(sm_80\\)"):
        arch.check_device(torch.device("cuda", 0))
    fake_cuda = torch.empty(8, device="meta")
    monkeypatch.setattr(type(fake_cuda), "device", property(lambda self: torch.device("cuda", 0)))
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        check_tensor("x", fake_cuda, align_bytes=0)


def test_capturing_asks_the_tensors_device(monkeypatch):
    """capturing(t) (the ranker's packed-call rule: no host read of cu_seqlens while a graph is captured) asks the
    current stream of t's device, where t's kernels launch, not only the current device's: a capture on cuda:1
    while cuda:0 is current was missed, and the host read cu_seqlens on the capturing stream (fake CUDA
    tensors and a fake capture state: no GPU here)."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from cute_kernels.runtime.torch_op import capturing

    state = dict(current=0, capturing=None)  # the device whose current stream captures (None: none)

    @contextlib.contextmanager
    def device(index):
        prev, state["current"] = state["current"], index
        try:
            yield
        finally:
            state["current"] = prev

    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"] == state["current"])
    mode = FakeTensorMode()
    on = {i: FakeTensor(mode, torch.empty(4, device="meta"), torch.device("cuda", i)) for i in (0, 1)}
    assert not capturing(on[0]) and not capturing(on[1]) and not capturing(torch.empty(4))
    state["capturing"] = 1
    assert capturing(on[1]) and state["current"] == 0  # (the current device restored)
    assert not capturing(on[0]) and not capturing(torch.empty(4))
    state["capturing"] = 0  # the current device captures: a tensor of another device is not read either (as before)
    assert capturing(on[0]) and capturing(on[1])


def test_unusable_cache_folder_falls_back_to_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(blocker))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    with pytest.warns(RuntimeWarning, match="caching in memory only"):
        fn = t.build()
    assert callable(fn)


def test_lock_that_cannot_be_taken_falls_back_to_memory_and_loads_a_complete_entry(tmp_path, monkeypatch):
    """A cache folder that exists but whose entry lock cannot be taken (read-only folder; here a folder where the
    .lock file goes) warns and works: a complete entry is loaded as it is, a missing one compiled in memory
    (session 61: the lock's PermissionError reached the op call)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t, other = scale.compile_targets()[:2]
    t.build()
    (obj,) = tmp_path.rglob("*.o")
    (lock,) = tmp_path.rglob("*.lock")
    lock.unlink()
    lock.mkdir()  # (opening the lock file now fails with IsADirectoryError, as a read-only folder would with EACCES)
    other_lock = obj.parent / (cache._key_sha(other.kernel, other.key, arch.target_arch()) + ".lock")
    other_lock.mkdir()
    cache.clear_memory_cache()
    cache._warn_no_disk_cache.cache_clear()
    with pytest.warns(RuntimeWarning, match="caching in memory only"):
        assert callable(t.build())
    assert cache.compile_record(t.kernel, t.key).compile_s is None  # loaded, not compiled
    assert callable(other.build())  # (the same folder and reason: warned once)
    assert cache.compile_record(other.kernel, other.key).compile_s is not None  # compiled in memory
    assert len(list(tmp_path.rglob("*.o"))) == 1


def test_cache_key_holds_the_dsl_compile_settings(monkeypatch):
    """An entry compiled with other DSL settings (CUTE_DSL_LINEINFO, assertions, ...) is another entry (session
    61: a LINEINFO=1 compile was loaded by a process without it, and the reverse)."""
    key = ("torch.float16", "cfg")
    plain = cache._key_sha("scale", key, "sm_90a")
    assert "lineinfo=False" in arch.dsl_compile_settings() and "shared_libs" in arch.dsl_compile_settings()
    monkeypatch.setattr(cache, "dsl_compile_settings", lambda: arch.dsl_compile_settings().replace(
        "lineinfo=False", "lineinfo=True"))
    assert cache._key_sha("scale", key, "sm_90a") != plain


def test_recompile_replaces_an_empty_or_stale_sass(tmp_path, monkeypatch):
    """An empty .sass counts as missing (disassembled again from the cubin), and a recompile removes the old
    .sass (session 61: both were trusted forever)."""
    if not cache.nvdisasm_available():
        pytest.skip("no nvdisasm here")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    t.build()
    sass = cache.compile_record(t.kernel, t.key).sass
    (obj,) = tmp_path.rglob("*.o")
    sass_file = obj.with_suffix(".sass")
    sass_file.write_text("")
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is None and rec.sass == sass and sass_file.read_text() == sass
    sass_file.write_text("garbage")
    obj.write_bytes(b"")  # a truncated object: recompiled
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is not None and rec.sass == sass and sass_file.read_text() == sass
    assert not list(tmp_path.rglob("*.partial"))


@pytest.mark.parametrize("value,enabled", [("0", False), ("off", False), ("False", False), ("", False), ("1", True)])
def test_cache_switch_values(monkeypatch, value, enabled):
    monkeypatch.setenv("CUTE_KERNELS_CACHE", value)
    assert cache.disk_cache_enabled() is enabled


def test_tracers_see_the_registered_op_not_the_implementation():
    """make_fx (a Python dispatch mode) must record torch.ops.cute_kernels.*: a direct call of the
    implementation writes through raw pointers the tracer cannot see, and the graph would lose it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    g = make_fx(lambda x: cute_kernels.scale(x, 2.0), tracing_mode="fake")(torch.ones(8, device="meta"))
    assert "torch.ops.cute_kernels.scale.default" in g.code


@pytest.mark.parametrize("call", [
    lambda x: cute_kernels.scale(x, True),
    lambda x: cute_kernels.hc_mix_sinkhorn(x, torch.zeros(24, 64), torch.ones(3), torch.zeros(24), sinkhorn_iters=True),
    lambda x: cute_kernels.hc_mix_sinkhorn(x, torch.zeros(24, 64), torch.ones(3), torch.zeros(24), rms_eps=True),
])
def test_traced_calls_refuse_bools_the_schema_would_convert(call):
    """Through the registered op (what torch.compile and tracers call) the schema turns True into 1 or
    1.0; the pre-check sees the Python value first and refuses it, as the eager call does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.zeros(4, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(TypeError, match="must be"):
        make_fx(call, tracing_mode="fake")(x)
    with pytest.raises(TypeError, match="must be"):
        call(torch.zeros(4, 64, dtype=torch.bfloat16))  # eager: the implementation's own check


def test_ops_route_grad_requiring_calls_through_the_registered_op():
    """A new-tensor op called eagerly with an input that requires grad goes through the registered op,
    as the compiled call does: the output is tracked and backward() raises instead of the gradient
    being dropped silently.  Without grad (or for in-place ops) the implementation runs directly."""
    from cute_kernels.runtime.torch_op import custom_op

    @custom_op("_test_grad_route", mutates_args=(), fake=lambda x: torch.empty_like(x))
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.ones(3, requires_grad=True)
    y = doubled(x)
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="autograd"):
        y.sum().backward()
    with torch.no_grad():
        assert not doubled(x).requires_grad
    assert not doubled(torch.ones(3)).requires_grad

    @custom_op("_test_grad_route_inplace", mutates_args=("x",))
    def bump(x: torch.Tensor) -> None:
        x.add_(1)

    assert not bump.grad_via_op and doubled.grad_via_op


def test_jit_trace_records_the_registered_op():
    """``torch.jit.trace`` sees the registered op: the fast path treats it as tracing (until session 69 it called
    the implementation directly, so a traced graph held only what the implementation did in torch ops: for a
    kernel, its output's allocation)."""
    from cute_kernels.runtime.torch_op import custom_op, plain_eager, tracing

    @custom_op("_test_jit_trace_route", mutates_args=(), fake=lambda x: torch.empty_like(x))
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    seen = []

    def fn(x):
        seen.append((tracing(), plain_eager()))
        return doubled(x) + 1

    traced = torch.jit.trace(fn, torch.ones(3), check_trace=False)  # (its check would run fn again, eagerly)
    assert seen == [(True, False)]
    assert "cute_kernels::_test_jit_trace_route" in str(traced.graph)
    assert "aten::mul" not in str(traced.graph)  # (the implementation's own op: not traced into)
    assert torch.equal(traced(torch.full((3,), 5.0)), torch.full((3,), 11.0))
    assert (tracing(), plain_eager()) == (False, True)


def test_in_place_ops_and_inference_mode():
    """The in-place ops (meta tensors here: the registered op's route) refuse inference tensors as the tensors
    they update while inference mode is off, as torch refuses its own in-place updates of them; inside
    inference mode they take them, and take tensors that require grad even under ``torch.enable_grad()``
    (inference mode records no autograd graph; they were refused as "no backward" until session 69)."""
    def meta(*shape, requires_grad=False):
        return torch.randn(*shape, device="meta", dtype=torch.bfloat16).requires_grad_(requires_grad)

    with torch.inference_mode():
        q, k = meta(8, 4096), meta(8, 1024)
    wq, wk = meta(4096), meta(1024)
    with pytest.raises(RuntimeError, match="inference tensor"):
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
    with pytest.raises(RuntimeError, match="inference tensor"):
        cute_kernels.qk_rmsnorm_(meta(8, 4096), k, wq, wk, 1e-6)
    cute_kernels.qk_rmsnorm_(meta(8, 4096), meta(8, 1024), wq, wk, 1e-6)  # (normal tensors: fine)
    with torch.inference_mode():
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        with torch.enable_grad():
            cute_kernels.qk_rmsnorm_(meta(8, 4096, requires_grad=True), meta(8, 1024, requires_grad=True), wq, wk,
                                     1e-6)
    with pytest.raises(RuntimeError, match="no backward"):  # (autograd records here)
        cute_kernels.qk_rmsnorm_(meta(8, 4096, requires_grad=True), meta(8, 1024), wq, wk, 1e-6)


def test_register_ops_registers_every_op():
    """register_ops() registers every op, and the package's op -> module map (what a lookup in
    ``torch.ops.cute_kernels`` imports) names each op the kernel modules register, with its module."""
    code = ("import torch, cute_kernels; cute_kernels.register_ops(); "
            "print(sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith('cute_kernels::')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sorted(f"cute_kernels::{n}" for n in cute_kernels._OPS)), out
    for name, module in cute_kernels._OPS.items():
        with open(importlib.util.find_spec(module).origin) as f:
            assert f'custom_op("{name}"' in f.read(), (name, module)


def test_an_op_lookup_registers_the_op():
    """After a plain ``import cute_kernels`` (the DSL not imported), looking an op up in ``torch.ops.cute_kernels``
    imports its kernel module and finds it, also where the namespace was looked up before the package was
    imported; other names stay missing and import nothing; a module's own registration (torch looks the name
    up before defining it) does not import the others; the op packets keep torch's module name, which
    torch.export writes into a saved program; the packet a lookup returns is the one the module registered its
    FLOP formula on (a second packet made by the lookup lost the count: a reviewer's finding)."""
    code = ("import sys, torch; torch.ops.cute_kernels\n"
            "import cute_kernels\n"
            "assert 'cutlass' not in sys.modules\n"
            "assert not hasattr(torch.ops.cute_kernels, 'no_such_op') and not hasattr(torch.ops.cute_kernels, '__x__')\n"
            "assert not any(m.startswith('cute_kernels.kernels.') for m in sys.modules)\n"
            "from cute_kernels.kernels import scale\n"
            "assert sorted(m for m in sys.modules if m.startswith('cute_kernels.kernels.')) == "
            "['cute_kernels.kernels.scale']\n"
            "found = [n for n in cute_kernels._OPS if isinstance(getattr(torch.ops.cute_kernels, n), "
            "torch._ops.OpOverloadPacket)]\n"
            "assert torch.ops.cute_kernels.scale.__module__ == 'torch._ops.cute_kernels'  # (what torch.export saves)\n"
            "from torch.utils.flop_counter import FlopCounterMode\n"
            "x = torch.empty(8, 64, dtype=torch.bfloat16, device='meta')\n"
            "with FlopCounterMode(display=False) as fc:\n"
            "    cute_kernels.hc_mix_sinkhorn(x, torch.empty(24, 64, device='meta'), torch.empty(3, device='meta'), "
            "torch.empty(24, device='meta'))\n"
            "assert fc.get_total_flops() == 2 * 8 * 64 * 24, fc.get_total_flops()\n"
            "assert list(torch.ops.cute_kernels).count('hc_mix_sinkhorn') == 1\n"
            "print(sorted(found))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == str(sorted(cute_kernels._OPS)), res.stderr[-2000:]


def test_flop_counter_counts_an_op_whose_module_loads_inside_it():
    """A FlopCounterMode copies torch's FLOP formulas when made: an op whose module loads at its first use inside
    the counter (no earlier call, no ``register_ops()``) was counted as 0 FLOPs; the active counters now get the
    formula when the module registers it.  A fresh process: the kernel modules not yet imported."""
    code = ("import sys, torch, cute_kernels\n"
            "from torch.utils.flop_counter import FlopCounterMode\n"
            "assert not any(m.startswith('cute_kernels.kernels.') for m in sys.modules)\n"
            "m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device='meta')\n"
            "q, b = m(2, 128, 4, 64), torch.empty(2, 4, dtype=torch.int32, device='meta')\n"
            "with FlopCounterMode(display=False) as fc:\n"
            "    cute_kernels.ranker_attention(q, q, q, b)\n"
            "    cute_kernels.hc_mix_sinkhorn(m(8, 64), torch.empty(24, 64, device='meta'), "
            "torch.empty(3, device='meta'), torch.empty(24, device='meta'))\n"
            "print(sorted((str(k), v) for k, v in fc.get_flop_counts()['Global'].items()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    dense = 4 * 64 * 4 * 2 * 128 * 128  # (meta tensors: the dense upper bound, 4 * D * Hq per pair)
    assert res.stdout.strip() == str([("cute_kernels.hc_mix_sinkhorn", 2 * 8 * 64 * 24),
                                      ("cute_kernels.ranker_attention_fwd", dense)]), res.stdout


def _python(code, tmp_path, **env_extra):
    env = {k: v for k, v in os.environ.items() if k != "CUTE_DSL_ARCH"}
    env.update(CUTE_KERNELS_CACHE_DIR=str(tmp_path), PYTHONWARNINGS="error::RuntimeWarning", **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_cutlass_imported_first_still_compiles_for_sm90a(tmp_path):
    """cutlass imported before cute_kernels, CUTE_DSL_ARCH unset: the DSL has not picked a target yet
    (it would fall back to sm_100a at its first compile), so cute_kernels gives it sm_90a."""
    code = ("import cutlass, cute_kernels\n"
            "from cute_kernels.kernels import scale\n"
            "from cute_kernels.runtime import arch, cache\n"
            "t = scale.compile_targets()[0]; t.build()\n"
            "print(arch.dsl_arch(), '.target sm_90a' in cache.compile_record(t.kernel, t.key).ptx)\n")
    r = _python(code, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["sm_90a", "True"], r.stdout


def test_dsl_dry_run_is_a_clear_error(tmp_path):
    """``CUTE_DSL_DRYRUN=1`` makes the DSL trace without compiling: a compile says so, not an AttributeError
    on the None the DSL returns, and nothing is cached."""
    code = ("from cute_kernels.kernels import scale\n"
            "from cute_kernels.runtime import cache\n"
            "t = scale.compile_targets()[0]\n"
            "try:\n    t.build()\n"
            "except RuntimeError as e:\n    print('ERR', e)\n"
            "print(cache.entry_on_disk(t.kernel, t.key))\n")
    r = _python(code, tmp_path, CUTE_DSL_DRYRUN="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERR the CuTe DSL returned no compiled kernel (CUTE_DSL_DRYRUN=1" in r.stdout, r.stdout
    assert r.stdout.split()[-1] == "False", r.stdout


def test_dsl_settled_on_another_arch_refuses_to_compile(tmp_path):
    """cutlass imported and settled on another target before cute_kernels (set here; without a GPU its
    first compile would pick sm_100a): a warning at import, then a RuntimeError at the first compile,
    not an sm_100a object cached as sm_90a."""
    code = ("import cutlass\n"
            "from cutlass.cutlass_dsl import CuTeDSL\n"
            "CuTeDSL._get_dsl().envar.arch = 'sm_100a'\n"
            "import warnings\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import cute_kernels\n"
            "assert any('refuse to compile' in str(x.message) for x in w), w\n"
            "from cute_kernels.kernels import scale\n"
            "try:\n"
            "    scale.compile_targets()[0].build()\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n")
    r = _python(code, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: the CuTe DSL in this process compiles for 'sm_100a'" in r.stdout, r.stdout
    assert not list(tmp_path.rglob("*.o"))


def traced_graph(fn, *args, **compile_kwargs) -> str:
    """The FX graph (as text) that ``torch.compile(fn, fullgraph=True, **compile_kwargs)`` traces from ``args``; the
    backend stops before anything runs (CPU and meta tensors stand in for CUDA ones)."""

    class Traced(Exception):
        pass

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))

        def run(*args):
            raise Traced()
        return run

    torch._dynamo.reset()
    with pytest.raises(Traced):
        torch.compile(fn, fullgraph=True, backend=backend, **compile_kwargs)(*args)
    return graphs[0]


def test_ops_trace_under_torch_compile_with_dynamic_shapes():
    """torch.compile(dynamic=True, fullgraph=True) traces every op into the graph (meta tensors; the
    backend stops before anything runs): the fakes and prechecks take symbolic sizes and scalars
    (they hashed a symbolic head dim, compared symbolic widths, called math.isfinite on them)."""
    import cute_kernels as ck

    def graph_of(fn, *args):
        return traced_graph(fn, *args, dynamic=True)

    bf, meta = torch.bfloat16, dict(device="meta")
    x, w = torch.empty(8, 128, dtype=bf, **meta), torch.empty(24, 128, **meta)
    s, b = torch.empty(3, **meta), torch.empty(24, **meta)
    for method in ("walk", "tma"):
        assert "hc_mix_sinkhorn" in graph_of(lambda x, w, s, b: ck.hc_mix_sinkhorn(x, w, s, b, method=method), x, w, s, b)
    q, bounds = torch.empty(2, 256, 4, 128, dtype=bf, **meta), torch.empty(2, 4, dtype=torch.int32, **meta)
    assert "ranker_attention" in graph_of(lambda q, b: ck.ranker_attention(q, q, q, b), q, bounds)
    from cute_kernels.kernels import ranker_bwd as rb  # the explicit backward (its fake hashed the head dim)

    lse = torch.empty(2, 4, 256, **meta)
    assert "ranker_attention_bwd" in graph_of(lambda q, b, l: rb.ranker_attention_backward(q, q, q, q, l, q, b),
                                              q, bounds, lse)
    qq, kk = torch.empty(4, 64, dtype=bf, **meta), torch.empty(4, 32, dtype=bf, **meta)
    assert "qk_rmsnorm_" in graph_of(lambda q, k, a, c: ck.qk_rmsnorm_(q, k, a, c, 1e-6), qq, kk,
                                     torch.empty(64, dtype=bf, **meta), torch.empty(32, dtype=bf, **meta))
    assert "scale" in graph_of(lambda x: ck.scale(x, 2.0), torch.empty(64, dtype=bf, **meta))


def test_traced_calls_name_a_non_tensor_argument():
    """While tracing, a list where the op schema wants a tensor is a TypeError naming the argument (the
    dispatcher's schema error would be a RuntimeError)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    q = torch.zeros(2, 64, 2, 64, dtype=torch.bfloat16)
    bounds = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match="bounds must be a torch.Tensor, got list"):
        make_fx(lambda q: cute_kernels.ranker_attention(q, q, q, [[0, 1, 1, 2]] * 2), tracing_mode="fake")(q)
    with pytest.raises(TypeError, match=r"cu_seqlens must be a torch.Tensor or None, got list"):
        make_fx(lambda q, b: cute_kernels.ranker_attention(q[0], q[0], q[0], b, cu_seqlens=[0, 32, 64]),
                tracing_mode="fake")(q, bounds)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        make_fx(lambda q: cute_kernels.scale([1.0], 2.0), tracing_mode="fake")(q)
    assert "ranker_attention" in make_fx(lambda q, b: cute_kernels.ranker_attention(q, q, q, b),
                                         tracing_mode="fake")(q, bounds).code


def test_traced_in_place_ops_refuse_tensors_that_require_grad():
    """qk_rmsnorm_ works in place and has no backward: eager calls refuse inputs that require grad, and
    so must traced ones (torch.compile, FakeTensorMode), which otherwise passed gradients through as if
    the norm were not there (a newcomer's finding); under no_grad they trace."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def f(a, k, wq, wk):
        q = a * 2
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        return q

    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    a = meta(4, 128).requires_grad_()
    with pytest.raises(Exception, match="works in place and has no backward"):
        torch.compile(f, backend="aot_eager", fullgraph=True)(a, meta(4, 64), meta(128), meta(64))
    with FakeTensorMode(), pytest.raises(RuntimeError, match="works in place and has no backward"):
        f(torch.empty(4, 128, dtype=torch.bfloat16).requires_grad_(), torch.empty(4, 64, dtype=torch.bfloat16),
          torch.empty(128, dtype=torch.bfloat16), torch.empty(64, dtype=torch.bfloat16))
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.compile(f, backend="aot_eager", fullgraph=True)(a, meta(4, 64), meta(128), meta(64)).shape == (4, 128)


def test_trace_time_checks_include_strides():
    """A row stride that is not a multiple of 16 bytes is shape data, not a pointer: the trace-time
    checks refuse it as the eager ones do (before, only eager calls did)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def strided(*shape, stride):
        return torch.empty(4352 * shape[0], dtype=torch.bfloat16).as_strided(shape, stride)

    q = strided(2, 16, 4, 64, stride=(4352, 272, 68, 1))  # 272 elements = 544 bytes per token; 68 * 2 = 136 B
    kv = torch.zeros(2, 16, 4, 64, dtype=torch.bfloat16)
    bounds = torch.tensor([[0, 8, 8, 16]] * 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="stride 68 in dim 2 is not a multiple of 16 bytes"):
        make_fx(lambda *a: cute_kernels.ranker_attention(*a), tracing_mode="fake")(q, kv, kv, bounds)
    x = torch.zeros(4, 136, dtype=torch.bfloat16)[:, :128]  # row stride 272 bytes: fine
    make_fx(lambda t: cute_kernels.scale(t.contiguous(), 2.0), tracing_mode="fake")(x)
    qn = torch.zeros(4, 68, dtype=torch.bfloat16)[:, :64]  # qk_rmsnorm_ q rows 136 bytes apart
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        make_fx(lambda *a: cute_kernels.qk_rmsnorm_(*a, 1e-6), tracing_mode="fake")(
            qn, torch.zeros(4, 32, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16),
            torch.ones(32, dtype=torch.bfloat16))


def test_dynamic_compile_keeps_token_and_sequence_sizes_symbolic():
    """torch.compile(dynamic=True): one graph serves every token count / batch / sequence length (the
    32-bit extent checks called int() on the sizes, which specialized them: a recompile per new size
    and, with fullgraph=True, a hard failure after 8).  FakeTensorMode stands in for the GPU."""
    import cute_kernels as ck
    from torch._dynamo.utils import counters
    from torch._subclasses.fake_tensor import FakeTensorMode

    ck.register_ops()

    def norm(q, k, wq, wk):
        ck.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        return q

    def attn(q, b):
        return ck.ranker_attention(q, q, q, b)

    bf = torch.bfloat16
    for fn, shapes in ((norm, [((n, 128), (n, 64), (128,), (64,)) for n in (5, 6, 7, 9, 10, 11, 12, 13, 14, 15)]),
                       (attn, [((nb, s, 4, 128), (nb, 4)) for nb, s in ((2, 32), (2, 33), (3, 40), (4, 48), (5, 57))])):
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(fn, dynamic=True, fullgraph=True, backend="eager")
        with FakeTensorMode(allow_non_fake_inputs=True):
            for shape in shapes:
                args = [torch.empty(*sh, dtype=torch.int32 if len(sh) == 2 and fn is attn else bf, device="cuda")
                        for sh in shape]
                compiled(*args)
        assert counters["stats"]["unique_graphs"] == 1, (fn.__name__, dict(counters["stats"]))


def test_export_with_a_plain_dim_on_each_size(tmp_path):
    """torch.export with a plain ``Dim`` on the token / batch / sequence / row dimension: the ops' size limits
    (32-bit extents and element counts, 2^30 work tiles, hc_mix's rows, the backward's 65535 sequences) add no
    guard on a symbolic size (``validate.exceeds``).
    Before, qk_rmsnorm_'s extent guard ``512 * n <= 2^31 - 1`` crashed torch's guard printer (an
    AssertionError), and the others were refused unless the Dim carried the limit as ``max=`` (a newcomer's
    finding).  The exported program then saves, and loads in a new process after a plain ``import cute_kernels``
    (the lookup of its op imports the kernel module)."""
    import subprocess
    import sys

    import cute_kernels as ck
    from torch.export import Dim, export

    class Norm(torch.nn.Module):
        def forward(self, q, k, wq, wk):
            ck.qk_rmsnorm_(q, k, wq, wk, 1e-6)
            return q, k

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, b):
            return ck.ranker_attention(q, k, v, b, return_lse=True)

    class Mix(torch.nn.Module):
        def __init__(self, method):  # (the walk has its own 32-bit extent rule on x)
            super().__init__()
            self.method = method

        def forward(self, x, fn, scale, base):
            return ck.hc_mix_sinkhorn(x, fn, scale, base, method=self.method)

    class Scale(torch.nn.Module):
        def forward(self, x):
            return ck.scale(x, 2.0)

    class Backward(torch.nn.Module):  # (the grid's 65535 sequences)
        def forward(self, q, out, lse, dout, b):
            return ck.ranker_attention_backward(q, q, q, out, lse, dout, b)

    meta = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device="meta")  # noqa: E731
    n, nb, seq, m = Dim("n"), Dim("b"), Dim("s"), Dim("m")
    ep = export(Norm(), (meta(64, 512), meta(64, 256), meta(512), meta(256)),
                dynamic_shapes=({0: n}, {0: n}, None, None))
    assert ep.module()(meta(3, 512), meta(3, 256), meta(512), meta(256))[0].shape == (3, 512)
    q, bounds = meta(2, 128, 4, 64), meta(2, 4, dtype=torch.int32)
    export(Attn(), (q, q, q, bounds), dynamic_shapes=({0: nb}, {0: nb}, {0: nb}, {0: nb}))
    attn = export(Attn(), (q, q, q, bounds), dynamic_shapes=({1: seq}, {1: seq}, {1: seq}, None))
    out, lse = attn.module()(*(meta(2, 40, 4, 64),) * 3, bounds)
    assert out.shape == (2, 40, 4, 64) and lse.shape == (2, 4, 40) and lse.dtype == torch.float32
    f32 = torch.float32
    mix_args = (meta(8, 256), meta(24, 256, dtype=f32), meta(3, dtype=f32), meta(24, dtype=f32))
    for method in ("tma", "walk"):
        export(Mix(method), mix_args, dynamic_shapes=({0: m}, None, None, None))
    export(Scale(), (meta(16, 1024),), dynamic_shapes=({0: n},))
    export(Backward(), (q, q, meta(2, 4, 128, dtype=f32), q, bounds),
           dynamic_shapes=({0: nb}, {0: nb}, {0: nb}, {0: nb}, {0: nb}))
    path = tmp_path / "attn.pt2"
    torch.export.save(attn, path)
    load = (f"import torch, cute_kernels; ep = torch.export.load({str(path)!r}); "
            "m = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device='meta'); "
            "print(tuple(ep.module()(m(2, 56, 4, 64), m(2, 56, 4, 64), m(2, 56, 4, 64), "
            "torch.empty(2, 4, dtype=torch.int32, device='meta'))[0].shape))")
    res = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("(2, 56, 4, 64)"), res.stderr[-2000:]


def test_dynamic_compile_reports_a_bad_scalar():
    """torch.compile(dynamic=True): a scalar out of range must surface as our ValueError (Dynamo's
    'Observed exception' wrapping it), not as a tracing failure while the message is formatted."""
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")  # noqa: E731
    q = meta(1, 128, 2, 64)
    bounds = torch.tensor([[0, 64, 64, 128]], dtype=torch.int32, device="meta")
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, b, s: cute_kernels.ranker_attention(q, k, v, b, softmax_scale=s),
                      dynamic=True, fullgraph=True)
    f(q, q, q, bounds, 0.1)
    with pytest.raises(Exception) as info:
        f(q, q, q, bounds, -1.0)
    chain, e = [], info.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("softmax_scale is not finite or out of its range" in m for m in chain), chain


def test_dynamic_compile_errors_name_values_not_symbols():
    """torch.compile(dynamic=True): an argument check that fails in an op's fake (on symbolic sizes) names the
    traced call's sizes, not torch's symbols (it said ``bounds must have shape [s85, 4], got [s52, s0]``), and a
    message with a plural built from a symbolic size is no TypeError of its own (``'s' * SymBool``)."""
    import re

    import cute_kernels as ck

    meta = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device="meta")  # noqa: E731
    i32, f32 = torch.int32, torch.float32
    q = meta(2, 40, 4, 64)
    cases = [
        (lambda q, b: ck.ranker_attention(q, q, q, b), (q, meta(3, 4, dtype=i32)),
         "bounds must have shape [2, 4], got [3, 4]"),
        (lambda q, k, b: ck.ranker_attention(q, k, k, b), (q, meta(2, 41, 4, 64), meta(2, 4, dtype=i32)),
         "q [2, 40, 4, 64] and k [2, 41, 4, 64] must share batch and sequence sizes"),
        (lambda q, b, c: ck.ranker_attention(q, q, q, b, cu_seqlens=c, max_seqlen=40),
         (meta(40, 4, 64), meta(3, 4, dtype=i32), meta(3, dtype=i32)),
         "bounds has 3 rows; cu_seqlens has 3 entries, i.e. B = 2 sequences, so bounds must have 2 rows"),
        (lambda q, l, d, b: ck.ranker_attention_backward(q, q, q, q, l, d, b),
         (q, meta(2, 4, 40, dtype=f32), meta(2, 39, 4, 64), meta(2, 4, dtype=i32)),
         "dout must have shape [2, 40, 4, 64], got [2, 39, 4, 64]"),
        (lambda a, b, c, d: ck.qk_rmsnorm_(a, b, c, d, 1e-6), (meta(5, 128), meta(5, 64), meta(136), meta(64)),
         "q_weight must have shape [128], got [136]"),
        (lambda x, w, s, b: ck.hc_mix_sinkhorn(x, w, s, b),
         (meta(8, 256), meta(24, 248, dtype=f32), meta(3, dtype=f32), meta(24, dtype=f32)),
         "hc_fn must have shape [24, 256], got [24, 248]"),
    ]
    for fn, args, want in cases:
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            torch.compile(fn, dynamic=True, fullgraph=True, backend="eager")(*args)
        chain, e = [], info.value
        while e is not None:
            chain.append(e)
            e = e.__cause__ or e.__context__
        ours = [str(e) for e in chain if type(e) is ValueError]
        assert ours and want in ours[0], (want, [f"{type(e).__name__}: {e}" for e in chain])
        assert not re.search(r"(?<!\w)s\d+(?!\w)", ours[0]), ours[0]


def test_real_number_subclasses_trace_under_fullgraph():
    """A ``Fraction`` or an ``IntEnum`` scalar (numbers the eager ops take) traces into the graph as a plain float
    or int under ``fullgraph=True`` (Dynamo failed: "Failed to convert args/kwargs to proxy"; an IntEnum as a float
    argument: a RecursionError in Dynamo's ``float()``)."""
    import enum
    from fractions import Fraction

    import cute_kernels as ck

    class Iters(enum.IntEnum):
        FEW = 3

    meta = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device="meta")  # noqa: E731
    q, bounds = meta(1, 64, 2, 64), meta(1, 4, dtype=torch.int32)
    x, hc = meta(8, 256), (meta(24, 256, dtype=torch.float32), meta(3, dtype=torch.float32),
                           meta(24, dtype=torch.float32))
    cases = [(lambda x: ck.scale(x, Fraction(1, 8)), x, "0.125"),
             (lambda x: ck.scale(x, Iters.FEW), x, "scale.default](args = (%l_x_, 3)"),  # (Dynamo's float() recursed)
             (lambda q: ck.ranker_attention(q, q, q, bounds, softmax_scale=Fraction(1, 8), cap=Fraction(30)), q,
              "30.0"),
             (lambda x: ck.qk_rmsnorm_(x, x[:, :64], x[0], x[0, :64], Fraction(1, 2**20)), x, "9.5367431640625e-07"),
             (lambda x: ck.hc_mix_sinkhorn(x, *hc, sinkhorn_iters=Iters.FEW, rms_eps=Fraction(1, 2**20)), x,
              "9.5367431640625e-07")]
    for fn, arg, constant in cases:
        graph = traced_graph(fn, arg)
        assert "cute_kernels." in graph and constant in graph, graph


def test_dynamic_compile_bad_constants_keep_our_message():
    """torch.compile(dynamic=True, fullgraph=True) with a bad constant: Dynamo's ``Unsupported`` ("Observed
    exception") carries our TypeError / ValueError as its cause.  Formatting the value in our message failed while
    Dynamo traced it (a tensor's repr, a symbolic float's: "BUILD_STRING type error", "repr() on tensor"), and
    that error replaced ours."""
    import numpy as np

    import cute_kernels as ck

    meta = lambda *s, dtype=torch.float32: torch.empty(*s, dtype=dtype, device="meta")  # noqa: E731
    bf = torch.bfloat16
    x, w, sc, b = meta(8, 256, dtype=bf), meta(24, 256), meta(3), meta(24)
    q, bounds = meta(1, 64, 2, 64, dtype=bf), meta(1, 4, dtype=torch.int32)
    cases = [
        (lambda x: ck.hc_mix_sinkhorn(x, w, sc, b, sinkhorn_iters=1.5), x, "sinkhorn_iters must be an int, got float"),
        (lambda x: ck.hc_mix_sinkhorn(x, w, sc, b, method=2.5), x, "method must be a str, one of"),
        (lambda x: ck.hc_mix_sinkhorn(x, w, sc, b, rms_eps=torch.tensor(0.5)), x,
         "rms_eps must be a real number, got Tensor"),
        (lambda q: ck.ranker_attention(q, q, q, bounds, return_lse=0.1), q, "return_lse must be a bool, got float"),
        # (a bool, str or None is shown while compiling too: Dynamo formats those)
        (lambda q: ck.ranker_attention(q, q, q, bounds, return_lse="yes"), q, "must be a bool, got str 'yes'"),
        (lambda x: ck.hc_mix_sinkhorn(x, w, sc, b, method=None), x, "one of ('walk', 'tma'); got NoneType None"),
        (lambda q: ck.qk_rmsnorm_(q[0, :, 0], q[0, :, 1], q[0, 0, 0], q[0, 0, 0], eps=1e-40), q,
         "eps=<traced value> is below float32's smallest normal number"),
        # (float() of an int past float's range raised OverflowError, whose handler Dynamo cannot trace)
        (lambda x: ck.scale(x, 10**400), x, "alpha=<traced value> is out of float range"),
        (lambda q: ck.ranker_attention(q, q, q, bounds, softmax_scale=-10**400), q, "out of float range"),
        (lambda x: ck.scale(x, np.float32(0.5)), x, "pass a Python number"),  # (Dynamo traces it as an array)
    ]
    for fn, arg, want in cases:
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            torch.compile(fn, dynamic=True, fullgraph=True, backend="eager")(arg)
        chain, e = [], info.value
        while e is not None:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        assert any(want in m for m in chain), (want, chain)
    # a NaN passed in, compared with a bound that Dynamo traces as a symbolic float (torch's "Invalid NaN comparison")
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(lambda x, a: ck.scale(x, a), dynamic=True, fullgraph=True, backend="eager")(x, float("nan"))
    # (our error is the cause; torch 2.9's Dynamo keeps only its text, in Unsupported's own message)
    assert "alpha is not finite or out of its range" in f"{info.value.__cause__} {info.value}", repr(info.value)
    # without fullgraph a numpy scalar runs eagerly, as it does outside torch.compile (it failed with an
    # AssertionError inside torch: the value traced as a tensor reached a guard)
    torch._dynamo.reset()
    assert torch.compile(lambda x, a: ck.scale(x, a), backend="eager")(x, np.float64(0.5)).shape == x.shape


def test_data_dependent_sizes_trace_into_every_op():
    """A tensor whose size is known only when the graph runs (``x[mask]`` with ``capture_dynamic_output_shape_ops``)
    traces into every op under ``fullgraph=True``, and the ranker's backward into the joint graph: the argument
    checks ask no question of such a size that only the data could answer ("Could not guard on data-dependent
    expression Eq(64*u0, 0)" from ``numel() == 0``, ``u0 > 1`` from the distinct-rows test, ``Ne(Max(1, u0), 1)``
    from a stride's alignment test before).  The call checks the concrete sizes when it runs."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.backends.common import aot_autograd

    import cute_kernels as ck

    mask = torch.tensor([True, False] * 8)
    bf = torch.bfloat16
    cu, bounds = torch.tensor([0, 8], dtype=torch.int32), torch.zeros(1, 4, dtype=torch.int32)
    rows = torch.tensor([[0, 96, 96, 128]] * 16, dtype=torch.int32)
    w_q, w_k = torch.ones(256, dtype=bf), torch.ones(64, dtype=bf)
    hc = (torch.zeros(24, 1024), torch.ones(3), torch.zeros(24))

    def two_masks(x, m):  # q's and k's rows from two masks: equal only by docs/torch.md's torch._check
        q, k = x[m], x[~m][:, :64]
        torch._check(q.shape[0] == k.shape[0])
        ck.qk_rmsnorm_(q, k, w_q, w_k, 1e-6)

    cases = [(lambda x, m: ck.scale(x[m], 2.0), torch.zeros(16, 64, dtype=bf), "cute_kernels.scale"),
             (lambda q, m: ck.ranker_attention(q[m], q[m], q[m], bounds, cu_seqlens=cu, max_seqlen=8),
              torch.zeros(16, 4, 64, dtype=bf), "cute_kernels.ranker_attention_fwd"),
             (lambda q, m: ck.ranker_attention(q[m], q[m], q[m], rows[m], return_lse=True),
              torch.zeros(16, 128, 2, 64, dtype=bf), "cute_kernels.ranker_attention_fwd"),
             (lambda q, m: ck.qk_rmsnorm_(q[m], q[m][:, :64], w_q, w_k, 1e-6), torch.zeros(16, 256, dtype=bf),
              "cute_kernels.qk_rmsnorm_"),
             (lambda x, m: ck.hc_mix_sinkhorn(x[m], *hc), torch.zeros(16, 1024, dtype=bf),
              "cute_kernels.hc_mix_sinkhorn"),
             (two_masks, torch.zeros(16, 256, dtype=bf), "cute_kernels.qk_rmsnorm_")]
    cases += [  # (a size-1 dim whose stride only the data decides: B=1 of a data-dependent sequence)
        (lambda q, m: ck.ranker_attention(q[m][None], q[m][None], q[m][None], bounds),
         torch.zeros(16, 4, 64, dtype=bf), "cute_kernels.ranker_attention_fwd"),
        (lambda x, m: ck.scale(x[m].unsqueeze(0), 2.0), torch.zeros(16, 64, dtype=bf), "cute_kernels.scale")]
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):
        for fn, x, op in cases:
            graph = traced_graph(fn, x, mask)
            assert op in graph, graph

        # the backward: aot_autograd traces the joint graph; its compilers record the graphs and stop
        class Traced(Exception):
            pass

        def record(gm, example_inputs):
            graphs.append(str(gm.graph))

            def run(*args):
                raise Traced()
            return run

        backend = aot_autograd(fw_compiler=record, bw_compiler=record)
        for fn, x in [cases[1][:2], cases[2][:2]]:
            graphs = []
            torch._dynamo.reset()
            with pytest.raises(Traced):
                torch.compile(fn, fullgraph=True, backend=backend)(x.clone().requires_grad_(), mask)
            assert len(graphs) == 2 and "cute_kernels.ranker_attention_bwd" in graphs[1], graphs


def test_data_dependent_sizes_left_open_raise_ours():
    """A check that a size only the data decides leaves open raises the op's ValueError (inside Dynamo's
    TorchRuntimeError), naming the question, the arguments whose sizes it asks about and ``torch._check``, which
    then lets the call trace (torch's own "Could not guard on data-dependent expression" before); a layout the
    eager call refuses is refused with the eager message (it was torch's guard error)."""
    import torch._dynamo.config as dynamo_config

    import cute_kernels as ck

    mask = torch.tensor([True, False] * 8)
    bf = torch.bfloat16
    x, q = torch.zeros(16, 64, dtype=bf), torch.zeros(16, 128, 2, 64, dtype=bf)
    bounds = torch.zeros(16, 4, dtype=torch.int32)

    def raised(fn, *args):
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            torch.compile(fn, fullgraph=True, backend="eager")(*args)
        chain, e = [], info.value
        while e is not None:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        return "\n".join(chain)

    def scale_1d(x, m, checked=False):
        y = x[:, 0][m]
        if checked:
            torch._check(y.shape[0] % 8 == 0)
        return ck.scale(y, 2.0)

    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):
        got = raised(lambda q, m: ck.ranker_attention(q[m], q[m], q[m], bounds), q, mask)
        assert "ValueError: cute_kernels::ranker_attention_fwd: an argument check asks Ne(u0, 16)" in got, got
        assert "q.shape[0] = u0" in got and "torch._check(" in got, got
        got = raised(scale_1d, x, mask)
        assert "ValueError: cute_kernels::scale: an argument check asks Ne(Mod(u0, 8), 0)" in got, got
        assert "cute_kernels.scale" in traced_graph(lambda x, m: scale_1d(x, m, checked=True), x, mask)
        got = raised(lambda x, m: ck.scale(x[m].t(), 2.0), x, mask)
        assert "ValueError: x must be contiguous in its last dim (stride 1), got strides (1, 64)" in got, got


def test_sym_values_in_messages():
    """``validate.with_sym_values`` on a shape environment's sizes: a whole expression becomes its value,
    symbols inside other expressions theirs, other text stays."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from cute_kernels.runtime.validate import known, with_sym_values

    mode = FakeTensorMode(shape_env=ShapeEnv())
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 3)
    x = mode.from_tensor(torch.empty(12, 5, 7), symbolic_context=ctx)
    a, b, c = x.shape
    assert all(isinstance(s, torch.SymInt) for s in (a, b, c)) and len({str(a), str(b), str(c)}) == 3
    assert (known(a), known(b), known(3)) == (12, 5, 3)
    msg = f"x {list(x.shape)}, strides {x.stride()}, numel {x.numel()}, tiles ceil({a}/128)*{b}, sm_90a kept"
    got = with_sym_values(msg, (x,))
    assert got == "x [12, 5, 7], strides (35, 7, 1), numel 420, tiles ceil(12/128)*5, sm_90a kept", got
    assert with_sym_values("no symbols here", (x,)) == "no symbols here"
    assert with_sym_values(f"{a}", (torch.empty(2),)) == str(a)  # (no symbolic argument: unchanged)


def test_env_flags_read_alike(monkeypatch):
    """CUTE_KERNELS_CACHE and CUTE_KERNELS_TUNED take the same values (empty is off for both); an unknown
    value is on, with a warning."""
    import warnings

    from cute_kernels import tuning
    from cute_kernels.runtime.cache import disk_cache_enabled

    for value, on in (("", False), ("0", False), ("Off", False), ("no", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("CUTE_KERNELS_CACHE", value)
        monkeypatch.setenv("CUTE_KERNELS_TUNED", value)
        assert disk_cache_enabled() is on and tuning.tuned_enabled() is on
    monkeypatch.setenv("CUTE_KERNELS_TUNED", "maybe")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tuning.tuned_enabled()
    assert any("CUTE_KERNELS_TUNED='maybe'" in str(w.message) for w in caught)


def test_unknown_flag_value_warns_once_and_cache_dir_is_absolute(monkeypatch, tmp_path):
    """info printed the CUTE_KERNELS_CACHE warning twice (it reads the flag in two places), and showed a
    relative CUTE_KERNELS_CACHE_DIR as given, though it depends on the current folder (newcomer review,
    session 20)."""
    import warnings

    from cute_kernels.runtime.cache import cache_dir, disk_cache_enabled

    monkeypatch.setenv("CUTE_KERNELS_CACHE", "banana-s20")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert disk_cache_enabled() and disk_cache_enabled()
    assert sum("banana-s20" in str(w.message) for w in caught) == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", "rel/cache")
    cache._absolute.cache_clear()
    assert cache_dir() == tmp_path / "rel" / "cache"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # a process that changes folders keeps its cache (session 61)
    assert cache_dir() == tmp_path / "rel" / "cache"
    cache._absolute.cache_clear()


def test_blank_cache_dir_and_relative_xdg_cache_home_count_as_unset(monkeypatch, tmp_path):
    """CUTE_KERNELS_CACHE_DIR of blanks made a folder named " " in the working folder, and a relative
    XDG_CACHE_HOME was taken from the working folder too (the XDG spec says to ignore it): both now fall back to
    the next choice (newcomer audit, session 83)."""
    from cute_kernels.runtime.cache import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", " ")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")
    cache._absolute.cache_clear()
    try:
        assert cache_dir() == tmp_path / "home" / ".cache" / "cute_kernels"
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert cache_dir() == tmp_path / "xdg" / "cute_kernels"
    finally:
        cache._absolute.cache_clear()


def test_cache_report_without_home_and_on_a_dangling_link(monkeypatch, tmp_path):
    """cache_dir() must not raise where Path.expanduser does (no HOME: os.path.expanduser leaves '~' as is);
    the report (probe=False) calls a dangling symlink unusable, as compile's probe finds it (review,
    session 20)."""
    from cute_kernels.runtime import cache

    import pwd

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", "~/cc")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)  # a uid without a passwd entry (containers, env -i)
    assert cache.cache_dir().name == "cc"  # (Path.expanduser raised RuntimeError here)
    monkeypatch.undo()
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "missing")
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(link / "sub"))
    assert cache.disk_cache_problem(probe=False) is not None
    assert cache.disk_cache_problem(probe=True) is not None


def test_ops_name_themselves_for_bad_argument_lists():
    """A call that goes through the registered op (here: meta tensors) with arguments the op does not take names
    the op, not the helper that checks its scalars first."""
    import cute_kernels

    q = torch.empty(2, 4096, device="meta", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"cute_kernels.qk_rmsnorm_\(\): missing a required argument: 'eps'"):
        cute_kernels.qk_rmsnorm_(q, q, q[0], q[0])
    with pytest.raises(TypeError, match=r"cute_kernels.scale\(\): missing a required argument: 'alpha'"):
        cute_kernels.scale(q)
    with pytest.raises(TypeError, match=r"cute_kernels.qk_rmsnorm_\(\): got an unexpected keyword argument 'foo'"):
        cute_kernels.qk_rmsnorm_(q, q, q[0], q[0], 1e-6, foo=1)


def test_is_compact_tells_compact_strides_from_contiguous_ones():
    """alloc.compact_strides are torch's strides of a new tensor (size-1 and size-0 dims included); is_compact
    refuses a merely contiguous tensor (an odd stride in a size-1 dim, which torch.empty_like would copy)."""
    import itertools

    from cute_kernels.runtime import alloc

    for shape in itertools.chain([(), (1,), (7,), (0,), (0, 4), (3, 0, 2)],
                                 itertools.product([1, 2, 5], [1, 3], [1, 7, 128])):
        t = torch.empty(shape)
        assert alloc.compact_strides(shape) == t.stride() and alloc.is_compact(t)
        assert torch.empty_like(t).stride() == t.stride()
    x = torch.empty(4, 3, 8)
    assert not alloc.is_compact(x.transpose(0, 1))
    odd = x[:1].as_strided((1, 3, 8), (7, 8, 1))
    assert odd.is_contiguous() and not alloc.is_compact(odd) and torch.empty_like(odd).stride() == (7, 8, 1)


def test_cache_usage_and_prune_keep_this_fingerprint(tmp_path, monkeypatch):
    """cache_usage counts this fingerprint's entries and other fingerprints' folders; prune removes only those
    (and no other file or folder of the cache root, tuned.json included)."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    scale.compile_targets()[0].build()
    old = tmp_path / "0123456789abcdef"
    (old / "scale").mkdir(parents=True)
    (old / "scale" / "x.o").write_bytes(b"1234")
    two_hours_ago = time.time() - 7200
    os.utime(old / "scale" / "x.o", (two_hours_ago, two_hours_ago))
    (tmp_path / "tuned.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    use = cache.cache_usage()
    assert use["entries"] == 1 and use["stale"] == 1 and use["stale_bytes"] == 4 and use["bytes"] > 0
    assert cache.prune(dry_run=True) == ([old], 4, []) and old.exists()
    assert cache.prune() == ([old], 4, []) and not old.exists()
    assert (tmp_path / "tuned.json").exists() and (tmp_path / "notes").exists()
    assert (tmp_path / cache.source_fingerprint()).is_dir() and cache.cache_usage()["stale"] == 0


def test_empty_cubin_counts_as_missing(tmp_path, monkeypatch):
    """An entry whose .cubin is empty and .sass missing is recompiled (session 61: it loaded without SASS for good)."""
    t, obj = _fresh_scale_entry(tmp_path, monkeypatch)
    obj.with_suffix(".cubin").write_bytes(b"")
    obj.with_suffix(".sass").unlink(missing_ok=True)
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is not None and rec.sass


def test_missing_ptx_counts_as_missing(tmp_path, monkeypatch):
    """An entry without its .ptx is recompiled (session 71: it loaded, and its report lost the PTX features)."""
    t, obj = _fresh_scale_entry(tmp_path, monkeypatch)
    obj.with_suffix(".ptx").unlink()
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is not None and rec.ptx_features and obj.with_suffix(".ptx").exists()


def test_a_compile_without_ptx_stays_in_memory(tmp_path, monkeypatch):
    """A compile whose PTX the DSL did not keep is not written as an entry (which would be incomplete, so compiled
    again by every process): it warns and stays in memory."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    record = cache._record_from_compiled
    monkeypatch.setattr(cache, "_record_from_compiled",
                        lambda *a: dataclasses.replace(record(*a), ptx=None))
    t = scale.compile_targets()[0]
    with pytest.warns(RuntimeWarning, match="kept no PTX for scale"):
        t.build()
    assert not list(tmp_path.rglob("*.o"))


def test_cache_files_get_the_mode_of_a_plain_write(tmp_path, monkeypatch):
    """Files renamed into the cache (an entry's .sass, tuned.json) have the mode a plain open(..., 'w') gives,
    0o666 less the umask, so the other users of a shared cache can read them (they kept mkstemp's 0o600)."""
    import stat

    from cute_kernels import tuning

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    mask = os.umask(0)
    os.umask(mask)
    try:
        artifacts._write_atomically(str(tmp_path / "x.sass"), "SASS")
        tuned = tuning.store("scale", torch.float16, "N=8", {"x": 1}, "Fake GPU")
    finally:
        tuning.reload()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "x.sass", tuned)}
    assert modes == {"x.sass": 0o666 & ~mask, "tuned.json": 0o666 & ~mask}, oct(mask)


@pytest.mark.parametrize("proc", [True, False])
def test_plain_file_mode_from_several_threads_keeps_the_umask(monkeypatch, proc):
    """plain_file_mode read the umask by setting it to 0 and back: two threads doing that at once left the
    process's umask at 0 (every later file world-writable) and returned 0o666.  From /proc where it can, else
    under a lock (proc=False: /proc unreadable)."""
    if not proc:
        monkeypatch.setattr(artifacts, "_umask_from_proc", lambda: None, raising=False)
    got = set()

    def read():
        for _ in range(2000):
            got.add(artifacts.plain_file_mode.__wrapped__())

    mask = os.umask(0o027)
    try:
        run_threads(read, [()] * 4)
    finally:
        now = os.umask(mask)
    assert (oct(now), got) == (oct(0o027), {0o640})


def test_a_compiled_function_another_thread_finds_has_its_record(monkeypatch):
    """compile_cached's lock-free fast path returns a function once it is in the memory cache; compile_record must
    then find its record (the ranker ops call warn_if_spills -> compile_record right after): the record was stored
    second, so a thread finding a function another thread was storing got a KeyError.  Forced here: the compiling
    thread is held just before its second store."""
    record = artifacts.CompileRecord(kernel="k", key="x", arch=arch.target_arch())
    monkeypatch.setattr(cache, "_compile_or_load", lambda kernel, key, a, build: (object(), record))
    monkeypatch.setattr(cache, "check_target_arch", lambda: None)
    monkeypatch.setattr(cache, "_memory", {})
    monkeypatch.setattr(cache, "_records", {})
    second_store = line_of(cache.compile_cached, lambda line: line.startswith(("_memory[mkey] =", "_records[mkey] =")))
    with held_before(cache.compile_cached, second_store, lambda: cache.compile_cached("k", ("key",), None)):
        found = cache._memory.get(("k", ("key",), arch.target_arch())) is not None  # (another call's fast path)
        assert not found or cache.compile_record("k", ("key",)) is record
    assert cache.compile_record("k", ("key",)) is record


def test_sass_first_read_in_two_threads(monkeypatch):
    """CompileRecord.sass read by two threads at once: one that has seen the cubin but not yet passed it to
    nvdisasm while the other finishes its read (and drops the cubin) disassembled None (TypeError from
    subprocess).  Forced here: the first thread is held just before its disassemble line."""
    monkeypatch.setattr(artifacts, "nvdisasm_path", lambda: "/bin/echo")  # (prints its arguments: some text)
    rec = artifacts.CompileRecord(kernel="k", key="x", arch="sm_90a", _cubin=b"cubin")
    getter = artifacts.CompileRecord.sass.fget
    got = []

    def first_reader():
        try:
            got.append(rec.sass)
        except Exception as exc:  # noqa: BLE001
            got.append(exc)

    with held_before(getter, line_of(getter, lambda line: "text = disassemble(" in line), first_reader):
        second = rec.sass  # the other thread's read, completed while the first one is held
    assert isinstance(second, str) and len(got) == 1 and isinstance(got[0], str), got  # (each its own nvdisasm run)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_sass_counts_as_missing(tmp_path, monkeypatch):
    """A .sass this user may not read (another user's, written 0o600) is missing: the entry loads and its SASS is
    disassembled from the cubin (the load failed, the object was removed and the entry recompiled)."""
    t, obj = _fresh_scale_entry(tmp_path, monkeypatch)
    sass = cache.compile_record(t.kernel, t.key).sass
    sass_file = obj.with_suffix(".sass")
    assert sass and sass_file.exists()
    sass_file.chmod(0)
    cache.clear_memory_cache()
    t.build()
    rec = cache.compile_record(t.kernel, t.key)
    assert rec.compile_s is None and rec.sass == sass and obj.exists()


def test_entry_files_that_cannot_be_removed_keep_the_compile_in_memory(tmp_path, monkeypatch, capsys):
    """An entry whose files this user may not remove (another user's, in a shared folder with the sticky bit:
    unlink raises PermissionError) is left as it is: a stale object is recompiled and kept in memory, with the
    cache's warning (the PermissionError reached the caller)."""
    from pathlib import Path

    t, obj = _fresh_scale_entry(tmp_path, monkeypatch)
    assert cache.compile_record(t.kernel, t.key).sass  # (written to the entry's .sass)
    obj.write_bytes(b"not an object file")
    real_unlink = Path.unlink

    def unlink(path, missing_ok=False):
        if path.suffix in (".o", ".sass"):
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    cache.clear_memory_cache()
    cache._warn_no_disk_cache.cache_clear()
    with pytest.warns(RuntimeWarning, match="caching in memory only"):
        assert callable(t.build())
    assert cache.compile_record(t.kernel, t.key).compile_s is not None
    assert obj.read_bytes() == b"not an object file" and obj.with_suffix(".sass").exists()
    assert not list(tmp_path.rglob("*.partial"))


def _cache_folder(root, name, files, age_s):
    """A cache folder ``root/name`` of another fingerprint holding ``files`` (paths below it), written ``age_s``
    seconds ago: 2 bytes each but the ``.lock`` files, empty as filelock leaves them (filelock 4.0 empties a lock
    file it takes, which prune does to see whether anyone holds it: a lock file with bytes in it would lose them)."""
    stamp = time.time() - age_s
    for rel in files:
        f = root / name / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"" if f.suffix == ".lock" else b"12")
        os.utime(f, (stamp, stamp))
    return root / name


def test_prune_keeps_folders_in_use_and_folders_that_are_not_caches(tmp_path, monkeypatch):
    """prune removes only cache folders of other fingerprints that nobody used in the last hour: the default cache
    is shared by the checkouts of every version, and a folder named like a fingerprint is not always a cache
    folder (it removed every 16-hex-digit folder but this fingerprint's); it says what it kept and why."""
    from filelock import FileLock

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    entry = ["scale/a.o", "scale/a.json", "scale/a.ptx", "scale/a.cubin", "scale/a.sass", "scale/a.lock"]
    idle = _cache_folder(tmp_path, "00000000000000a1", entry + ["qknorm/b.o", "qknorm/b.lock"], 7200)
    recent = _cache_folder(tmp_path, "00000000000000a2", entry, 600)
    locked = _cache_folder(tmp_path, "00000000000000a3", entry, 7200)
    other = _cache_folder(tmp_path, "00000000000000a4", ["notes.txt"], 7200)
    mixed = _cache_folder(tmp_path, "00000000000000a5", entry + ["scale/data.csv"], 7200)
    empty = _cache_folder(tmp_path, "00000000000000a6", [], 7200)
    empty.mkdir()
    results = _cache_folder(tmp_path, "00000000000000a7", ["experiment1/results.json"], 7200)  # (not a cache)
    assert cache.cache_usage()["stale"] == 3  # (idle, recent, locked: the cache folders)
    with FileLock(str(locked / "scale" / "a.lock")):  # (a process compiling or loading that entry)
        two_hours_ago = time.time() - 7200  # (filelock 4.0 empties, so touches, the file it locks: old again)
        os.utime(locked / "scale" / "a.lock", (two_hours_ago, two_hours_ago))
        assert cache.prune(dry_run=True)[:2] == ([idle], 12)
        assert all(p.exists() for p in (idle, recent, locked, other, mixed, empty, results))
        removed, nbytes, kept = cache.prune()
    assert (removed, nbytes) == ([idle], 12) and not idle.exists()
    why = {p.name: reason for p, reason in kept}
    assert sorted(why) == [p.name for p in (recent, locked, other, mixed, empty, results)]
    assert why[recent.name].startswith("used 10 min ago") and "an entry lock is held (scale/a.lock" in why[locked.name]
    assert all(why[p.name].startswith("not a compile cache folder") for p in (other, mixed, empty, results))
    assert all(p.exists() for p in (recent, locked, other, mixed, empty, results))


def test_prune_probe_leaves_lock_files_as_they_are(tmp_path, monkeypatch):
    """Seeing whether an entry lock is held writes nothing: a dry run leaves the lock's bytes and times (session 71:
    the probe took the lock through filelock, and filelock 4.0 empties a lock it takes, so the folder looked just
    used and the next prune kept it; the FileLock here does what 4.0 does)."""
    from filelock import FileLock

    class EmptyingLock(FileLock):
        def acquire(self, *args, **kwargs):
            open(self.lock_file, "w").close()
            return super().acquire(*args, **kwargs)

    monkeypatch.setattr(cache, "FileLock", EmptyingLock)
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    idle = _cache_folder(tmp_path, "00000000000000b1", ["scale/a.o", "scale/a.json", "scale/a.lock"], 7200)
    lock = idle / "scale" / "a.lock"
    lock.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(lock, (two_hours_ago, two_hours_ago))
    before = lock.stat().st_mtime_ns
    assert cache.prune(dry_run=True)[:2] == ([idle], 5)
    assert lock.read_bytes() == b"x" and lock.stat().st_mtime_ns == before
    assert cache.prune()[:2] == ([idle], 5) and not idle.exists()


def test_a_load_marks_its_entry_used(tmp_path, monkeypatch):
    """Loading an entry marks its folder used (its lock's time) for prune, which goes by the files' times: an
    older checkout that only loads its entries keeps them."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    cache.clear_memory_cache()
    t = scale.compile_targets()[0]
    t.build()
    two_hours_ago = time.time() - 7200
    for f in tmp_path.rglob("*/scale/*"):
        os.utime(f, (two_hours_ago, two_hours_ago))
    cache.clear_memory_cache()
    t.build()
    assert cache.compile_record(t.kernel, t.key).compile_s is None  # loaded
    (lock,) = tmp_path.rglob("*.lock")
    assert time.time() - lock.stat().st_mtime < 600
