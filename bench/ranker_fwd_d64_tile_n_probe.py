"""D=64 forward without the intra-warpgroup overlap: tile_n 128 / 144 / 160 and stage counts on three
consumer warpgroups (session 9 probe; all spill-free in bf16 without a cap).

    python3 bench/ranker_fwd_d64_tile_n_probe.py   (H200: bench/results/logs/2026-11-30_s9_ranker_fwd_d64_tile_n.log)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import dataclasses as dc, json, torch
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.kernels.ranker_mask import admitted_pairs
from probe_timing import time_configs

n128 = rf.RankerFwdConfig(head_dim=64, tile_m=192, tile_n=128, stages=4, consumer_wgs=3, producer_regs=32,
                          consumer_regs=160, persistent=True, intra_wg_overlap=False)  # shipped in session 9
cfgs = {"n128_s4": n128, "n128_s3": dc.replace(n128, stages=3), "n128_s2": dc.replace(n128, stages=2),
        "n144_s4": dc.replace(n128, tile_n=144), "n160_s4": dc.replace(n128, tile_n=160),
        "n160_s3": dc.replace(n128, tile_n=160, stages=3), "n128_s4_1tile": dc.replace(n128, persistent=False)}
g = torch.Generator(device="cuda").manual_seed(0)
shapes = [(4, 4096, 512, 16, 16), (16, 1024, 256, 16, 16), (4, 4096, 512, 16, 4), (8, 2048, 2048, 8, 8),
          (1, 16384, 1024, 16, 16)]
data = []
for nb, hist, cand, h, hkv in shapes:
    s = hist + cand
    q = torch.randn(nb, s, h, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(nb, s, hkv, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
    ref = rf._ranker_impl(q, k, v, bounds, None, None, "tanh", None, None, config=n128)[0]
    for n, c in cfgs.items():
        o = rf._ranker_impl(q, k, v, bounds, None, None, "tanh", None, None, config=c)[0]
        err = (o.float() - ref.float()).abs().max().item()
        if err > 2e-2:
            print(json.dumps({"cfg": n, "mismatch": err}))
    flops = 4 * 64 * h * admitted_pairs(bounds.cpu(), [s] * nb)
    data.append((f"B={nb},h={hist},c={cand},H={h}/{hkv},D=64", q, k, v, bounds, None, flops, cfgs))
time_configs(data)
