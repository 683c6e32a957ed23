"""D=64 forward: intra-warpgroup overlap on/off with three consumer warpgroups, stage counts, tile_n
(session 9 probe; the session-9 bench had the shipped D=64 config at 439 and its no-overlap variant at 460).

    python3 bench/ranker_fwd_d64_overlap_probe.py   (H200: bench/results/logs/2026-11-30_s9_ranker_fwd_d64_overlap.log)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import time_configs

# the configs as they were at the time of the probe (session 8's shipped D=64 config and its float16 one)
base = rf.RankerFwdConfig(head_dim=64, tile_m=192, tile_n=112, stages=6, consumer_wgs=3, producer_regs=32,
                          consumer_regs=160, persistent=True)
two_wg = rf.RankerFwdConfig(head_dim=64, tile_n=128, stages=4)
variants = {"base": (base, {}), "s4": (base, dict(stages=4)),
            "noov_s6": (base, dict(intra_wg_overlap=False)),
            "noov_s4": (base, dict(intra_wg_overlap=False, stages=4)),
            "noov_n96_s6": (base, dict(intra_wg_overlap=False, tile_n=96)),
            "noov_n128_s5": (base, dict(intra_wg_overlap=False, tile_n=128, stages=5)),
            "wg2_noov": (two_wg, dict(intra_wg_overlap=False)),
            "wg2_noov_pers": (two_wg, dict(intra_wg_overlap=False, persistent=True))}
cfgs = {}
for n, (b, kw) in variants.items():
    try:  # (a config checks itself when constructed)
        cfgs[n] = dc.replace(b, **kw)
    except ValueError as e:
        print(json.dumps({"cfg": n, "invalid": str(e)[:160]}))
g = torch.Generator(device="cuda").manual_seed(0)
shapes = [(4, 4096, 512, 16, 16, None), (4, 4096, 512, 16, 16, 50.0), (16, 1024, 256, 16, 16, None),
          (4, 4096, 512, 16, 4, None), (8, 2048, 2048, 8, 8, None)]
data = []
for nb, hist, cand, h, hkv, cap in shapes:
    s = hist + cand
    q = torch.randn(nb, s, h, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(nb, s, hkv, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    ref = rf.ranker_attention_reference(q[:1].float(), k[:1].float(), v[:1].float(), bounds[:1], cap=cap)
    for n, c in cfgs.items():
        o = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=c)[0]
        err = (o[:1].float() - ref).abs().max().item()
        if err > 2e-2:
            print(json.dumps({"cfg": n, "mismatch": err}))
    flops = 4 * 64 * h * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((f"B={nb},h={hist},c={cand},H={h}/{hkv},D=64,cap={cap}", q, k, v, bounds, cap, flops, cfgs))
time_configs(data)
