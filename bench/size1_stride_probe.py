"""Size-1 dims with strides that are not multiples of 16 bytes (torch counts such a tensor contiguous, and
``.contiguous()`` returns it as is): does each op accept it and give the same bits as with compact strides?

    python3 bench/size1_stride_probe.py

One JSON line per case: the op, which argument got the odd stride, and ``same_bits`` or the error.
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json
import math

import torch

import cute_kernels
from cute_kernels.kernels import hc_mix


def odd(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` (whose dim ``dim`` has size 1) viewed with stride 1 in that dim."""
    assert t.shape[dim] == 1
    stride = list(t.stride())
    stride[dim] = 1
    return t.as_strided(t.shape, stride)


def report(op, arg, fn, ref):
    try:
        got = fn()
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(got, ref))
        print(json.dumps(dict(op=op, arg=arg, same_bits=same)), flush=True)
    except Exception as exc:  # noqa: BLE001 - the point is to see the error
        print(json.dumps(dict(op=op, arg=arg, error=f"{type(exc).__name__}: {str(exc)[:300]}")), flush=True)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    bounds = torch.tensor([[0, 200, 200, 300]], device="cuda", dtype=torch.int32)
    ref = (cute_kernels.ranker_attention(q, k, v, bounds),)
    for name in ("q", "k", "v"):
        args = dict(q=q, k=k, v=v)
        args[name] = odd(args[name], 0)
        report("ranker_attention B=1", name, lambda: (cute_kernels.ranker_attention(args["q"], args["k"], args["v"],
                                                                                     bounds),), ref)
    qh, kh, vh = (t[:, :, :1].contiguous() for t in (q, k, v))  # one head: head stride 128
    ref_h1 = (cute_kernels.ranker_attention(qh, kh, vh, bounds),)
    report("ranker_attention H=1", "q, k, v (head stride 1)",
           lambda: (cute_kernels.ranker_attention(odd(qh, 2), odd(kh, 2), odd(vh, 2), bounds),), ref_h1)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)
    cute_kernels.ranker_attention(qg, kg, vg, bounds).backward(do)
    refg = (qg.grad, kg.grad, vg.grad)

    def grads(dout):
        a, b, c = (t.detach().clone().requires_grad_() for t in (q, k, v))
        cute_kernels.ranker_attention(a, b, c, bounds).backward(dout)
        return a.grad, b.grad, c.grad

    report("ranker_attention backward B=1", "dout", lambda: grads(odd(do, 0)), refg)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    wq = torch.randn(1024, device="cuda", dtype=torch.bfloat16, generator=g)
    wk = torch.randn(256, device="cuda", dtype=torch.bfloat16, generator=g)

    def norm(a, b):
        a, b = a.clone(), b.clone()
        a2, b2 = (odd(t, 0) if t is not None else None for t in (a, b))
        cute_kernels.qk_rmsnorm_(a2, b2, wq, wk, 1e-6)
        return a, b

    ref_n = (x.clone(), y.clone())
    cute_kernels.qk_rmsnorm_(ref_n[0], ref_n[1], wq, wk, 1e-6)
    report("qk_rmsnorm_ N=1", "q, k (row stride 1)", lambda: norm(x, y), ref_n)
    xm = torch.randn(1, 20480, device="cuda", generator=g).bfloat16()
    fn = torch.randn(hc_mix.N_MIX, 20480, device="cuda", generator=g) / math.sqrt(20480)
    sc = torch.rand(3, device="cuda", generator=g)
    base = torch.randn(hc_mix.N_MIX, device="cuda", generator=g)
    ref_h = cute_kernels.hc_mix_sinkhorn(xm, fn, sc, base)
    report("hc_mix_sinkhorn M=1", "x (row stride 1)", lambda: cute_kernels.hc_mix_sinkhorn(odd(xm, 0), fn, sc, base),
           ref_h)


if __name__ == "__main__":
    main()
