"""GPU: every op called on a tensor whose size only the data decides (``x[mask]`` under ``torch.compile`` with
Dynamo's ``capture_dynamic_output_shape_ops``, ``fullgraph=True``, inductor) gives what the eager call on the same
rows gives: the same bits for the forward kernels, the ranker's gradients within float32 reduce-add order.  The
CPU test ``test_data_dependent_sizes_trace_into_every_op`` checks that the calls trace; this one runs them."""

import pytest
import torch
import torch._dynamo.config as dynamo_config

import cute_kernels as ck


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def _mask(n, rows):
    """``rows`` of ``n`` picked at random (the compiled graph sees their count only when it runs)."""
    m = torch.zeros(n, dtype=torch.bool, device="cuda")
    m[torch.randperm(n, device="cuda")[:rows]] = True
    return m


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True)


@pytest.fixture(autouse=True)
def _dynamic_output_shapes():
    with dynamo_config.patch(capture_dynamic_output_shape_ops=True):
        yield


def test_scale_hc_mix_and_qk_norm_match_eager_bitwise():
    x, m = _rand(48, 64), _mask(48, 29)
    assert torch.equal(_compiled(lambda x, m: ck.scale(x[m], 0.75))(x, m), ck.scale(x[m], 0.75))

    hc = (_rand(24, 1024, dtype=torch.float32), _rand(3, dtype=torch.float32), _rand(24, dtype=torch.float32))
    x, m = _rand(40, 1024), _mask(40, 23)
    got, want = _compiled(lambda x, m: ck.hc_mix_sinkhorn(x[m], *hc))(x, m), ck.hc_mix_sinkhorn(x[m], *hc)
    assert all(torch.equal(g, w) for g, w in zip(got, want))

    q, k, wq, wk, m = _rand(37, 512), _rand(37, 128), _rand(512), _rand(128), _mask(37, 20)

    def norm(q, k, m):
        q, k = q[m], k[m]
        ck.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        return q, k

    got, want = _compiled(norm)(q, k, m), norm(q, k, m)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("form", ["fixed", "packed", "one-row"])
def test_ranker_forward_and_backward_match_eager(form):
    """The forward compiled with x requiring grad (AOTAutograd's joint graph: the op's backward in the compiled
    backward), the gradient taken outside, as a training step does.  ``one-row``: B=1 whose sequence the mask
    picks (``x[m][None]``: a size-1 batch dim whose stride only the data decides)."""
    packed = form == "packed"
    if form == "one-row":
        x, m = _rand(300, 4, 128), _mask(300, 190)
        bounds = torch.tensor([[0, 150, 150, 190]], device="cuda", dtype=torch.int32)
        extra = {}
    elif packed:
        x, m = _rand(300, 4, 128), _mask(300, 180)
        cu = torch.tensor([0, 61, 180], device="cuda", dtype=torch.int32)
        bounds = torch.tensor([[0, 40, 40, 61], [5, 70, 80, 119]], device="cuda", dtype=torch.int32)
        extra = dict(cu_seqlens=cu, max_seqlen=119)
    else:
        x, m = _rand(6, 200, 4, 128), _mask(6, 4)
        bounds = torch.tensor([[0, 150, 150, 200]] * 6, device="cuda", dtype=torch.int32)
        bounds[1] = torch.tensor([10, 97, 120, 190])
        extra = {}

    def forward(x, m):
        xm = x[m][None] if form == "one-row" else x[m]
        return ck.ranker_attention(xm, xm, xm, bounds if form != "fixed" else bounds[m], cap=30.0, return_lse=True,
                                   **extra)

    dout = _rand(*forward(x, m)[0].shape)
    results = []
    for fn in (forward, _compiled(forward)):
        leaf = x.detach().requires_grad_()
        out, lse = fn(leaf, m)
        results.append((out, lse, torch.autograd.grad(out, leaf, dout)[0]))
    (want_out, want_lse, want_dx), (out, lse, dx) = results
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert not dx[~m].any()  # (rows the mask dropped get no gradient)
    torch.testing.assert_close(dx, want_dx, atol=2e-2, rtol=2e-2)  # (float32 reduce-adds in any order)
