"""Forward: skip the O rescale when no row max of the warp changed (every factor exactly 1, so the
output is bitwise the same) vs always rescaling (session 9 probe; config field skip_unit_rescale).

    python3 bench/ranker_fwd_skip_rescale_probe.py   (H200: bench/results/logs/2026-11-30_s9_ranker_fwd_skip_rescale.log)
"""
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import time_configs

data = []
for nb, hist, cand, hq, hkv, d, cap in rf.BENCH_CASES:
    s = hist + cand
    g = torch.Generator(device="cuda").manual_seed(len(data))
    q = torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    base = rf.shipped_config(torch.bfloat16, d, "tanh" if cap else "none")
    cfgs = {"base": base, "skip": dc.replace(base, skip_unit_rescale=True)}
    o0, l0 = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=base)
    o1, l1 = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfgs["skip"])
    key = f"B={nb},h={hist},c={cand},H={hq}/{hkv},D={d},cap={cap}"
    print(json.dumps({"shape": key, "bitwise_equal_out_lse": [torch.equal(o0, o1), torch.equal(l0, l1)]}), flush=True)
    flops = 4 * d * hq * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((key, q, k, v, bounds, cap, flops, cfgs))
time_configs(data)
