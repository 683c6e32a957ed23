"""Tuning sweep of the one-GPU fused Q/K RMSNorm: vectors per thread, persistent CTAs, bulk-staged rows
(``bulk_CxS``: C CTAs per SM x S staged rows).

    python3 bench/qknorm_sweep.py [--rounds=N] [--n=256,512,...] [--qk=4096,1024] [--only=NAME,...] [--help]

For each N (bf16, Q=4096 and K=1024 unless ``--qk`` says otherwise) every tuning is timed in a CUDA graph in ``--rounds`` rounds of shuffled
order (median printed, with every round), next to two stock kernels that move the same bytes: torch's
out-of-place copy of q and k, and torch's in-place ``mul_`` of q and k by their weights (read + write in
place, as the norm does) and in-place ``mul_(1.0)`` (the vectorized elementwise kernel, read + write in place).  One JSON line per N, and the copy rate first.

A graph replays the in-place op on the same q and k, so while they fit in L2 (up to N = 4096 here) the
figures are L2-warm (copy_frac above 1); the op's persistent pick (qknorm.launch_key) is for that regime.
(Session 15's logs, before commit af3525a, name the one-CTA-per-tile default "shipped".)
"""

import json
import random
import statistics
import sys

import torch

import cute_kernels  # noqa: F401  (sets the arch)
from cute_kernels.kernels import qknorm as mod
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us

SMS = 132
# The probes' kernels (compile_probe_kernel) and their "per_token" baselines: the per-token kernel without the
# L2 prefetch of later rows that it ships with since session 32 (QKNormTuning.l2_prefetch_bytes), as in the
# probes' recorded runs, so a probe's variant and its baseline differ only in what the probe changes
PROBE_TUNING = mod.QKNormTuning(mod.DEFAULT_TUNING.target_vecs, mod.DEFAULT_TUNING.streaming)


def tunings():
    """Persistent CTA counts: the CTAs one SM holds times 132 SMs (ptxas registers at Q=4096, K=1024,
    sm_90a: 64 per thread for 2 vectors -> 3 CTAs of 320 threads; 128 for 4 -> 3 of 160), and fewer.
    (Session 15's second run also had launch-bound variants, a QKNormTuning field at 5347951: slower;
    session 16's run had the weight loaded after the row sum, late_weights at 1b10cd4: slower.)  Only
    ``per_token`` (the shipped default) has the L2 prefetch of later rows (session 32); the others, like
    ``per_token_noprefetch``, do not."""
    return {"per_token": mod.DEFAULT_TUNING, "per_token_noprefetch": PROBE_TUNING, "v4": mod.QKNormTuning(4, False),
            "v2_persist3": mod.QKNormTuning(2, False, SMS * 3),
            "v2_persist2": mod.QKNormTuning(2, False, SMS * 2),
            "v4_persist3": mod.QKNormTuning(4, False, SMS * 3),
            "bulk_1x16": mod.QKNormTuning(2, False, SMS, 16), "bulk_2x8": mod.QKNormTuning(2, False, SMS * 2, 8),
            "bulk_3x6": mod.QKNormTuning(2, False, SMS * 3, 6), "bulk_4x4": mod.QKNormTuning(2, False, SMS * 4, 4),
            "bulk_2x4": mod.QKNormTuning(2, False, SMS * 2, 4), "bulk_3x5": mod.QKNormTuning(2, False, SMS * 3, 5),
            "bulk_3x4": mod.QKNormTuning(2, False, SMS * 3, 4), "bulk_2x6": mod.QKNormTuning(2, False, SMS * 2, 6)}


def compile_probe_kernel(name: str, make_kernel, dtype, qd: int, kd: int, *key):
    """A probe's kernel variant of the per-token config of (dtype, qd, kd) (:data:`PROBE_TUNING`: without the
    L2 prefetch): ``make_kernel(cute dtype, config)`` builds it; compiled once per ``key`` under ``name`` in the
    compile cache."""
    from cute_kernels.runtime.cache import compile_cached
    from cute_kernels.runtime.fake import cute_dtype

    cfg = mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=PROBE_TUNING)
    return compile_cached(name, (str(dtype), qd, kd, *key),
                          lambda: (make_kernel(cute_dtype(dtype), cfg), mod.fake_launch_args(dtype, qd, kd)))


