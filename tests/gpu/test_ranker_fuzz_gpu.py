"""Randomized differential tests of the ranker attention, forward and backward, against the float64 reference.

The case-matrix tests (test_ranker_fwd_gpu.py, test_ranker_bwd_gpu.py) pick their cases by hand; here each case
draws everything at once from the run's seed and its index (tests/seeding.py: ``CUTE_KERNELS_SEED`` replays a
failure; the assertion message describes the case): dtype, head dim, GQA ratio and form, cap method and value,
softmax scale, fixed length (1 to 6500 tokens) or packed (1 to 16 sequences of 0 to 2000 tokens and a tail of
unowned tokens), per-row bounds
(history and candidates in either order, overlapping, empty, out of range), tensor layouts (compact, q/k/v as
slices of one packed qkv tensor, head-major views, padded rows), input scale, the deterministic mode (bitwise on
a repeat too) and the backward's schedule fields (``walk_stagger``, ``dq_zero_in_mainloop``); fixed-length rows
of up to 6500 tokens reach the backward's preprocess-zeroed dQ, packed calls pass ``max_seqlen`` or not.  Each
case runs the forward (out and LSE against float64, the forward tests' bar) and the explicit backward into
NaN-poisoned gradients (dq, dk, dv against the float64 autograd reference, the backward tests' bar): ``_compare``
of the backward tests; then, for some, the forward without the LSE (the same bits as with it).

``CUTE_KERNELS_FUZZ_CASES`` (default 12) sets the number of cases; the GPU run of a session takes more
(``CUTE_KERNELS_FUZZ_CASES=64 python3 -m pytest -n 12 tests/gpu/test_ranker_fuzz_gpu.py``).  Each new
combination of dtype, head dim, GQA ratio, cap method, fixed / packed form and backward mode compiles its
kernels on first use.
"""

import dataclasses
import random

import pytest
import torch
from seeding import FUZZ_CASES, RUN_SEED, case_rng, generator
from test_ranker_bwd_gpu import _compare

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402
from cute_kernels.kernels import ranker_fwd as rf  # noqa: E402

