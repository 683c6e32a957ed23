"""Randomized bad arguments to the public ops (CPU, on meta tensors, where the ops run every argument check and
launch nothing): a valid call, then one to three random mutations (dtypes, sizes, dimensions, strides, devices,
non-tensors, scalar values and types).  The property: the call either returns outputs of the right shapes or
raises ``TypeError`` / ``ValueError`` (the documented errors of bad input), never another exception, and it
raises where a mutation leaves an argument that no call can take (not a tensor, a CPU tensor beside meta ones, a
dtype no op takes, a non-contiguous last dim).  Fresh
mutations every run (tests/seeding.py: ``CUTE_KERNELS_SEED`` replays them); the failure message names the call.
"""

import random
import re

import pytest
import torch
from seeding import case_rng

import cute_kernels

CASES = 300
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool,
          torch.uint8, torch.complex64]
SCALARS = [None, 0, 1, -1, 0.0, 1e-40, 0.1, 2.5, 1e39, float("nan"), float("inf"), -float("inf"), True, False, "1",
           [1.0], 2**40, torch.tensor(0.5)]


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def mutate_tensor(rng: random.Random, t, index: bool = False):
    """One random change of a tensor argument (or its replacement by something that is not one): ``(new, invalid)``,
    ``invalid`` True where every op must refuse the result whatever else the call holds (not a tensor, a CPU
    tensor beside meta ones, a dtype none of them takes, a last dim that is not contiguous).  ``index``: the
    argument is an int32 one (bounds, cu_seqlens), whatever dtype an earlier change gave it."""
    kind = rng.choice(["dtype", "size", "ndim-", "ndim+", "last-dim-strided", "stride-0", "step-2", "cpu", "none",
                       "list", "zero-size"])
    if not isinstance(t, torch.Tensor):
        return meta(3, dtype=rng.choice(DTYPES)), False
    # (a last dim of one element is contiguous whatever its stride, and so is an empty tensor)
    wide = t.dim() >= 1 and t.shape[-1] > 1 and t.numel() > 0
    if kind == "dtype":
        dtype = rng.choice(DTYPES)
        taken = (torch.int32,) if index else (torch.bfloat16, torch.float16, torch.float32)
        return t.to(dtype), dtype not in taken
    if kind == "size" and t.dim():
        shape = list(t.shape)
        i = rng.randrange(len(shape))
        shape[i] = max(0, shape[i] + rng.choice([-1, 1, 7, -shape[i], 2**20]))
        return torch.empty(shape, device="meta", dtype=t.dtype), False
    if kind == "ndim-" and t.dim():
        return (t[0] if t.shape[0] else t.sum(0).to(t.dtype)), False
    if kind == "ndim+":
        return t.unsqueeze(rng.randrange(t.dim() + 1)), False
    if kind == "last-dim-strided" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2), wide and t.shape[-2] > 1
    if kind == "stride-0" and t.dim():
        return t[..., :1].expand(t.shape), wide
    if kind == "step-2" and t.dim():
        return torch.empty((*t.shape[:-1], 2 * t.shape[-1]), device="meta", dtype=t.dtype)[..., ::2], wide
    if kind == "cpu" and t.numel() < 1 << 20:
        return torch.zeros(t.shape, dtype=t.dtype), t.numel() > 0
    if kind == "none":
        return None, True
    if kind == "list":
        return [1, 2, 3], True
    if kind == "zero-size" and t.dim():
        return torch.empty((0, *t.shape[1:]), device="meta", dtype=t.dtype), False
    return t, False