def bits_equal(fns: dict, q, k, wq, wk) -> dict:
    """Each compiled function once on copies of the same q and k: ``{name: bits equal to the first's}``."""
    outs = {}
    for name, fn in fns.items():
        qc, kc = q.clone(), k.clone()
        fn(qc, kc, wq, wk, 1e-6)
        outs[name] = (qc, kc)
    ref = next(iter(outs.values()))
    return {name: bool(torch.equal(o[0], ref[0]) and torch.equal(o[1], ref[1])) for name, o in outs.items()}


def time_rounds(calls: dict, rounds: int, rng) -> dict:
    """``{name: [us per call in a CUDA graph, one per round]}``, the calls' order shuffled every round."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for name in order:
            times[name].append(round(cuda_time_us(calls[name], graph=True, reps=30), 2))
    return times


def parse_ints(arg: str, count: int | None = None) -> tuple:
    """``--name=1,2,...`` -> positive ints (``count`` of them if given); ``SystemExit`` (status 2) naming
    the argument otherwise."""
    values = arg.split("=", 1)[1].split(",")
    if not all(v.isascii() and v.isdigit() and int(v) > 0 for v in values) or (count and len(values) != count):
        want = f"{count} comma-separated" if count else "comma-separated"
        print(f"{arg!r}: expected {want} positive integers", file=sys.stderr)
        raise SystemExit(2)
    return tuple(int(v) for v in values)


def parse_common(argv: list, doc: str, extra=()) -> tuple:
    """The shared command line of the sweep and the probes: ``-h``/``--help`` (``doc``, exit 0),
    ``--rounds=N``, ``--n=N,...`` and the ``extra`` ``--name=...`` options -> ``(rounds, ns, {name: value})``
    (None where absent); an unknown argument or a bad value exits with status 2."""
    if {"-h", "--help"} & set(argv):
        print(doc)
        raise SystemExit(0)
    rounds, ns, opts = None, None, {name: None for name in extra}
    for a in argv:
        name = a.split("=", 1)[0].lstrip("-")
        if a.startswith("--rounds="):
            rounds = parse_ints(a, 1)[0]
        elif a.startswith("--n="):
            ns = parse_ints(a)
        elif a.startswith("--") and "=" in a and name in opts:
            opts[name] = a.split("=", 1)[1]
        else:
            print(f"unknown argument {a!r}\n{doc}", file=sys.stderr)
            raise SystemExit(2)
    return rounds, ns, opts


def require_cuda() -> None:
    """Exit with status 2 and a message when no CUDA GPU is visible (after the arguments are checked)."""
    if not torch.cuda.is_available():
        print("this script times kernels on a CUDA GPU (sm_90a); none is visible here", file=sys.stderr)
        raise SystemExit(2)


def run_probe(argv: list, doc: str, variants, shapes=((4096, 1024),), ns=(8192, 16384)) -> None:
    """The probes' command line (:func:`parse_common`: ``--rounds=N``, ``--n=...``, ``--help``) and loop:
    for each (Q, K) of ``shapes`` the compiled functions ``variants(dtype, Q, K) -> {name: fn}`` (the first
    is the reference) are checked bitwise against each other and timed in shuffled rounds next to torch's
    copy and in-place scalar ``mul_`` of the same bytes; one JSON line per (shape, N) with the medians and
    every round."""
    rounds, n_arg, _ = parse_common(argv, doc)
    rounds, ns = rounds or 7, n_arg or ns
    require_cuda()
    dtype = torch.bfloat16
    print(json.dumps(dict(copy_gbps=round(copy_bandwidth_gbps(), 1), rounds=rounds)), flush=True)
    rng = random.Random(0)
    for qd, kd in shapes:
        fns = variants(dtype, qd, kd)
        for n in ns:
            q = torch.randn(n, qd, device="cuda", dtype=dtype)
            k = torch.randn(n, kd, device="cuda", dtype=dtype)
            wq = torch.empty(qd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
            wk = torch.empty(kd, device="cuda", dtype=dtype).uniform_(0.5, 1.5)
            print(json.dumps(dict(qk=[qd, kd], n=n, bits_equal=bits_equal(fns, q, k, wq, wk))), flush=True)
            wq.fill_(1)  # the in-place timing runs keep the values finite
            wk.fill_(1)
            q2, k2 = torch.empty_like(q), torch.empty_like(k)
            calls = {name: (lambda fn=fn: fn(q, k, wq, wk, 1e-6)) for name, fn in fns.items()}
            calls["torch_copy"] = lambda: (q2.copy_(q), k2.copy_(k))
            calls["torch_scalar_mul_"] = lambda: (q.mul_(1.0), k.mul_(1.0))
            times = time_rounds(calls, rounds, rng)
            print(json.dumps(dict(qk=[qd, kd], n=n, us={m: statistics.median(v) for m, v in times.items()},
                                  all=times)), flush=True)


def main(argv):
    rounds, ns, opts = parse_common(argv, __doc__, extra=("qk", "only"))
    rounds = rounds or 5
    ns = ns or (256, 512, 1024, 2048, 4096, 5120, 6144, 8192)
    qd, kd = parse_ints("--qk=" + opts["qk"], 2) if opts["qk"] else (4096, 1024)
    dtype = torch.bfloat16
    only = opts["only"].split(",") if opts["only"] else None
    chosen = {name: t for name, t in tunings().items() if name == "per_token" or only is None or name in only}
    if only and set(only) - set(chosen):
        print(f"unknown tunings {sorted(set(only) - set(chosen))} (known: {sorted(tunings())})", file=sys.stderr)
        raise SystemExit(2)
    require_cuda()
    bw = copy_bandwidth_gbps()
    print(json.dumps(dict(copy_gbps=round(bw, 1), rounds=rounds, qk=[qd, kd])), flush=True)
    fns = {name: mod._compile(dtype, qd, kd, t) for name, t in chosen.items()}
    rng = random.Random(0)
    for n in ns:
        q = torch.randn(n, qd, device="cuda", dtype=dtype)
        k = torch.randn(n, kd, device="cuda", dtype=dtype)
        wq = torch.randn(qd, device="cuda", dtype=dtype) * 0 + 1  # the in-place runs keep the values finite
        wk = torch.randn(kd, device="cuda", dtype=dtype) * 0 + 1
        q2, k2 = torch.empty_like(q), torch.empty_like(k)
        wq.uniform_(0.5, 1.5)  # the bitwise check: every tuning on the same inputs, one call each
        wk.uniform_(0.5, 1.5)
        print(json.dumps(dict(n=n, bits_equal=bits_equal(fns, q, k, wq, wk))), flush=True)
        wq.fill_(1)
        wk.fill_(1)
        calls = {name: (lambda fn=fn: fn(q, k, wq, wk, 1e-6)) for name, fn in fns.items()}
        calls["torch_copy"] = lambda: (q2.copy_(q), k2.copy_(k))
        calls["torch_mul_"] = lambda: (q.mul_(wq), k.mul_(wk))
        calls["torch_scalar_mul_"] = lambda: (q.mul_(1.0), k.mul_(1.0))  # in place, no broadcast operand
        times = time_rounds(calls, rounds, rng)
        nbytes = 2 * (q.numel() + k.numel()) * 2
        med = {name: statistics.median(v) for name, v in times.items()}
        print(json.dumps(dict(n=n, us=med, copy_frac={m: round(nbytes / t / 1e3 / bw, 3) for m, t in med.items()},
                              all=times)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
