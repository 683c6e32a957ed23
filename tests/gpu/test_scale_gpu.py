"""GPU: the scale kernel from torch (poisoned outputs, odd sizes, streams, graphs, torch.compile)."""

import pytest
import torch
from side_stream import run_behind_a_sleep

import cute_kernels
from cute_kernels.kernels import scale as mod


@pytest.mark.parametrize("dtype", mod.DTYPES)
@pytest.mark.parametrize("n", [8, 24, 4096 + 8, 123456 * 8, 1 << 22])
def test_matches_reference_and_writes_every_element(dtype, n):
    n = n - n % (16 // torch.tensor([], dtype=dtype).element_size())
    x = torch.randn(n, device="cuda", dtype=dtype)
    alpha = float(torch.randn(()).item())
    y = torch.full_like(x, float("nan"))  # poison
    mod._compile(dtype, mod.ScaleConfig())(x, y, alpha)
    torch.cuda.synchronize()
    assert torch.equal(y, cute_kernels.scale_reference(x, alpha))


def test_does_not_write_past_the_end():
    x = torch.randn(4096 + 8, device="cuda", dtype=torch.bfloat16)
    buf = torch.full((x.numel() + 64,), 7.0, device="cuda", dtype=torch.bfloat16)
    mod._compile(x.dtype, mod.ScaleConfig())(x, buf[: x.numel()], 2.0)
    assert torch.all(buf[x.numel():] == 7.0)


def test_public_op_multi_dim_and_empty():
    x = torch.randn(3, 5, 8, device="cuda", dtype=torch.float16)
    assert torch.equal(cute_kernels.scale(x, 0.5), cute_kernels.scale_reference(x, 0.5))
    e = torch.empty(0, 8, device="cuda", dtype=torch.float16)
    assert cute_kernels.scale(e, 2.0).shape == (0, 8)
    # rows shorter than 16 bytes: the kernel reads x flat (these were refused: "stride 4 ... not a multiple of 16")
    for shape, dtype in (((4, 4), torch.bfloat16), ((2, 3, 4), torch.bfloat16), ((2, 2), torch.float32)):
        x = torch.randn(*shape, device="cuda", dtype=dtype)
        assert torch.equal(cute_kernels.scale(x, 0.5), cute_kernels.scale_reference(x, 0.5)), (shape, dtype)


def test_runs_on_current_stream():
    """On a side stream whose input is written there behind a long sleep (:func:`side_stream.run_behind_a_sleep`),
    the kernel launches on that stream (a launch on another would read x before it is written).  (Until session
    69 x was written before the sleep, so a launch on the wrong stream gave the right answer too.)"""
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    y = run_behind_a_sleep(lambda fill: cute_kernels.scale(fill(x), 3.0))
    assert torch.equal(y, cute_kernels.scale_reference(x, 3.0))


def test_cuda_graph_capture_and_replay():
    x = torch.randn(1 << 16, device="cuda", dtype=torch.bfloat16)
    cute_kernels.scale(x, 2.0)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = cute_kernels.scale(x, 2.0)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, cute_kernels.scale_reference(x, 2.0))


def test_torch_compile():
    f = torch.compile(lambda t: cute_kernels.scale(t, 2.0) + 1, fullgraph=True)
    x = torch.randn(4096, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(f(x), x * 2 + 1)


def test_opcheck():
    x = torch.randn(64, device="cuda", dtype=torch.float32)
    torch.library.opcheck(mod.scale.op, (x, 2.0))
