"""Probe: the per-token Q/K norm past L2 with and without its L2 prefetch of a later CTA's rows
(``QKNormTuning.l2_prefetch_bytes``: at its start, one thread of each part (q, k) of CTA ``b`` issues
``cp.async.bulk.prefetch.L2.global`` for the rows of CTA ``b + distance``; here the distance in CTAs).  At N=16384 (q + k 168 MB, past
the H200's 60 MiB L2) the kernel without it holds about 40 KB of loads in flight per SM (4 CTAs of one
10-KB token) and reached 94% of the copy rate (84.1-84.4 us; torch's in-place ``mul_`` of the same bytes
83.0-83.3).  Same sums, so the same bits (checked).  CUDA graph, shuffled rounds, next to torch's copy and
in-place mul_.

    python3 bench/qknorm_l2_prefetch_probe.py [--rounds=N] [--n=8192,16384] [--distances=264,528,...]

Runs recorded: bench/results/logs/2026-12-01_s32_qknorm_l2_prefetch_probe.log (session 32: best at 264-396
CTAs ahead, 3-5.5 MB of rows, at both widths; shipped as 4 MiB ahead).
"""
import sys

from cute_kernels.kernels import qknorm as mod
from qknorm_sweep import PROBE_TUNING, parse_ints, run_probe

SHAPES = ((4096, 1024), (6144, 1024))


def distances(argv: list) -> tuple:
    for a in argv:
        if a.startswith("--distances="):
            argv.remove(a)
            return parse_ints(a)
    return (264, 396, 528, 660, 792, 1056)


def main(argv: list) -> None:
    dists = distances(argv)

    def variants(dtype, qd, kd):
        tuning = PROBE_TUNING
        fns = {"no_prefetch": mod._compile(dtype, qd, kd, tuning)}
        cfg = mod.QKNormConfig.for_shape(qd, kd, dtype, tuning=tuning)
        tile_bytes = cfg.rows * (qd + kd) * dtype.itemsize
        for d in dists:
            fns[f"prefetch{d}"] = mod._compile(dtype, qd, kd, mod.QKNormTuning(tuning.target_vecs, tuning.streaming,
                                                                               l2_prefetch_bytes=d * tile_bytes))
        return fns

    run_probe(argv, __doc__, variants, shapes=SHAPES, ns=(8192, 16384, 32768))


if __name__ == "__main__":
    main(sys.argv[1:])