def mutated_case(name, valid_args, case):
    """Case ``case`` of op ``name``: ``(args, must_raise, desc)``, a valid call's arguments after one to three
    random mutations, the arguments no call can take, and a description naming the call."""
    rng = case_rng(case)
    args = dict(valid_args(rng))
    tensors = {k for k, v in args.items() if isinstance(v, torch.Tensor)}  # (required tensor arguments)
    index = {k for k in tensors if args[k].dtype == torch.int32}
    changes, invalid = [], {}
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(sorted(args))
        if isinstance(args[key], torch.Tensor) or rng.random() < 0.2:
            args[key], bad = mutate_tensor(rng, args[key], key in index)
            invalid[key] = bad and key in tensors
        else:
            args[key], invalid[key] = rng.choice(SCALARS), False
        changes.append(key)
    must_raise = sorted(k for k, bad in invalid.items() if bad)
    desc = f"{name} case {case}: changed {changes}: " + ", ".join(
        f"{k}={tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}"
        + (f"/{v.dtype}/{v.device}/{v.stride()}" if isinstance(v, torch.Tensor) else "") for k, v in args.items())
    return args, must_raise, desc


def run_fuzz(name, valid_args, call, check_outputs, case):
    args, must_raise, desc = mutated_case(name, valid_args, case)
    try:
        out = call(args)
    except (TypeError, ValueError):
        return
    except Exception as e:  # noqa: BLE001 (the property under test)
        pytest.fail(f"{desc}: {type(e).__name__}: {e}")
    assert not must_raise, f"{desc}: accepted, but {must_raise} cannot be right"
    check_outputs(args, out, desc)


def ranker_valid(rng):
    b, s, hkv, d = rng.randint(1, 3), rng.randint(1, 300), rng.choice([1, 2]), rng.choice([64, 128, 256])
    hq = hkv * rng.choice([1, 2])
    dtype = rng.choice([torch.bfloat16, torch.float16])
    lead = (b, s)
    args = dict(softmax_scale=None, cap=rng.choice([None, 30.0]), cap_method="tanh", return_lse=True)
    if rng.random() < 0.4:  # the packed form: [T, H, D] with cu_seqlens [B + 1] (values unread on meta tensors)
        lead = (b * s,)
        args.update(cu_seqlens=meta(b + 1, dtype=torch.int32), max_seqlen=rng.choice([None, s]))
    return dict(q=meta(*lead, hq, d, dtype=dtype), k=meta(*lead, hkv, d, dtype=dtype),
                v=meta(*lead, hkv, d, dtype=dtype), bounds=meta(b, 4, dtype=torch.int32), **args)


def ranker_call(a):
    return cute_kernels.ranker_attention(a["q"], a["k"], a["v"], a["bounds"], softmax_scale=a["softmax_scale"],
                                         cap=a["cap"], cap_method=a["cap_method"], return_lse=a["return_lse"],
                                         cu_seqlens=a.get("cu_seqlens"), max_seqlen=a.get("max_seqlen"))


def ranker_outputs(a, out, desc):
    o, lse = out if a["return_lse"] else (out, None)
    assert o.shape == a["q"].shape and o.dtype == a["q"].dtype, desc
    if lse is not None:
        want = (a["q"].shape[1], a["q"].shape[0]) if a["q"].dim() == 3 else (a["q"].shape[0], *a["q"].shape[2:0:-1])
        assert lse.shape == want and lse.dtype == torch.float32, desc


def qknorm_valid(rng):
    n, dtype = rng.randint(1, 64), rng.choice([torch.bfloat16, torch.float16, torch.float32])
    qd, kd = 8 * rng.randint(1, 64), 8 * rng.randint(1, 16)
    return dict(q=meta(n, qd, dtype=dtype), k=meta(n, kd, dtype=dtype), q_weight=meta(qd, dtype=dtype),
                k_weight=meta(kd, dtype=dtype), eps=1e-6)


def qknorm_call(a):
    return cute_kernels.qk_rmsnorm_(a["q"], a["k"], a["q_weight"], a["k_weight"], a["eps"])


def qknorm_outputs(a, out, desc):
    assert out is None, desc


def hc_mix_valid(rng):
    m, k = rng.randint(1, 64), 64 * rng.randint(1, 8)
    return dict(x=meta(m, k), hc_fn=meta(24, k, dtype=torch.float32), hc_scale=meta(3, dtype=torch.float32),
                hc_base=meta(24, dtype=torch.float32), sinkhorn_iters=20, rms_eps=1e-6, hc_eps=1e-6,
                method=rng.choice(["tma", "walk"]))