def _bounds_row(rng: random.Random, s: int) -> list[int]:
    """(hist_lo, hist_hi, cand_lo, cand_hi) for a row of ``s`` tokens, in one of the shapes the mask must take."""
    def cut(lo=0, hi=s):
        return rng.randint(lo, max(lo, hi))

    kind = rng.choice(["history-then-candidates", "candidates-first", "overlap", "random", "empty", "all-history"])
    if kind == "history-then-candidates":
        h_lo = cut(0, s // 8)
        h_hi = cut(h_lo, s)
        return [h_lo, h_hi, h_hi, cut(h_hi, s)]
    if kind == "candidates-first":
        c_lo = cut(0, s // 4)
        c_hi = cut(c_lo, s // 2)
        h_lo = cut(c_hi, s)
        return [h_lo, cut(h_lo, s), c_lo, c_hi]
    if kind == "overlap":  # candidates inside the history: their self key is a history key too
        h_lo, h_hi = sorted((cut(), cut()))
        c_lo = cut(h_lo, h_hi)
        return [h_lo, h_hi, c_lo, cut(c_lo, s)]
    if kind == "random":  # any values: clamped to [0, s], hi < lo empty
        return [rng.randint(-5, s + 5) for _ in range(4)]
    if kind == "empty":
        x = cut()
        return [x, x, cut(), rng.randint(-3, 0)]
    return [0, s, s, s]


def _layout(rng: random.Random, shapes: list[tuple], dtype, g: torch.Generator, scale: float):
    """q, k, v of ``shapes`` ([..., H, D] each; q first) in a random layout, values ``scale * N(0, 1)``."""
    kind = rng.choice(["compact", "compact", "qkv-slices", "head-major", "padded-rows"])
    lead, d = shapes[0][:-2], shapes[0][-1]
    heads = [s[-2] for s in shapes]
    mk = lambda shape: scale * torch.randn(*shape, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    if kind == "qkv-slices":  # one packed tensor, as a fused qkv projection writes it
        base = mk((*lead, sum(heads), d))
        ends = [sum(heads[:i + 1]) for i in range(3)]
        return [base[..., e - h:e, :] for e, h in zip(ends, heads)], kind
    if kind == "head-major":  # [..., H, S, D] storage viewed as [..., S, H, D]
        return [mk((*lead[:-1], h, lead[-1], d)).transpose(-3, -2) for h in heads], kind
    if kind == "padded-rows":  # rows of a longer buffer: the sequence / token stride exceeds the row
        pad = 8 * rng.randint(1, 4)
        return [mk((*lead, h, d + pad))[..., :d] if rng.random() < 0.5 else mk((*lead[:-1], lead[-1] + pad, h, d))[
            ..., :lead[-1], :, :] for h in heads], kind
    return [mk(s) for s in shapes], kind


def _case(i: int) -> dict:
    rng = case_rng(i)
    d = rng.choices([64, 128, 256], weights=[4, 5, 2])[0]
    dtype = rng.choices([torch.bfloat16, torch.float16], weights=[3, 1])[0]
    hkv = rng.choice([1, 2, 4])
    hq = hkv * rng.choice([1, 1, 2, 4] + [8] * (hkv < 4))
    cap_method = rng.choice(["none", "none", "tanh", "soft_sign"])
    cap = None if cap_method == "none" else round(10 ** rng.uniform(0, 2), 3)
    case = dict(d=d, dtype=dtype, hq=hq, hkv=hkv, cap=cap, cap_method="tanh" if cap is None else cap_method,
                scale=None if rng.random() < 0.7 else round(rng.uniform(0.02, 0.3), 4),
                input_scale=rng.choice([0.5, 1.0, 1.0, 2.0, 4.0]), varlen=rng.random() < 0.3,
                deterministic=rng.random() < 0.3, gqa_group=rng.choice([None, True, False]) if hq > hkv else None)
    if rng.random() < 0.3:  # the backward's config fields that change its schedule
        case["fields"] = dict(walk_stagger=rng.choice([None, 0, 1, 2]), dq_zero_in_mainloop=rng.random() < 0.7)
    if case["varlen"]:
        n = rng.choice([rng.randint(1, 5), rng.randint(6, 16)])
        case["seqlens"] = [rng.choices([0, 1, rng.randint(2, 700), rng.randint(701, 2000)], weights=[1, 1, 6, 1])[0]
                           for _ in range(n)]
        case["tail"] = rng.choice([0, rng.randint(1, 50)])
        case["bounds"] = [_bounds_row(rng, s) for s in case["seqlens"]]
        case["max_seqlen"] = rng.choice([None, None, max(case["seqlens"]) + rng.choice([0, 1, 100])])
    else:
        case["b"], case["s"] = rng.randint(1, 4), rng.choices([1, rng.randint(2, 900), rng.randint(901, 2500),
                                                               rng.randint(5633, 6500)], weights=[1, 6, 2, 1])[0]
        if case["s"] > 2500:  # past the backward's in-mainloop dQ zeroing (2,816 / 5,632 tokens): few heads
            case["hkv"] = hkv = 1
            case["hq"] = hq = rng.choice([1, 2])
            case["gqa_group"] = rng.choice([None, True, False]) if hq > hkv else None
        # the float64 references hold ~10 [B, Hq, S, S] float64 tensors: at most ~10 GB per case (pytest -n runs
        # several at once on one GPU)
        case["b"] = max(1, min(case["b"], int(1.2e8 // (hq * case["s"] ** 2))))
        case["bounds"] = [_bounds_row(rng, case["s"]) for _ in range(case["b"])]
    case["without_lse"] = rng.random() < 0.4
    case["layout_rng"] = rng.random()
    return case


def _describe(i: int) -> str:
    c = _case(i)
    form = f"varlen{len(c['seqlens'])}" if c["varlen"] else f"B{c['b']}S{c['s']}"
    return (f"{i}-d{c['d']}-{str(c['dtype'])[6:]}-h{c['hq']}/{c['hkv']}-{c['cap_method'] if c['cap'] else 'nocap'}"
            f"-{form}{'-det' if c['deterministic'] else ''}")


@pytest.mark.parametrize("i", range(FUZZ_CASES), ids=lambda i: f"case{i}")  # (ids the same in every process)
def test_random_case(i):
    c = _case(i)
    rng = random.Random(c["layout_rng"])
    g = generator(5000 + i)
    d, hq, hkv = c["d"], c["hq"], c["hkv"]
    if c["varlen"]:
        total = sum(c["seqlens"]) + c["tail"]
        shapes = [(max(total, 1), h, d) for h in (hq, hkv, hkv)]
        offsets = [0]
        for s in c["seqlens"]:
            offsets.append(offsets[-1] + s)
        cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
    else:
        shapes = [(c["b"], c["s"], h, d) for h in (hq, hkv, hkv)]
        cu = None
    (q, k, v), layout = _layout(rng, shapes, c["dtype"], g, c["input_scale"])
    do = torch.randn(q.shape, device="cuda", dtype=c["dtype"], generator=g)
    bounds = torch.tensor(c["bounds"], device="cuda", dtype=torch.int32)
    config = dataclasses.replace(rb.config_for(d, c["cap"] is not None), deterministic=c["deterministic"],
                                 gqa_group_per_cta=c["gqa_group"], **c.get("fields", {}))
    name = (f"fuzz {_describe(i)} {layout} bounds={c['bounds']} cap={c['cap']} scale={c['scale']} "
            f"fields={c.get('fields')} max_seqlen={c.get('max_seqlen')} (CUTE_KERNELS_SEED={RUN_SEED})")
    print(name)
    kw = dict(cap=c["cap"], cap_method=c["cap_method"], cu_seqlens=cu, softmax_scale=c["scale"])
    grads = _compare(name, q, k, v, do, bounds, cap=c["cap"], cap_method=c["cap_method"], cu_seqlens=cu,
                     max_seqlen=c.get("max_seqlen"), scale=c["scale"], config=config)
    if c["deterministic"]:  # the same bits on a second run
        out, lse = rf.ranker_attention(q, k, v, bounds, return_lse=True, max_seqlen=c.get("max_seqlen"), **kw)
        again = rb.ranker_attention_backward(q, k, v, out, lse, do, bounds, max_seqlen=c.get("max_seqlen"),
                                             config=config, **kw)
        for gname, a, b in zip(("dq", "dk", "dv"), grads, again):
            assert torch.equal(a, b), f"{name}: deterministic {gname} differs on a second run"
    if c["without_lse"]:  # the kernel variant without the LSE: the same bits (full path, then the kept plan)
        out, _ = rf.ranker_attention(q, k, v, bounds, return_lse=True, **kw)
        for _ in range(2):
            assert torch.equal(rf.ranker_attention(q, k, v, bounds, **kw), out), f"{name}: without the LSE"
    torch.cuda.empty_cache()  # (the references' peak, returned for the other processes of a pytest -n run)
