"""Layouts on a CPU: evaluate the kernels' static CuTe layouts, draw them, and analyse them.

* :mod:`.static`: :func:`trace` a DSL builder into :class:`StaticLayout` (numpy evaluation);
* :mod:`.hopper`: :func:`hopper_smem_layout`, the swizzled WGMMA/TMA smem layout of a tile;
* :mod:`.analysis`: bank conflicts of an access pattern, smem budget, registers;
* :mod:`.viz`: matplotlib pictures (offsets, banks, thread-value layouts, conflicts);
* :mod:`.kernel_layouts`: a kernel config's own layouts (ranker forward, ranker backward's mainloop, hc_mix's TMA
  kernel) and the report that ``cute-kernels layouts`` writes.

Nothing here needs a GPU; matplotlib is needed only by :mod:`.viz`.
"""

from .analysis import (SMEM_LIMIT_BYTES, AccessPattern, ConflictReport, SmemBudget, bank_conflicts, bank_table,
                       column_read, pattern_from_tv, registers, request_wavefronts, row_read, row_vector_read)
from .hopper import cutlass_dtype, elem_bytes, hopper_smem_layout, tma_box
from .static import StaticLayout, SwizzleSpec, dsl_evaluate, row_major, trace

__all__ = [
    "SMEM_LIMIT_BYTES", "AccessPattern", "ConflictReport", "SmemBudget", "StaticLayout", "SwizzleSpec",
    "bank_conflicts", "bank_table", "column_read", "cutlass_dtype", "dsl_evaluate", "elem_bytes",
    "hopper_smem_layout", "pattern_from_tv", "registers", "request_wavefronts", "row_major", "row_read",
    "row_vector_read", "tma_box", "trace",
]
