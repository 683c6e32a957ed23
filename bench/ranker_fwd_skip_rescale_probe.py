"""Forward: skip the O rescale when no row max of the warp changed (every factor exactly 1, so the
output is bitwise the same) vs always rescaling (session 9 probe; config field skip_unit_rescale).

    python3 bench/ranker_fwd_skip_rescale_probe.py   (H200: bench/results/logs/2026-11-30_s9_ranker_fwd_skip_rescale.log)
"""
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import ranker_inputs, time_configs

data = []
for case in rf.BENCH_CASES:
    nb, hist, cand, hq, hkv, d, cap = case
    key, q, k, v, bounds, _ = ranker_inputs(case, seed=len(data))
    base = rf.shipped_config(torch.bfloat16, d, "tanh" if cap else "none")
    cfgs = {"base": base, "skip": dc.replace(base, skip_unit_rescale=True)}
    o0, l0 = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=base)
    o1, l1 = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfgs["skip"])
    print(json.dumps({"shape": key, "bitwise_equal_out_lse": [torch.equal(o0, o1), torch.equal(l0, l1)]}), flush=True)
    flops = 4 * d * hq * admitted_pairs(bounds.cpu(), [hist + cand] * nb)
    data.append((key, q, k, v, bounds, cap, flops, cfgs))
time_configs(data)
