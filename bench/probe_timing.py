"""The timing loop the ranker_fwd probe scripts share: every config of every case, interleaved over rounds
(the H200 drifts within a run), CUDA-graph medians, one JSON line per case.

    from probe_timing import time_configs   # (bench/ is on sys.path when a probe runs as a script)
"""
import ast
import json
import statistics


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


def ranker_inputs(case, seed: int, dout: bool = False, device: str = "cuda"):
    """Random bf16 inputs of one ranker bench case ``(B, hist, cand, Hq, Hkv, D, cap)`` (history first, then
    the candidates, in every batch row): ``(key, q, k, v, bounds, do)``; ``do`` (like q) with ``dout``,
    else None.  The draw order (q, [do,] k, v) is the one the probes' logs were taken with."""
    import torch

    nb, hist, cand, hq, hkv, d, cap = case
    s = hist + cand
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(nb, s, hq, d, device=device, dtype=torch.bfloat16, generator=g)
    do = torch.randn(nb, s, hq, d, device=device, dtype=torch.bfloat16, generator=g) if dout else None
    k, v = (torch.randn(nb, s, hkv, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device=device, dtype=torch.int32)
    return f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d},cap={cap}", q, k, v, bounds, do


def variant_configs(base, variants, label: str) -> dict:
    """``{"shipped": base, name: dataclasses.replace(base, **fields), ...}`` for the ``(name, fields)``
    variants that validate and differ from every config before them (an invalid one prints why)."""
    import dataclasses

    cfgs = {"shipped": base}
    for name, fields in variants:
        unknown = set(fields) - {f.name for f in dataclasses.fields(base)}
        if unknown:
            raise ValueError(f"variant {name!r}: {type(base).__name__} has no field {sorted(unknown)}")
        cfg = dataclasses.replace(base, **fields)
        try:
            cfg.validate()
        except ValueError as exc:
            print(json.dumps({"variant": name, "at": label, "invalid": str(exc)}), flush=True)
            continue
        if cfg not in cfgs.values():
            cfgs[name] = cfg
    return cfgs


def _launch(q, k, v, bounds, cap, cfg):
    from cute_kernels.kernels import ranker_fwd as rf

    return rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfg)


def time_configs(cases, rounds: int = 3, reps: int = 8, inner: int = 5, launch=_launch, time_us=None) -> dict:
    """``cases``: ``(key, q, k, v, bounds, cap, flops, {name: RankerFwdConfig})``.  Times ``launch(q, k, v,
    bounds, cap, cfg)`` per config, ``rounds`` interleaved passes over all cases, and prints per case
    ``{"shape": key, name: [median us, useful TFLOP/s], ...}`` (flops: useful FLOPs of one call); returns
    ``{key: {name: median us}}``.  ``time_us(fn, reps=, inner=)`` defaults to CUDA-graph timing."""
    if time_us is None:
        from cute_kernels.runtime.timing import cuda_time_us as time_us
    res = {}
    for _ in range(rounds):
        for key, q, k, v, bounds, cap, flops, cfgs in cases:
            for name, cfg in cfgs.items():
                res.setdefault(key, {}).setdefault(name, []).append(
                    time_us(lambda: launch(q, k, v, bounds, cap, cfg), reps=reps, inner=inner))
    medians = {}
    for key, *_, flops, cfgs in cases:
        medians[key] = {name: statistics.median(res[key][name]) for name in cfgs}
        print(json.dumps({"shape": key, **{name: [round(t, 1), round(flops / t / 1e6)]
                                           for name, t in medians[key].items()}}), flush=True)
    return medians
