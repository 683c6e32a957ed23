"""How fast can anything read x once?  hc_mix's floor is reading x [M, K] bf16 once; its issue target at
M = 4096, K = 20480 (47 us) is 85% of the measured copy rate.  This times, in the same process (CUDA graph
of 10 calls, median of 20 samples, interleaved rounds), our op against stock kernels that also read x
exactly once: ``x.sum(-1)`` (a row reduction), ``x @ w`` with a bf16 [K, 32] w (cuBLAS, tensor cores, the
shape of hc_mix's product) and ``torch.linalg.vector_norm(x, dim=-1)``, and reports
each one's read rate (M * K * 2 bytes per call) beside the copy rate (read + write).

    python3 bench/hc_mix_read_floor.py [M ...]     (default M = 4096 16384; K = 20480)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)
import json
import statistics
import sys

import torch

from cute_kernels import hc_mix_sinkhorn
from cute_kernels.runtime.timing import copy_bandwidth_gbps, cuda_time_us


def main(ms):
    k = 20480
    copy = copy_bandwidth_gbps()
    print(json.dumps({"copy_gbps": round(copy, 1), "gpu": torch.cuda.get_device_name()}), flush=True)
    for m in ms:
        g = torch.Generator(device="cuda").manual_seed(m)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        hc_fn = torch.randn(24, k, device="cuda", generator=g) * 1e-3
        scale = torch.ones(3, device="cuda")
        base = torch.zeros(24, device="cuda")
        w = torch.randn(k, 32, device="cuda", dtype=torch.bfloat16, generator=g)
        fns = {"hc_mix_tma": lambda: hc_mix_sinkhorn(x, hc_fn, scale, base),
               "x.sum(-1)": lambda: x.sum(-1),
               "x @ w[K,32] bf16": lambda: x @ w,
               "vector_norm(x, dim=-1)": lambda: torch.linalg.vector_norm(x, dim=-1)}
        times = {name: [] for name in fns}
        for _ in range(3):  # interleaved rounds
            for name, fn in fns.items():
                times[name].append(cuda_time_us(fn, graph=True))
        nbytes = m * k * 2
        for name, ts in times.items():
            t = statistics.median(ts)
            gbps = nbytes / t / 1e3
            print(json.dumps({"M": m, "K": k, "impl": name, "us": round(t, 2), "read_gbps": round(gbps, 1),
                              "of_copy_rate": round(gbps / copy, 3), "rounds_us": [round(v, 2) for v in ts]}),
                  flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4096, 16384])
