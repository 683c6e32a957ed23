"""The timing loop the ranker_fwd probe scripts share: every config of every case, interleaved over rounds
(the H200 drifts within a run), CUDA-graph medians, one JSON line per case.

    from probe_timing import time_configs   # (bench/ is on sys.path when a probe runs as a script)
"""
import ast
import functools
import json
import statistics
import sys
import time


def gpu_script(doc: str | None) -> None:
    """The first call of a bench script that times on the GPU: ``-h``/``--help`` prints ``doc`` (the script's
    docstring) and exits 0; without a CUDA GPU it exits with status 2 and says so (instead of a traceback
    from inside torch at the first CUDA call)."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(doc or "(no usage text)")
        raise SystemExit(0)
    import torch

    if not torch.cuda.is_available():
        print(f"{sys.argv[0]}: this script times kernels on a CUDA GPU (sm_90a); none is visible here",
              file=sys.stderr)
        raise SystemExit(2)


def parse_variant(arg: str):
    """``NAME=field:value[,field:value...]`` (a config variant given on a probe's command line) ->
    ``(NAME, {field: value})``; values are Python literals (``True``, ``2``)."""
    name, _, spec = arg.partition("=")
    fields = {}
    for item in spec.split(","):
        field, sep, value = item.partition(":")
        try:
            if not (name and field and sep):
                raise ValueError("expected NAME=field:value[,field:value...]")
            fields[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"variant {arg!r}: {exc}") from None
    return name, fields


def probe_options(argv: list[str], flags: tuple[str, ...] = (), doc: str | None = None,
                  jobs: bool = False) -> tuple[list, dict]:
    """A config probe's command line: variants (``NAME=field:value,...``), the boolean ``flags`` given
    (``--fa4``), and the timing options ``--rounds=N`` (default 5), ``--seed=N`` (the shuffle seed;
    default: drawn and printed, so the order can be replayed), ``--reps=N`` and ``--inner=N`` (samples per
    config and round, and calls per sample: default 8 and 5; longer samples steady the board's clock)
    -> ``(variants, options)`` where options holds the flags and ``rounds``/``shuffle_seed``/``reps``/
    ``inner``/``control=True`` for :func:`time_configs`.
    ``jobs=True``: the probe also takes ``--jobs=N`` (a positive integer: parallel precompile), returned
    as ``options["jobs"]`` (None when absent; pop it before passing the options on).
    ``-h``/``--help`` prints ``doc`` (the probe's docstring) and exits with status 0."""
    import random

    if {"-h", "--help"} & set(argv):
        print(doc or "usage: NAME=field:value[,field:value...] ... [--rounds=N] [--seed=N]")
        raise SystemExit(0)

    opts = {f.lstrip("-"): False for f in flags}
    opts.update(rounds=5, shuffle_seed=random.randrange(1 << 16), control=True, reps=8, inner=5)
    counts = ("rounds", "seed", "reps", "inner") + (("jobs",) if jobs else ())
    if jobs:
        opts["jobs"] = None
    variants, names = [], set()
    for a in argv:
        if a in flags:
            opts[a.lstrip("-")] = True
        elif a.startswith("--") and a[2:].partition("=")[0] in counts and "=" in a:
            name, _, value = a[2:].partition("=")
            low = 0 if name == "seed" else 1
            if not (value.isascii() and value.isdigit()) or int(value) < low:
                raise ValueError(f"{a!r}: expected {'a positive' if low else 'a non-negative'} integer")
            opts["shuffle_seed" if name == "seed" else name] = int(value)
        elif a.startswith("--"):
            known = flags + tuple(f"--{c}=N" for c in counts)
            raise ValueError(f"unknown option {a!r} (known: {', '.join(known)})")
        else:
            variants.append(parse_variant(a))
            if variants[-1][0] in names or variants[-1][0] in ("shipped", "shipped_again"):
                raise ValueError(f"variant name {variants[-1][0]!r} is used twice or reserved")
            names.add(variants[-1][0])
    print(json.dumps({k: opts[k] for k in ("rounds", "shuffle_seed", "reps", "inner")}), flush=True)
    return variants, opts


def case_key(case) -> str:
    """The label of a ranker bench case ``(B, hist, cand, Hq, Hkv, D, cap)`` in the probes' logs."""
    nb, hist, cand, hq, hkv, d, cap = case
    return f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d},cap={cap}"


def ranker_inputs(case, seed: int, dout: bool = False, device: str = "cuda"):
    """Random bf16 inputs of one ranker bench case ``(B, hist, cand, Hq, Hkv, D, cap)`` (history first, then
    the candidates, in every batch row): ``(key, q, k, v, bounds, do)``; ``do`` (like q) with ``dout``,
    else None.  The draw order (q, [do,] k, v) is the one the probes' logs were taken with."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("this probe times kernels on a CUDA GPU (sm_90a); none is visible here")
    nb, hist, cand, hq, hkv, d, cap = case
    s = hist + cand
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(nb, s, hq, d, device=device, dtype=torch.bfloat16, generator=g)
    do = torch.randn(nb, s, hq, d, device=device, dtype=torch.bfloat16, generator=g) if dout else None
    k, v = (torch.randn(nb, s, hkv, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device=device, dtype=torch.int32)
    return case_key(case), q, k, v, bounds, do


def variant_configs(base, variants, label: str) -> dict:
    """``{"shipped": base, name: dataclasses.replace(base, **fields), ...}`` for the ``(name, fields)``
    variants that validate and differ from every config before them (an invalid one prints why)."""
    import dataclasses

    cfgs = {"shipped": base}
    for name, fields in variants:
        unknown = set(fields) - {f.name for f in dataclasses.fields(base)}
        if unknown:
            raise ValueError(f"variant {name!r}: {type(base).__name__} has no field {sorted(unknown)}")
        try:  # (a config checks itself when constructed)
            cfg = dataclasses.replace(base, **fields)
        except (TypeError, ValueError) as exc:
            print(json.dumps({"variant": name, "at": label, "invalid": str(exc)}), flush=True)
            continue
        if cfg not in cfgs.values():
            cfgs[name] = cfg
    return cfgs


def add_fa4_peer(calls: dict, key: str, q, k, v, bounds, cap) -> None:
    """``calls["fa4_mask_mod"]`` = FlashAttention-4 with the ranker mask_mod, prepared for these inputs
    (bench/ranker_fwd_peers.py), or a printed line saying why it could not be (no entry then)."""
    from ranker_fwd_peers import fa4_mask_mod

    try:
        calls["fa4_mask_mod"] = fa4_mask_mod(q, k, v, bounds, cap)
    except Exception as exc:  # noqa: BLE001 (a line per failing peer)
        print(json.dumps({"shape": key, "fa4_mask_mod": repr(exc)[:200]}), flush=True)


def _launch(q, k, v, bounds, cap, cfg):
    from cute_kernels.kernels import ranker_fwd as rf

    return rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfg)


def time_configs(cases, rounds: int = 3, reps: int = 8, inner: int = 5, launch=_launch, time_us=None,
                 shuffle_seed: int | None = None, control: bool = False) -> dict:
    """``cases``: ``(key, q, k, v, bounds, cap, flops, {name: RankerFwdConfig})``.  Times ``launch(q, k, v,
    bounds, cap, cfg)`` per config, ``rounds`` interleaved passes over all cases, and prints per case
    ``{"shape": key, name: [median us, useful TFLOP/s], ...}`` (flops: useful FLOPs of one call); returns
    ``{key: {name: median us}}``.  ``time_us(fn, reps=, inner=)`` defaults to CUDA-graph timing after
    ``SETTLE_S`` seconds of calls (:func:`cute_kernels.runtime.timing.cuda_time_us`; the board's sustained clock).

    Noise controls (the H200 gave two builds of identical code 10% apart in one fixed-order run, session
    11): ``shuffle_seed`` shuffles the configs' order within a case in every round (seeded, so a run can
    be replayed); ``control`` times the first config a second time as ``<first>_again`` (an A/A pair:
    a difference between variants smaller than the pair's is noise) and adds ``"spread_pct"`` per name
    (max - min over rounds, in % of the median)."""
    import random

    if time_us is None:
        from cute_kernels.runtime.timing import SETTLE_S, cuda_time_us

        time_us = functools.partial(cuda_time_us, settle_s=SETTLE_S)
    rng = random.Random(shuffle_seed)
    res = {}
    for _ in range(rounds):
        for key, q, k, v, bounds, cap, flops, cfgs in cases:
            items = list(cfgs.items())
            if control:
                items.append((f"{items[0][0]}_again", items[0][1]))
            if shuffle_seed is not None:
                rng.shuffle(items)
            for name, cfg in items:
                res.setdefault(key, {}).setdefault(name, []).append(
                    time_us(lambda: launch(q, k, v, bounds, cap, cfg), reps=reps, inner=inner))
    medians = {}
    for key, *_, flops, cfgs in cases:
        names = list(res[key])
        names.sort(key=lambda n: (n not in cfgs, list(cfgs).index(n) if n in cfgs else 0))
        medians[key] = {name: statistics.median(res[key][name]) for name in names}
        line = {"shape": key, **{name: [round(t, 1), round(flops / t / 1e6)] for name, t in medians[key].items()}}
        if control:
            line["spread_pct"] = {name: round(100 * (max(ts) - min(ts)) / medians[key][name], 1)
                                  for name, ts in res[key].items()}
        print(json.dumps(line), flush=True)
    return medians


def per_call_us(fn, n=2000):
    """Host time of one call (us): ``n`` back-to-back calls, synchronized after."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def interleaved_best_us(calls: dict, rounds: int = 5) -> dict:
    """Best of ``rounds`` rounds per call, the calls interleaved within each round (the host's speed drifts
    between calls of one run: rows timed in one block apart were seen disagreeing by 30%)."""
    for fn in calls.values():  # warm-up
        for _ in range(200):
            fn()
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            best[name] = min(best[name], per_call_us(fn))
    return {name: round(us, 2) for name, us in best.items()}


def report_host_times(calls: dict, width: int = 32) -> dict:
    """:func:`interleaved_best_us` of ``calls``, printed one row per call (name padded to ``width``), then as one
    JSON line; returns the times."""
    res = interleaved_best_us(calls)
    for name, us in res.items():
        print(f"{name:<{width}} {us:7.2f} us", flush=True)
    print(json.dumps(res))
    return res
