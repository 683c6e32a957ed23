"""GPU tests that need two devices: every public op on tensors that live on a device other than the current one.

A process that drives several GPUs (model parallelism in one process, a server with one thread per GPU, or a
training script that forgot ``torch.cuda.set_device``) calls the ops with tensors on ``cuda:1`` while the
current device is ``cuda:0``.  Each op must then run on the tensors' device, on that device's current stream
(:func:`test_side_stream_on_the_other_device`), leave the current device as it was and allocate nothing on the
other device through torch's caching allocator (what :class:`_NothingOnDevice0` can see); its results must be
the bits that the same call gives on ``cuda:0`` (both devices are the same GPU model, and every op compared
bitwise here is deterministic).  Skipped with fewer than two CUDA devices (``nvidia-h200-x2`` and larger).
"""

import threading

import pytest
import torch
from seeding import generator
from side_stream import run_behind_a_sleep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA devices")]

import cute_kernels  # noqa: E402
from cute_kernels.kernels import hc_mix  # noqa: E402
from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402

DEV0, DEV1 = torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.fixture(autouse=True)
def current_device_is_0():
    """Every test starts and must end with ``cuda:0`` current (an op that switches the device must restore it)."""
    torch.cuda.set_device(0)
    yield
    assert torch.cuda.current_device() == 0, "an op left another device current"


def _to(dev, *ts):
    return tuple(t.to(dev) for t in ts)


class _NothingOnDevice0:
    """Context: no memory allocated on ``cuda:0`` inside it (its peak allocation stays where it was)."""

    def __enter__(self):
        torch.cuda.synchronize(DEV0)
        torch.cuda.reset_peak_memory_stats(DEV0)
        self.base = torch.cuda.memory_allocated(DEV0)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(DEV0)
        torch.cuda.synchronize(DEV1)
        if exc[0] is None:
            peak = torch.cuda.max_memory_allocated(DEV0)
            assert peak == self.base, f"the call allocated {peak - self.base} bytes on cuda:0"
        return False


def _assert_same(a, b, what):
    assert a.device == DEV1, f"{what}: result on {a.device}, not cuda:1"
    assert torch.equal(a.cpu(), b.cpu()), f"{what}: cuda:1 gives other bits than cuda:0"


