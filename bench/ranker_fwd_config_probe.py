"""Forward config variants vs the shipped config (:func:`ranker_fwd.shipped_config`) on the bench shapes:
checks (output and LSE bitwise equal to the shipped config's, for variants that must not change the
math, and their largest differences from it), then CUDA-graph medians of interleaved rounds
(``probe_timing.time_configs``); ``--fa4`` adds
FlashAttention-4 with the ranker mask_mod (bench/ranker_fwd_peers.py) to the same rounds.

Each argument is a variant ``NAME=field:value[,field:value...]`` of RankerFwdConfig fields:

    python3 bench/ranker_fwd_config_probe.py --fa4 old=self_kv_tma:False skip=skip_unit_rescale:True

Timing (``probe_timing.probe_options``): ``--rounds=N`` (default 5), the configs' order shuffled in every
round (``--seed=N`` replays an order), ``--reps=N --inner=N`` (samples per round and calls per sample),
and the shipped config timed twice (``shipped_again``: the A/A pair that says how large a difference is
noise) with each config's spread over rounds.  ``--changed``: only the shapes where some variant differs
from the shipped config (e.g. a field the shipped config of the other shapes already has).  ``--short``:
instead of the bench shapes, the short uncapped D=128 ones of ``SHORT_CASES`` (3 to 14 KV blocks of 128 keys
per sequence).  ``--d256``: the D=256 cases of ``D256_CASES`` (the headline's sequences, 8 heads, with and without
the tanh cap) against ``CONFIGS[256]`` / the D=256 shipped config of the cap.

The configs are passed in as given (``_ranker_impl(config=...)``; ``online=checked_max:False`` times the
online max where the shipped config has the checked fixed max).

Runs recorded: bench/results/logs/2026-11-30_s10_ranker_fwd_prefetch_self_kv.log,
bench/results/logs/2026-12-01_s25_ranker_fwd_self_kv_tma_probe.log.
"""
import json
import sys

import torch
from probe_timing import add_fa4_peer, case_key, probe_options, ranker_inputs, time_configs, variant_configs

from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs


def launch(q, k, v, bounds, cap, cfg):
    if callable(cfg):  # a peer's prepared call
        return cfg()
    return rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfg)


SHORT_CASES = [  # B, hist, cand, Hq, Hkv, D, cap: sequences of 3, 5, 10 and 14 blocks of 128 keys
    (64, 256, 64, 16, 16, 128, None),
    (32, 512, 128, 16, 16, 128, None),
    (16, 1024, 256, 16, 16, 128, None),
    (12, 1536, 256, 16, 16, 128, None),
]


D256_CASES = [  # B, hist, cand, Hq, Hkv, D, cap: the headline's sequences at D=256 (8 heads: the same bytes of q)
    (4, 4096, 512, 8, 8, 256, None),
    (4, 4096, 512, 8, 8, 256, 50.0),
]


def main(variants, fa4: bool, timing: dict, changed: bool = False, short: bool = False, d256: bool = False):
    data = []
    for case in SHORT_CASES if short else D256_CASES if d256 else rf.BENCH_CASES:
        nb, hist, cand, hq, hkv, d, cap = case
        # the variants first: a misspelled field fails before any input is built
        base = rf.shipped_config(torch.bfloat16, d, "tanh" if cap else "none")
        cfgs = variant_configs(base, variants, case_key(case))
        if changed and len(cfgs) == 1:
            continue
        key, q, k, v, bounds, _ = ranker_inputs(case, seed=len(data))
        o0, l0 = launch(q, k, v, bounds, cap, base)
        checks = {}
        for name, cfg in cfgs.items():
            o1, l1 = launch(q, k, v, bounds, cap, cfg)
            fin = torch.isfinite(l0)
            checks[name] = [torch.equal(o0, o1), torch.equal(l0, l1), float((o1.float() - o0.float()).abs().max()),
                            float((l1[fin] - l0[fin]).abs().max()) if fin.any() else 0.0]
        print(json.dumps({"shape": key, "bitwise_equal_out_lse_and_max_diffs": checks}), flush=True)
        if fa4:
            add_fa4_peer(cfgs, key, q, k, v, bounds, cap)
        flops = 4 * d * hq * admitted_pairs(bounds.cpu(), [hist + cand] * nb)
        data.append((key, q, k, v, bounds, cap, flops, cfgs))
    time_configs(data, launch=launch, **timing)


if __name__ == "__main__":
    variants, opts = probe_options(sys.argv[1:], flags=("--fa4", "--changed", "--short", "--d256"), doc=__doc__)
    fa4, changed, short, d256 = opts.pop("fa4"), opts.pop("changed"), opts.pop("short"), opts.pop("d256")
    if short and d256:
        raise SystemExit("--short and --d256 pick different case lists: give one")
    main(variants, fa4, opts, changed, short, d256)
