"""Three consumer warpgroups at D=128 (tile_n=64) vs the shipped two; D=64 stage counts (session 8 probe).

    python3 bench/ranker_fwd_wg3_probe.py   (H200: bench/results/logs/2026-11-30_s8_ranker_fwd_wg3_d128_and_d64_stages.log)
"""
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import time_configs

w3 = dict(consumer_wgs=3, tile_m=192, producer_regs=32, consumer_regs=160)
c128 = {"base": rf.CONFIGS[128],
        "w3_n64_s3_pers": rf.RankerFwdConfig(head_dim=128, tile_n=64, stages=3, persistent=True, **w3),
        "w3_n64_s4": rf.RankerFwdConfig(head_dim=128, tile_n=64, stages=4, **w3),
        "w3_n64_s5": rf.RankerFwdConfig(head_dim=128, tile_n=64, stages=5, **w3)}
s8_d64 = rf.RankerFwdConfig(head_dim=64, tile_m=192, tile_n=112, stages=4, **w3, persistent=True)  # D=64 then
c64 = {"base": s8_d64, "s5": dc.replace(s8_d64, stages=5), "s6": dc.replace(s8_d64, stages=6),
       "n96_s6": dc.replace(s8_d64, tile_n=96, stages=6)}
for cs in (c128, c64):
    for n, c in list(cs.items()):
        try:
            c.validate()
        except ValueError as e:
            print(json.dumps({"cfg": n, "invalid": str(e)[:120]})); del cs[n]
g = torch.Generator(device="cuda").manual_seed(0)
shapes = [(4, 4096, 512, 16, 128, None, c128), (4, 4096, 512, 16, 128, 50.0, c128), (16, 1024, 256, 16, 128, None, c128),
          (8, 2048, 2048, 8, 128, None, c128), (4, 4096, 512, 16, 64, None, c64)]
data = []
for nb, hist, cand, h, d, cap, cfgs in shapes:
    s = hist + cand
    q, k, v = (torch.randn(nb, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    ref = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=cfgs["base"])[0]
    for n, c in cfgs.items():
        o = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=c)[0]
        err = (o.float() - ref.float()).abs().max().item()
        if err > 2e-2:
            print(json.dumps({"cfg": n, "d": d, "mismatch": err}))
    flops = 4 * d * h * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((f"B={nb},h={hist},c={cand},H={h},D={d},cap={cap}", q, k, v, bounds, cap, flops, cfgs))
time_configs(data)