def _ranker_inputs(seed, b=2, s=333, hq=8, hkv=2, d=128):
    g = generator(seed)
    mk = lambda h: torch.randn(b, s, h, d, device=DEV0, dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    bounds = torch.tensor([[0, 200, 200, 333], [5, 129, 130, 300]], device=DEV0, dtype=torch.int32)[:b]
    return q, k, v, do, bounds


def test_scale():
    x0 = torch.randn(1000, 37, device=DEV0, generator=generator(1))
    want = cute_kernels.scale(x0, 3.0)
    (x1,) = _to(DEV1, x0)
    with _NothingOnDevice0():
        got = cute_kernels.scale(x1, 3.0)
    _assert_same(got, want, "scale")


@pytest.mark.parametrize("n", [1, 64, 4096, 16384])  # one CTA per row tile, and the persistent / bulk kernels
def test_qk_rmsnorm_(n):
    g = generator(2 + n)
    q0 = torch.randn(n, 4096, device=DEV0, dtype=torch.bfloat16, generator=g)
    k0 = torch.randn(n, 1024, device=DEV0, dtype=torch.bfloat16, generator=g)
    wq0 = torch.randn(4096, device=DEV0, dtype=torch.bfloat16, generator=g)
    wk0 = torch.randn(1024, device=DEV0, dtype=torch.bfloat16, generator=g)
    q1, k1, wq1, wk1 = _to(DEV1, q0, k0, wq0, wk0)
    cute_kernels.qk_rmsnorm_(q0, k0, wq0, wk0, 1e-6)
    with _NothingOnDevice0():
        cute_kernels.qk_rmsnorm_(q1, k1, wq1, wk1, 1e-6)
    _assert_same(q1, q0, f"qk_rmsnorm_ q, N={n}")
    _assert_same(k1, k0, f"qk_rmsnorm_ k, N={n}")


@pytest.mark.parametrize("method", ["walk", "tma"])
def test_hc_mix_sinkhorn(method):
    g = generator(3)
    x0 = torch.randn(777, 7168, device=DEV0, generator=g).bfloat16()
    fn0 = torch.randn(hc_mix.N_MIX, 7168, device=DEV0, generator=g) / 84.0
    scale0 = torch.rand(3, device=DEV0, generator=g) + 0.5
    base0 = torch.randn(hc_mix.N_MIX, device=DEV0, generator=g)
    want = cute_kernels.hc_mix_sinkhorn(x0, fn0, scale0, base0, method=method)
    args1 = _to(DEV1, x0, fn0, scale0, base0)
    with _NothingOnDevice0():
        got = cute_kernels.hc_mix_sinkhorn(*args1, method=method)
    for name, a, b in zip(("pre", "post", "comb"), got, want):
        _assert_same(a, b, f"hc_mix_sinkhorn {method} {name}")


@pytest.mark.parametrize("cap", [None, 30.0])
@pytest.mark.parametrize("varlen", [False, True])
def test_ranker_attention_forward(cap, varlen):
    q, k, v, _, bounds = _ranker_inputs(4)
    kw = dict(cap=cap, return_lse=True)
    if varlen:  # the two rows packed: [total, H, D], cu_seqlens, per-sequence bounds
        q, k, v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        kw.update(cu_seqlens=torch.tensor([0, 333, 666], device=DEV0, dtype=torch.int32), max_seqlen=333)
    want = cute_kernels.ranker_attention(q, k, v, bounds, **kw)
    q1, k1, v1, b1 = _to(DEV1, q, k, v, bounds)
    kw1 = {**kw, **({"cu_seqlens": kw["cu_seqlens"].to(DEV1)} if varlen else {})}
    with _NothingOnDevice0():
        got = cute_kernels.ranker_attention(q1, k1, v1, b1, **kw1)
    for name, a, b in zip(("out", "lse"), got, want):
        _assert_same(a, b, f"ranker_attention {name}")


def _grads(q, k, v, do, bounds, cap):
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    cute_kernels.ranker_attention(qq, kk, vv, bounds, cap=cap).backward(do)
    return qq.grad, kk.grad, vv.grad


@pytest.fixture
def deterministic():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("cap", [None, 30.0])
@pytest.mark.parametrize("hkv", [8, 2])
def test_ranker_attention_autograd_deterministic(cap, hkv, deterministic):
    q, k, v, do, bounds = _ranker_inputs(5, hkv=hkv)
    want = _grads(q, k, v, do, bounds, cap)
    args1 = _to(DEV1, q, k, v, do, bounds)
    with _NothingOnDevice0():
        got = _grads(*args1, cap)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        _assert_same(a, b, f"backward {name}")


def test_ranker_attention_backward_default_mode():
    """The default (non-deterministic) backward on cuda:1: its dK/dV (MHA: no float32 adds) are the bits of
    cuda:0's, dQ (float32 adds in arrival order) within float32 rounding of them, and near the float64 reference."""
    q, k, v, do, bounds = _ranker_inputs(6, hkv=8)
    out, lse = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True)
    want = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds)
    args1 = _to(DEV1, q, k, v, out, lse, do, bounds)
    with _NothingOnDevice0():
        got = rb.ranker_attention_backward(*args1)
    _assert_same(got[1], want[1], "dk")
    _assert_same(got[2], want[2], "dv")
    assert got[0].device == DEV1
    torch.testing.assert_close(got[0].cpu(), want[0].cpu(), rtol=1e-2, atol=1e-2)
    ref = rb.ranker_attention_backward_reference(q, k, v, bounds, do)
    assert (got[0].double().cpu() - ref[0].cpu()).abs().max().item() <= 1e-2 * ref[0].abs().max().item() + 2e-2


def test_torch_compile_on_the_other_device():
    q, k, v, do, bounds = _ranker_inputs(7)
    want = cute_kernels.ranker_attention(q, k, v, bounds, cap=30.0)
    q1, k1, v1, b1 = _to(DEV1, q, k, v, bounds)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda a, b, c, d: cute_kernels.ranker_attention(a, b, c, d, cap=30.0),
                                 fullgraph=True)
        got = compiled(q1, k1, v1, b1)
    finally:
        torch._dynamo.reset()
    _assert_same(got, want, "compiled ranker_attention")


def test_side_stream_on_the_other_device():
    """With a side stream of cuda:1 current there and the inputs written on it behind a long sleep
    (:func:`side_stream.run_behind_a_sleep`, run with cuda:1 current), the forward and the backward launch on that
    stream (a launch on another stream of cuda:1 would read the inputs before they exist) and nothing waits for
    the device: their results are the bits of cuda:0's."""
    q, k, v, do, bounds = _ranker_inputs(12)
    out0, lse0 = cute_kernels.ranker_attention(q, k, v, bounds, return_lse=True)
    want = rb.ranker_attention_backward(q, k, v, out0, lse0, do, bounds, deterministic=True)
    q1, k1, v1, do1, b1 = _to(DEV1, q, k, v, do, bounds)
    torch.cuda.synchronize(DEV1)

    def step(fill):
        qs, ks, vs, dos = (fill(t) for t in (q1, k1, v1, do1))
        out, lse = cute_kernels.ranker_attention(qs, ks, vs, b1, return_lse=True)
        return (out, lse, *rb.ranker_attention_backward(qs, ks, vs, out, lse, dos, b1, deterministic=True))

    with torch.cuda.device(DEV1):
        got = run_behind_a_sleep(step)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, (out0, lse0, *want)):
        assert torch.equal(a.cpu(), b.cpu()), f"side stream of cuda:1: {name} differs"


