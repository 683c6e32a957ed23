"""Eager host time per call of the small-shape entry points (GPU): back-to-back calls, wall clock.

    python3 bench/eager_overhead.py [--json PATH]

Prints microseconds per call (best of 3 x 3000 calls, synchronized at the end of each batch) for a
bare ``torch.mul`` (the host's baseline), ``torch.empty_like``, the compiled Q/K norm called directly
(the tvm-ffi floor), its argument check, ``qk_rmsnorm_`` at N = 1 and 64, ``F.rms_norm`` on q and k,
``ranker_attention`` at S = 256 and ``scale``.
"""

import argparse
import json
import time

import torch

import cute_kernels
from cute_kernels.cli import run_metadata
from cute_kernels.kernels import qknorm


def per_call(fn, n: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return round(best, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(2048, device=dev, dtype=bf16)
    res = {"torch.mul": per_call(lambda: torch.mul(x, 2.0)), "torch.empty_like": per_call(lambda: torch.empty_like(x))}
    wq, wk = torch.ones(4096, device=dev, dtype=bf16), torch.ones(1024, device=dev, dtype=bf16)
    for n in (1, 64):
        q, k = torch.randn(n, 4096, device=dev, dtype=bf16), torch.randn(n, 1024, device=dev, dtype=bf16)
        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        if n == 1:
            fn = qknorm._launchers[(bf16, 4096, 1024)]
            res["compiled qknorm, called directly"] = per_call(lambda: fn(q, k, wq, wk, 1e-6))
            res["qknorm args_look_valid"] = per_call(lambda: qknorm.args_look_valid(q, k, wq, wk, 1e-6))
        res[f"qk_rmsnorm_ N={n}"] = per_call(lambda: cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6))
        res[f"F.rms_norm q and k N={n}"] = per_call(lambda: (torch.nn.functional.rms_norm(q, (4096,), wq, 1e-6),
                                                              torch.nn.functional.rms_norm(k, (1024,), wk, 1e-6)))
    qa = torch.randn(1, 256, 4, 128, device=dev, dtype=bf16)
    bounds = torch.tensor([[0, 200, 200, 256]], device=dev, dtype=torch.int32)
    res["ranker_attention S=256 H=4"] = per_call(lambda: cute_kernels.ranker_attention(qa, qa, qa, bounds), 1000)
    res["scale 2048"] = per_call(lambda: cute_kernels.scale(x, 2.0))
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results_us=res, **run_metadata()), f, indent=1)


if __name__ == "__main__":
    main()
