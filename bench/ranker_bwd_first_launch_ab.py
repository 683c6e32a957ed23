"""Host time of an isolated eager backward call before its first launch (the preprocess), with the gradient
buffers allocated after that launch (session 39) against before it (sessions 12-38: dq, dk, dv and the
deterministic mode's counters before the preprocess), interleaved in one process; plus the whole call timed as
the bench's isolated mode (one call on an idle GPU, CUDA events).  The old order is the backward module of
commit 6498967, read from ``--old FILE`` (``git show 6498967:cute_kernels/kernels/ranker_bwd.py > FILE``).

    python3 bench/ranker_bwd_first_launch_ab.py --old FILE   (on the GPU; bench/ on sys.path)
"""
from probe_timing import gpu_script  # noqa: E402

gpu_script(__doc__)

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch
from probe_timing import ranker_inputs

from cute_kernels import ranker_attention
from cute_kernels.kernels import ranker_bwd as new_mod
from cute_kernels.kernels import ranker_bench
from cute_kernels.runtime.timing import cuda_time_us


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("cute_kernels.kernels._ranker_bwd_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


STAMPS: list = []  # perf_counter() at each wrapped preprocess call


def stamp_first_launch(mod):
    """Wrap the module's compiled preprocesses (once) so each call notes in STAMPS when it reached its first
    launch."""
    for key, fn in list(mod._FNS.items()):
        if key[0] == "pre" and not hasattr(fn, "_stamped"):
            def pre(*args, _fn=fn):
                STAMPS.append(time.perf_counter())
                return _fn(*args)
            pre._stamped = True
            mod._FNS[key] = pre


def to_first_launch_us(mod, args, calls: int = 30) -> float:
    stamp_first_launch(mod)
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        STAMPS.clear()
        t0 = time.perf_counter()
        mod.ranker_attention_backward(*args)
        out.append((STAMPS[0] - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--old", required=True, help="the backward module of commit 6498967")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    old_mod = load_old(args.old)
    for case in new_mod.SHORT_CASES:
        key, q, k, v, bounds, do = ranker_inputs(case, seed=0, dout=True)
        o, lse = ranker_attention(q, k, v, bounds, return_lse=True)
        call = (q, k, v, o, lse, do, bounds)
        mods = {"after_pre (s39)": new_mod, "before_pre (s12-38)": old_mod}
        for mod in mods.values():
            for _ in range(3):
                mod.ranker_attention_backward(*call)
        res = {name: {"to_first_launch_us": [], "isolated_us": []} for name in mods}
        for _ in range(args.rounds):
            for name, mod in mods.items():
                res[name]["to_first_launch_us"].append(round(to_first_launch_us(mod, call), 2))
                res[name]["isolated_us"].append(
                    round(cuda_time_us(lambda: mod.ranker_attention_backward(*call), graph=False, inner=1), 1))
        ref = cuda_time_us(ranker_bench._host_yardstick(), graph=False, inner=1)
        print(json.dumps(dict(shape=key, torch_mul_isolated_us=round(ref, 1),
                              **{n: {m: min(v) for m, v in r.items()} | {"runs": r} for n, r in res.items()})),
              flush=True)


if __name__ == "__main__":
    main()
