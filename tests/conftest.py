import os

# The DSL reads CUTE_DSL_ARCH once, at the first `import cutlass`.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cute_kernels  # noqa: E402,F401
