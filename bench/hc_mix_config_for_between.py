"""config_for's wave-model picks between the measured M (1100 ... 3000) against the neighbouring CTA levels;
us per call, CUDA graph, median of 3 interleaved rounds.

    python3 bench/hc_mix_config_for_between.py    (H200: bench/results/logs/2026-11-30_s8_hc_mix_config_for_between.log)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import dataclasses as dc, json, math, statistics, torch
from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.runtime.timing import cuda_time_us

k = 20480
data, res = {}, {}
for m in (1100, 1536, 2200, 2560, 3000):
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16(); w = torch.randn(24, k, device="cuda", generator=g) / math.sqrt(k)
    s = torch.rand(3, device="cuda", generator=g) + 0.5; b = torch.randn(24, device="cuda", generator=g)
    pick = tma.config_for(m)
    cfgs = {"pick": pick}
    for lv in (pick.cta_level - 1, pick.cta_level + 1):
        if 0 <= lv <= len(tma.TREE):
            c = math.prod(tma.TREE[:lv])
            cfgs[f"L{lv}"] = dc.replace(pick, cta_level=lv, overlap=lv <= 2, reduce_rows=8 if c >= 32 else 16)
    data[m] = (x, w, s, b, cfgs)
for r in range(3):
    for m, (x, w, s, b, cfgs) in data.items():
        for n, cfg in cfgs.items():
            res.setdefault((m, n), []).append(cuda_time_us(lambda: tma.hc_mix_sinkhorn_tma(x, w, s, b, config=cfg)))
for m, (x, w, s, b, cfgs) in data.items():
    print(json.dumps({"m": m, "pick_level": cfgs["pick"].cta_level,
                      **{n: round(statistics.median(v), 2) for (mm, n), v in res.items() if mm == m}}), flush=True)
