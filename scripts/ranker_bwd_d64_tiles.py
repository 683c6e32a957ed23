"""Backward at D=64 (the issue's D=64 shape, B=4, 4096 history + 512 candidates, 16 heads; and GQA 16/4):
64- vs 128-row q tiles, deterministic or not, interleaved in one run, CUDA-graph time and useful
TFLOP/s (2.5x the forward's useful FLOPs).  Evidence for ``ranker_bwd.config_for``.

    python3 scripts/ranker_bwd_d64_tiles.py OUT.json        (on the GPU; prints one line per record)
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cute_kernels.cli import run_metadata  # noqa: E402
from cute_kernels.kernels import ranker_bwd as rb  # noqa: E402
from cute_kernels.kernels.ranker_bench import time_us as _time_us  # noqa: E402
from cute_kernels.kernels.ranker_fwd import ranker_attention  # noqa: E402
from cute_kernels.kernels.ranker_mask import admitted_pairs  # noqa: E402


def main(path):
    recs = []
    for nb, hist, cand, hq, hkv in ((4, 4096, 512, 16, 16), (4, 4096, 512, 16, 4)):
        s, d = hist + cand, 64
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, do = (torch.randn(nb, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        k, v = (torch.randn(nb, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        bounds = torch.tensor([[0, hist, hist, s]] * nb, device="cuda", dtype=torch.int32)
        o, lse = ranker_attention(q, k, v, bounds, return_lse=True)
        flops = 10 * d * hq * admitted_pairs(bounds.cpu(), [s] * nb)
        best = {}
        for _ in range(3):  # interleaved rounds, best of
            for tm in (64, 128):
                for det in (False, True):
                    cfg = dataclasses.replace(rb.CONFIGS[64], tile_m=tm, deterministic=det)
                    t, mode = _time_us(lambda cfg=cfg: rb.ranker_attention_backward(q, k, v, o, lse, do, bounds,
                                                                                     config=cfg))
                    key = (tm, det)
                    best[key] = min(best.get(key, (t, mode)), (t, mode))
        for (tm, det), (t, mode) in best.items():
            rec = dict(kernel="ranker_bwd", impl=f"cute_kernels_tile_m{tm}{'_deterministic' if det else ''}",
                       shape=dict(B=nb, hist=hist, cand=cand, Hq=hq, Hkv=hkv, D=d, cap=None), mode=mode,
                       time_us=round(t, 2), tflops=round(flops / t / 1e6, 1), **run_metadata())
            print(json.dumps({k: rec[k] for k in ("impl", "shape", "time_us", "tflops")}), flush=True)
            recs.append(rec)
    Path(path).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="where to write the JSON records (needs a CUDA GPU)")
    main(parser.parse_args().out)
