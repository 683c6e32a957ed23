"""Why Hopper kernels swizzle shared memory: bank conflicts of a 128x64 bf16 tile, with and without
the 128-byte swizzle, counted and drawn.  CPU only.

    python layouts/swizzle_banks.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass loads)
from cute_kernels import layouts as L
from cute_kernels.layouts import viz


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "cute_kernels_layouts", "swizzle_banks"),
                   help="folder for the pictures")
    args = p.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):  # (before the work: argparse's clean exit 2)
        p.error(f"--out {args.out} is a file, not a folder")

    sw = L.hopper_smem_layout(128, 64, "bf16")  # what a WGMMA/TMA kernel uses for this tile
    plain = L.row_major(128, 64)
    print(f"swizzled: {sw}   ({sw.swizzle.byte_swizzle_name} swizzle on byte addresses)")
    print(f"plain:    {plain}")
    print()
    cases = [
        ("a warp reads one column of row-major 64x64", L.row_major(64, 64), L.column_read(32, 0)),
        ("8 rows x 16 B, row-major", plain, L.row_vector_read(8, 0, vec=8)),
        ("8 rows x 16 B, 128B swizzle", sw, L.row_vector_read(8, 0, vec=8)),
        ("32 rows x 16 B, row-major", plain, L.row_vector_read(32, 0, vec=8)),
        ("32 rows x 16 B, 128B swizzle", sw, L.row_vector_read(32, 0, vec=8)),
    ]
    for title, lay, pat in cases:
        rep = L.bank_conflicts(lay, pat, elem_bytes=2)
        print(f"{title:<44} {rep.total:>3} wavefronts (ideal {rep.ideal_total})"
              f"  {'conflict-free' if rep.conflict_free else f'{rep.ratio:.0f}x'}")

    files = []
    files += viz.save(viz.draw_banks(plain, 2, rows=16, title="row-major 128x64 bf16: banks"),
                      os.path.join(args.out, "banks_plain"))
    files += viz.save(viz.draw_banks(sw, 2, rows=16, title="128B swizzle 128x64 bf16: banks"),
                      os.path.join(args.out, "banks_swizzled"))
    files += viz.save(viz.draw_offsets(sw, elem_bytes=2, region=(16, 32)), os.path.join(args.out, "offsets_swizzled"))
    files += viz.save(viz.draw_conflicts([plain.named("row-major"), sw.named("128B swizzle")],
                                         L.row_vector_read(8, 0, vec=8), 2), os.path.join(args.out, "conflicts"))
    print(f"\nwrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
