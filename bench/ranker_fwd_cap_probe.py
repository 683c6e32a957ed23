"""Forward with a logit cap: the row max fixed at 0 (``RankerFwdConfig.fixed_row_max``, shipped on the capped
configs for bfloat16 and caps <= 50) against the online max, on the headline shape (B=4, history 4096 + 512
candidates, 16 heads) with cap 50: tanh at D=128 and D=64, soft_sign at D=128; plus the D=64 tanh config
at tile_n=128 (fits without spills once the max is fixed), at D=128 the two- and three-warpgroup configs
with the fixed max, and, with ``--fa4``, FlashAttention-4 with the
ranker mask_mod and the same tanh cap.  Checks first (largest output / LSE differences from the online
form, which must stay at bfloat16 rounding), then CUDA-graph medians of interleaved, shuffled rounds with an
A/A pair (``probe_timing.time_configs``)::

    python3 bench/ranker_fwd_cap_probe.py [--fa4] [--wide] [--rounds=N] [--seed=N]

``--wide`` adds three-warpgroup D=128 configs with tile_n 80 / 96 / 128 (no overlap), which the register
rule of ``RankerFwdConfig.validate`` refuses but ptxas compiles without spills once the max is fixed.
"""
import dataclasses
import json
import sys

import torch
from probe_timing import add_fa4_peer, probe_options, ranker_inputs, time_configs

from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs

CASES = [  # (B, hist, cand, Hq, Hkv, D, cap), cap method
    ((4, 4096, 512, 16, 16, 128, 50.0), "tanh"),
    ((4, 4096, 512, 16, 16, 64, 50.0), "tanh"),
    ((4, 4096, 512, 16, 16, 128, 50.0), "soft_sign"),
]


def variants(d: int, cap_method: str) -> dict:
    """Named configs for one case, the shipped one first."""
    shipped = rf.shipped_config(torch.bfloat16, d, cap_method)
    out = {"shipped": shipped, "fixed": dataclasses.replace(shipped, fixed_row_max=True),
           "online": dataclasses.replace(shipped, fixed_row_max=False)}
    if d == 64:
        out["fixed_n128"] = dataclasses.replace(shipped, fixed_row_max=True, tile_n=128, stages=4)
    if d == 128:  # two consumer warpgroups (the uncapped config) and three (tanh's), both with the fixed max
        out["fixed_2wg"] = dataclasses.replace(rf.CONFIGS[128], fixed_row_max=True, checked_max=False)
        out["fixed_3wg"] = rf.CAP_CONFIGS[("tanh", 128)]
    if d == 128 and WIDE:  # wider KV blocks on three warpgroups, past the register rule of validate()
        three = rf.CAP_CONFIGS[("tanh", 128)]
        out["fixed_3wg_n80"] = dataclasses.replace(three, tile_n=80, stages=3)
        out["fixed_3wg_n96"] = dataclasses.replace(three, tile_n=96, stages=2)
        out["fixed_3wg_n128_noov"] = dataclasses.replace(three, tile_n=128, stages=2, intra_wg_overlap=False)
    uniq = {}
    for name, cfg in out.items():
        if cfg not in uniq.values():
            uniq[name] = cfg
    return uniq


def main(fa4: bool, timing: dict):
    data = []
    for case, capm in CASES:
        nb, hist, cand, hq, hkv, d, cap = case
        key, q, k, v, bounds, _ = ranker_inputs(case, seed=len(data))
        key = f"{key},{capm}"
        calls = {}
        ref = None
        for name, cfg in variants(d, capm).items():
            call = (lambda cfg=cfg, q=q, k=k, v=v, bounds=bounds, cap=cap, capm=capm:
                    rf._ranker_impl(q, k, v, bounds, None, cap, capm, None, None, config=cfg))
            o, lse = call()
            if ref is None:
                ref = (o, lse)
            fin = torch.isfinite(ref[1])
            print(json.dumps({"shape": key, "config": name, "fields": dataclasses.asdict(cfg),
                              "max_out_diff_vs_shipped": float((o.float() - ref[0].float()).abs().max()),
                              "max_lse_diff_vs_shipped": float((lse[fin] - ref[1][fin]).abs().max())}), flush=True)
            calls[name] = call
        if fa4 and capm == "tanh":
            add_fa4_peer(calls, key, q, k, v, bounds, cap)
        flops = 4 * d * hq * admitted_pairs(bounds.cpu(), [hist + cand] * nb)
        data.append((key, q, k, v, bounds, cap, flops, calls))
    time_configs(data, launch=lambda q, k, v, bounds, cap, call: call(), **timing)


WIDE = False


def _smem_only_validate(cfg) -> None:
    """``--wide``: RankerFwdConfig.validate without its register rule (a rule of thumb measured on the online
    max; the fixed max needs fewer registers): the shared-memory budget still applies."""
    if cfg.smem_bytes() > rf.SMEM_CAPACITY:
        raise ValueError(f"{cfg}: {cfg.smem_bytes()} B of shared memory")


if __name__ == "__main__":
    variants_given, opts = probe_options(sys.argv[1:], flags=("--fa4", "--wide"), doc=__doc__)
    WIDE = opts.pop("wide")
    if WIDE:
        rf.RankerFwdConfig.validate = _smem_only_validate
    if variants_given:
        raise SystemExit("this probe takes no variants (its configs are fixed; see its docstring)")
    fa4 = opts.pop("fa4")
    main(fa4, opts)
