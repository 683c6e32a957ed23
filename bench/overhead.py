"""Compile time, cached-load time and per-call host overhead (the tiny scale kernel, and the eager entry
points of the other kernels with their raw compiled calls and torch baselines).

    python3 bench/overhead.py [--json PATH]

Compile and cached load are measured here in fresh cache folders (CPU is enough); the per-call
overhead needs a GPU: a 4 KB bf16 tensor through ``cute_kernels.scale`` (eager fast path), through
the registered ``torch.ops.cute_kernels.scale`` custom op, and a bare ``torch.mul``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = """
import time, cute_kernels
from cute_kernels.kernels import scale
from cute_kernels.runtime.cache import compile_record
t = scale.compile_targets()[1]
t0 = time.perf_counter(); t.build(); wall = time.perf_counter() - t0
r = compile_record(t.kernel, t.key)
print(r.compile_s if r.compile_s is not None else -1, r.load_s if r.load_s is not None else -1, wall)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=d)
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout.split()
            compile_s, load_s, wall = map(float, out)
            res[label] = dict(compile_s=compile_s, load_s=load_s, wall_s=wall)
    print(f"compile (cold cache): {res['cold']['compile_s'] * 1e3:.0f} ms; cached load (new process): {res['warm']['load_s'] * 1e3:.2f} ms")
    import torch

    if torch.cuda.is_available():
        import cute_kernels

        from cute_kernels.kernels import scale as scale_mod

        x = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        raw = scale_mod._compile(x.dtype, scale_mod.ScaleConfig())
        q = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
        wq, wk = torch.randn(4096, device="cuda", dtype=torch.bfloat16), torch.randn(1024, device="cuda", dtype=torch.bfloat16)
        qa = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
        bounds = torch.tensor([[0, 96, 96, 128]], device="cuda", dtype=torch.int32)
        xm = torch.randn(1, 20480, device="cuda", dtype=torch.bfloat16)
        fn_, scale_, base_ = torch.randn(24, 20480, device="cuda") * 1e-2, torch.ones(3, device="cuda"), torch.zeros(24, device="cuda")
        from cute_kernels.kernels import qknorm as qknorm_mod

        cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)
        raw_qk = qknorm_mod._launchers[(q.dtype, 4096, 1024)]
        rms = torch.nn.functional.rms_norm
        calls = [("compiled function, raw tvm-ffi call", lambda: raw(x, y, 2.0)),
                 ("compiled qknorm, raw tvm-ffi call (4 tensors)", lambda: raw_qk(q, k, wq, wk, 1e-6)),
                 ("qknorm argument check (fast_path_key)", lambda: qknorm_mod.fast_path_key(q, k, wq, wk, 1e-6)),
                 ("F.rms_norm on q and k N=1", lambda: (rms(q, (4096,), wq, 1e-6), rms(k, (1024,), wk, 1e-6))),
                 ("cute_kernels.scale (eager fast path)", lambda: cute_kernels.scale(x, 2.0)),
                 ("torch.ops.cute_kernels.scale (custom op)", lambda: torch.ops.cute_kernels.scale(x, 2.0)),
                 ("torch.mul", lambda: torch.mul(x, 2.0)),
                 ("qk_rmsnorm_ N=1", lambda: cute_kernels.qk_rmsnorm_(q, k, wq, wk, 1e-6)),
                 ("ranker_attention S=128 D=64", lambda: cute_kernels.ranker_attention(qa, qa, qa, bounds)),
                 ("hc_mix_sinkhorn M=1", lambda: cute_kernels.hc_mix_sinkhorn(xm, fn_, scale_, base_))]
        for name, fn in calls:
            for _ in range(100):
                fn()
            torch.cuda.synchronize()
            n = 500  # under the launch-queue depth, so this stays host time
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            res[name] = dict(host_us_per_call=host)
            print(f"{name:<44} {host:7.2f} us per call (host)")
    if args.json:
        from cute_kernels.cli import run_metadata  # (date, GPU, commit: CUTE_KERNELS_COMMIT or git)

        res["run"] = run_metadata()  # (no host_us_per_call: overhead_ab.py reads the calls only)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