def test_cuda_graph_on_the_other_device():
    """Capture on a stream of cuda:1 inside ``with torch.cuda.device(1)`` (given explicitly: torch's default
    capture stream is created once per process, on the device current at the first capture), replay with new
    inputs copied in."""
    q, k, v, _, bounds = _ranker_inputs(8)
    x0 = torch.randn(300, 4096, device=DEV0, dtype=torch.bfloat16, generator=generator(9))
    y0 = torch.randn(300, 1024, device=DEV0, dtype=torch.bfloat16, generator=generator(10))
    w0 = torch.ones(4096, device=DEV0, dtype=torch.bfloat16)
    u0 = torch.ones(1024, device=DEV0, dtype=torch.bfloat16)
    q1, k1, v1, b1, x1, y1, w1, u1 = _to(DEV1, q, k, v, bounds, x0, y0, w0, u0)
    with torch.cuda.device(1):
        xs, ys = x1.clone(), y1.clone()
        capture = torch.cuda.Stream(DEV1)
        capture.wait_stream(torch.cuda.current_stream(DEV1))
        with torch.cuda.stream(capture):  # compile and warm outside the capture, on its stream
            cute_kernels.ranker_attention(q1, k1, v1, b1)
            cute_kernels.qk_rmsnorm_(xs, ys, w1, u1, 1e-6)
        torch.cuda.current_stream(DEV1).wait_stream(capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            out = cute_kernels.ranker_attention(q1, k1, v1, b1)
            cute_kernels.qk_rmsnorm_(xs, ys, w1, u1, 1e-6)
        for scale in (2.0, -0.5):
            q1.copy_(q * scale)
            xs.copy_(x1)
            ys.copy_(y1)
            graph.replay()
            torch.cuda.synchronize(DEV1)
            _assert_same(out, cute_kernels.ranker_attention(q * scale, k, v, bounds), f"graph out x{scale}")
            x0c, y0c = x0.clone(), y0.clone()
            cute_kernels.qk_rmsnorm_(x0c, y0c, w0, u0, 1e-6)
            _assert_same(xs, x0c, "graph qk_rmsnorm_ q")
            _assert_same(ys, y0c, "graph qk_rmsnorm_ k")


def test_one_thread_per_device():
    """Two threads, each with its own current device, calling the forward and the deterministic backward at
    once (fp16 with the soft_sign cap: kernels no other test of this file compiles, so the two threads may
    compile them at once unless the disk cache has them), eight times each: every result is the bits of
    thread 0's first call."""
    g = generator(11)
    mk = lambda h: torch.randn(2, 300, h, 64, device=DEV0, dtype=torch.float16, generator=g)  # noqa: E731
    q, k, v, do = mk(4), mk(2), mk(2), mk(4)
    bounds = torch.tensor([[0, 250, 250, 300], [3, 131, 131, 290]], device=DEV0, dtype=torch.int32)
    inputs = {0: (q, k, v, do, bounds), 1: _to(DEV1, q, k, v, do, bounds)}
    results, errors = {0: [], 1: []}, []
    start = threading.Barrier(2, timeout=120)

    def work(dev):
        try:
            torch.cuda.set_device(dev)
            start.wait()
            for _ in range(8):
                a, b, c, d, bb = inputs[dev]
                out, lse = cute_kernels.ranker_attention(a, b, c, bb, cap=5.0, cap_method="soft_sign",
                                                         return_lse=True)
                grads = rb.ranker_attention_backward(a, b, c, out, lse, d, bb, cap=5.0, cap_method="soft_sign",
                                                     deterministic=True)
                results[dev].append(tuple(t.cpu() for t in (out, lse, *grads)))
            assert torch.cuda.current_device() == dev
        except BaseException as exc:  # reported by the main thread
            start.abort()  # (the other thread, if still at the barrier, stops waiting)
            errors.append((dev, exc))

    threads = [threading.Thread(target=work, args=(dev,), daemon=True) for dev in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 300 s"
    assert not errors, errors
    want = results[0][0]
    for dev in (0, 1):
        for i, got in enumerate(results[dev]):
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
                assert torch.equal(a, b), f"device {dev}, call {i}: {name} differs"
