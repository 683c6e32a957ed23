"""Small hc_mix launches for compute-sanitizer (memcheck / racecheck); not a pytest file.

Usage on the GPU machine: compute-sanitizer --tool racecheck python3 tests/gpu/sanitize_hc_mix.py

Both methods; for "tma" walk CTAs at three levels of the K tree (one per split, per quarter of K,
per row tile, the last with and without the fused epilogue, also with another tree), paired k tiles
(another tree), 256-row tiles, without PDL and L2 hints, grouped TMA issue (``load_group`` 2 in config_for's
picks at M = 4096 and 16384, 3 with a single-tile tail at K = 7232), and
reduction CTAs of 8, 16 and 32 rows, with an uneven k-tile split (K = 7232) and a ragged last row tile.
"""
import torch

import cute_kernels
from cute_kernels.kernels import hc_mix_tma as tma

torch.manual_seed(0)
checks = []
for m, k in ((5, 192), (130, 7232)):
    x = torch.randn(m, k, device="cuda").bfloat16()
    hc_fn = torch.randn(24, k, device="cuda") / k ** 0.5
    hc_scale, hc_base = torch.rand(3, device="cuda") + 0.5, torch.randn(24, device="cuda")
    ref = cute_kernels.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
    outs = [cute_kernels.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method=m) for m in ("walk", "tma")]
    for cfg in (tma.config_for(1), tma.config_for(4096), tma.config_for(16384),
                tma.HcMixTmaConfig(tree=(4, 8), cta_level=2, overlap=True),
                tma.HcMixTmaConfig(tile_m=256, stages=4), tma.HcMixTmaConfig(cta_level=1, l2_hints=False, pdl=False),
                tma.HcMixTmaConfig(reduce_rows=32), tma.HcMixTmaConfig(cta_level=2, reduce_rows=16),
                tma.HcMixTmaConfig(cta_level=0), tma.HcMixTmaConfig(tree=(4, 8), cta_level=0, stages=3, fused_epilogue=True),
                tma.HcMixTmaConfig(cta_level=1, load_group=3)):
        mix = torch.empty(m, 25, device="cuda")
        outs.append(tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, config=cfg, mix=mix))
    for out in outs:
        checks.append(max((g.double() - w.double()).abs().max().item() for g, w in zip(out, ref)))
torch.cuda.synchronize()
print("sanitize run done; max abs error per launch:", ["%.1e" % e for e in checks])
assert max(checks) < 1e-4
