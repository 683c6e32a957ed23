"""Tuning aid for hc_mix: us per call (CUDA graph) of every shipped config and the split-K baseline.

Run on the GPU: ``python3 bench/hc_mix_sweep.py [M,M,...]``; prints one JSON line per measurement.
Configs with the same K tree give the same bits (the ``_bits`` fields check it), so ``config_for``
may pick any CTA level per M; another tree is another summation order.
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import json
import math
import sys

import torch

from cute_kernels.kernels import hc_mix as mod
from cute_kernels.kernels import hc_mix_walk as walk
from cute_kernels.kernels import hc_mix_tma as tma
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us


VARIANTS = list(walk.SHIPPED)
TMA_VARIANTS = {f"tma_L{lv}": tma.HcMixTmaConfig(cta_level=lv) for lv in range(len(tma.TREE) + 1)}  # the shipped tree
TMA_VARIANTS.update({  # other trees (other bits): 32 splits of 10 k tiles, paired (overlap)
    "tma_4x8_L1_ov": tma.HcMixTmaConfig(tree=(4, 8), cta_level=1, overlap=True),
    "tma_4x8_L2_ov": tma.HcMixTmaConfig(tree=(4, 8), cta_level=2, overlap=True),
    "tma_L5_t256": tma.HcMixTmaConfig(tile_m=256, stages=4),
})


def _name(c):
    return f"{c.m_tiles}{c.warps_m}s{c.stages}"


def main():
    k = 20480
    ms = ([int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1
          else [1, 16, 128, 256, 512, 1024, 2048, 4096, 16384])
    print(json.dumps(dict(copy_gbps=copy_bandwidth_gbps())), flush=True)
    splitk = mod._splitk_baseline()
    for m in ms:
        x = torch.randn(m, k, device="cuda").bfloat16()
        hc_fn = torch.randn(mod.N_MIX, k, device="cuda") / math.sqrt(k)
        hc_scale = torch.rand(3, device="cuda") + 0.5
        hc_base = torch.randn(mod.N_MIX, device="cuda")
        out = (torch.empty(m, 4, device="cuda"), torch.empty(m, 4, device="cuda"), torch.empty(m, 4, 4, device="cuda"))
        row = dict(m=m)
        for cfg in VARIANTS:
            fn = lambda cfg=cfg: mod._launch(x, hc_fn, hc_scale, hc_base, 20, 1e-6, 1e-6, config=cfg, out=out)
            row[_name(cfg)] = round(cuda_time_us(fn), 2)
        row["op"] = round(cuda_time_us(lambda: mod.hc_mix_sinkhorn(x, hc_fn, hc_scale, hc_base, method="walk")), 2)
        ref_mix = {}  # per K split: the same split gives the same bits
        for name, cfg in TMA_VARIANTS.items():  # the TMA + WGMMA kernel (hc_mix_tma)
            mix = torch.full((m, mod.SP_COLS), float("nan"), device="cuda")  # unwritten rows never match
            try:
                row[name] = round(cuda_time_us(
                    lambda cfg=cfg: tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, config=cfg)), 2)
                tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base, config=cfg, mix=mix)
                ref = ref_mix.setdefault(cfg.tree, mix)
                if ref is not mix:
                    row[name + "_bits"] = "same" if torch.equal(mix, ref) else "DIFFER"
            except Exception as exc:  # noqa: BLE001 (report, keep sweeping)
                row[name] = f"error: {exc!r}"[:120]
        row["tma_auto"] = round(cuda_time_us(lambda: tma.hc_mix_sinkhorn_tma(x, hc_fn, hc_scale, hc_base)), 2)
        if splitk is not None:
            row["splitk"] = round(cuda_time_us(lambda: splitk(x, hc_fn, hc_scale, hc_base)), 2)
            ref = mod.hc_mix_sinkhorn_reference(x, hc_fn, hc_scale, hc_base)
            got = splitk(x, hc_fn, hc_scale, hc_base)
            row["splitk_err"] = max((g.double() - w.double()).abs().max().item() for g, w in zip(got, ref))
        row["floor_us"] = round(m * k * 2 / 4185e3, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