def hc_mix_call(a):
    return cute_kernels.hc_mix_sinkhorn(a["x"], a["hc_fn"], a["hc_scale"], a["hc_base"],
                                        sinkhorn_iters=a["sinkhorn_iters"], rms_eps=a["rms_eps"],
                                        hc_eps=a["hc_eps"], method=a["method"])


def hc_mix_outputs(a, out, desc):
    m = a["x"].shape[0]
    assert [tuple(t.shape) for t in out] == [(m, 4), (m, 4), (m, 4, 4)], desc


OPS = {"ranker_attention": (ranker_valid, ranker_call, ranker_outputs),
       "qk_rmsnorm_": (qknorm_valid, qknorm_call, qknorm_outputs),
       "hc_mix_sinkhorn": (hc_mix_valid, hc_mix_call, hc_mix_outputs)}


@pytest.mark.parametrize("op", sorted(OPS))
def test_valid_meta_calls_pass(op):
    """The unmutated calls succeed with the right output shapes (so the property below is not vacuous)."""
    valid, call, check = OPS[op]
    for case in range(20):
        args = valid(case_rng(10_000 + case))
        check(args, call(args), f"{op} valid case {case}")


@pytest.mark.parametrize("op", sorted(OPS))
def test_bad_arguments_raise_type_or_value_errors(op):
    valid, call, check = OPS[op]
    for case in range(CASES):
        run_fuzz(op, valid, call, check, case)


COMPILED_CASES = 30
_SYMBOL = re.compile(r"(?<!\w)[su]\d+(?!\w)")  # a size symbol of torch's shape environment (s85, u0)


@pytest.mark.parametrize("op", sorted(OPS))
def test_bad_arguments_under_dynamic_compile_raise_ours(op):
    """The mutated calls under ``torch.compile(dynamic=True, fullgraph=True)`` (meta tensors as graph inputs, the
    scalars as constants): each traces, or fails with our ``TypeError`` / ``ValueError`` somewhere in the exception's
    chain (Dynamo's ``TorchRuntimeError`` from an op's fake, or its "Observed exception" from the Python wrapper)
    naming values, not torch's size symbols.  Formatting a message with a tensor or a symbolic float failed while
    Dynamo traced it, and its own error replaced ours; messages showed ``[s85, 4]``."""
    valid, call, _ = OPS[op]
    for case in range(COMPILED_CASES):
        args, _, desc = mutated_case(op, valid, 20_000 + case)
        tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
        rest = {k: v for k, v in args.items() if k not in tensors}
        torch._dynamo.reset()
        try:
            torch.compile(lambda **t: call({**rest, **t}), dynamic=True, fullgraph=True, backend="eager")(**tensors)
            continue
        except Exception as e:  # noqa: BLE001 (the property under test)
            chain = []
            while e is not None:
                chain.append(e)
                e = e.__cause__ or e.__context__
        ours = [str(e) for e in chain if type(e) in (TypeError, ValueError)]
        ours += [str(e) for e in chain  # (Dynamo's copies: ObservedTypeError, ObservedValueErrorError, ...)
                 if type(e).__name__.startswith("Observed") and re.match(r"raised exception (Type|Value)Error\(", str(e))]
        # (torch 2.9's Dynamo keeps the message only in Unsupported's text: "raised exception
        # TypeError([ConstantVariable(str: '...')])"; its Observed copy names the class alone)
        ours += [m.group(0) for e in chain
                 for m in [re.search(r"raised exception (Type|Value)Error\(\[ConstantVariable\(str: .*", str(e))] if m]
        text = " <- ".join(f"{type(e).__name__}: {str(e)[:300]}" for e in chain)
        assert ours, f"{desc}: no TypeError / ValueError of ours in {text}"
        assert not any(_SYMBOL.search(m) for m in ours), f"{desc}: a size symbol in {ours}"
