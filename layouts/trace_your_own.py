"""Trace any CuTe-DSL layout on the CPU and analyse it: here, a 128-thread tiled copy reading a
64x64 bf16 tile as 16-byte vectors, over a 128B-swizzled and a plain smem layout.  CPU only.

    python layouts/trace_your_own.py [--out DIR]

Replace ``build()`` with your own layout code: anything that runs inside ``@cute.jit`` works.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass loads)
from cute_kernels import layouts as L
from cute_kernels.layouts import viz


def build():
    """DSL code, run by L.trace inside a jit function: return layouts (a dict of them here)."""
    import cutlass
    import cutlass.cute as cute

    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=128)
    # 128 threads as 16 rows x 8 column-vectors, thread t on row t % 16 (threads run down the rows),
    # each reading 1 x 8 elements (16 B): 8 consecutive threads read the same column chunk of 8 rows
    tiled = cute.make_tiled_copy_tv(atom, cute.make_layout((16, 8)), cute.make_layout((1, 8)))
    return {"tv": tiled.layout_src_tv_tiled, "tile": cute.make_layout(tuple(cute.size(m) for m in tiled.tiler_mn))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "cute_kernels_layouts", "trace_your_own"),
                   help="folder for the pictures")
    args = p.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):  # (before the work: argparse's clean exit 2)
        p.error(f"--out {args.out} is a file, not a folder")

    traced = L.trace(build)
    tv, tile = traced["tv"], traced["tile"].dims
    print(f"TV layout {tv} over a {tile[0]}x{tile[1]} tile")
    pattern = L.pattern_from_tv(tv, tile, vec=8, name="16B reads, threads down the rows", warp=None)
    for lay in (L.hopper_smem_layout(64, 64, "bf16"), L.row_major(64, 64)):
        print(" ", L.bank_conflicts(lay, pattern, elem_bytes=2))
    files = viz.save(viz.draw_tv(tv, tile, title="tiled copy: threads over the 16x64 tile"),
                     os.path.join(args.out, "tv_copy"))
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
