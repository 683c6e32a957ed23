"""Configs without the intra-warpgroup overlap, which frees P's registers (session 9 probe): D=64 tile_n=128
on three warpgroups, float16 on three warpgroups, D=128 on three warpgroups (tile_n=96) and two (tile_n=176).

    python3 bench/ranker_fwd_noov_probe.py   (H200: bench/results/logs/2026-11-30_s9_ranker_fwd_noov.log)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import time_configs

bf16, fp16 = torch.bfloat16, torch.float16
# the configs as they were at the time of the probe: session 8's D=64 config (overlapped, tile_n=112) and
# float16's two-warpgroup config; CONFIGS[64] is now "noov_n128_s4"
s8_d64 = rf.RankerFwdConfig(head_dim=64, tile_m=192, tile_n=112, stages=6, consumer_wgs=3, producer_regs=32,
                            consumer_regs=160, persistent=True)
noov = dc.replace(s8_d64, intra_wg_overlap=False)
d64 = {"base": s8_d64, "noov": noov, "noov_n128_s5": dc.replace(noov, tile_n=128, stages=5),
       "noov_n128_s4": dc.replace(noov, tile_n=128, stages=4)}
d64h = {"fp16_base": rf.RankerFwdConfig(head_dim=64, tile_n=128, stages=4), "fp16_w3_noov": noov, "fp16_w3_noov_n128_s5": d64["noov_n128_s5"]}
w3 = dict(consumer_wgs=3, tile_m=192, producer_regs=32, consumer_regs=160, intra_wg_overlap=False, persistent=True)
d128 = {"base": rf.CONFIGS[128], "tanh_cfg": rf.CAP_CONFIGS[("tanh", 128)],
        "w3_noov_n96_s2": rf.RankerFwdConfig(head_dim=128, tile_n=96, stages=2, **w3),
        "w2_noov_n176_s2": rf.RankerFwdConfig(head_dim=128, tile_n=176, stages=2, intra_wg_overlap=False, persistent=False),
        "w2_noov_n128_pers": dc.replace(rf.CONFIGS[128], intra_wg_overlap=False)}
shapes = [(4, 4096, 512, 16, 16, 64, None, bf16, d64), (4, 4096, 512, 16, 16, 64, 50.0, bf16, d64),
          (16, 1024, 256, 16, 16, 64, None, bf16, d64), (8, 2048, 2048, 8, 8, 64, None, bf16, d64),
          (4, 4096, 512, 16, 16, 64, None, fp16, d64h),
          (4, 4096, 512, 16, 16, 128, None, bf16, d128), (4, 4096, 512, 16, 16, 128, 50.0, bf16, d128),
          (16, 1024, 256, 16, 16, 128, None, bf16, d128)]
g = torch.Generator(device="cuda").manual_seed(0)
data = []
for nb, hist, cand, h, hkv, d, cap, dt, cfgs in shapes:
    s = hist + cand
    q = torch.randn(nb, s, h, d, device="cuda", dtype=dt, generator=g)
    k, v = (torch.randn(nb, s, hkv, d, device="cuda", dtype=dt, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    ref = rf.ranker_attention_reference(q[:1].float(), k[:1].float(), v[:1].float(), bounds[:1], cap=cap)
    for n, c in list(cfgs.items()):
        try:
            c.validate()
            o = rf._ranker_impl(q, k, v, bounds, None, cap, "tanh", None, None, config=c)[0]
        except Exception as e:
            print(json.dumps({"cfg": n, "error": repr(e)[:160]})); del cfgs[n]; continue
        err = (o[:1].float() - ref).abs().max().item()
        if err > 2e-2:
            print(json.dumps({"cfg": n, "mismatch": err}))
    flops = 4 * d * h * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((f"B={nb},h={hist},c={cand},H={h}/{hkv},D={d},cap={cap},{str(dt)[6:]}", q, k, v, bounds, cap, flops, cfgs))
time_configs(data)
