"""Runtime shared by every kernel: target arch, compile cache, fake args, validation, torch ops."""

from .arch import configure, target_arch
from .artifacts import PTX_FEATURES, SASS_FEATURES, CompileRecord, find_features

__all__ = ["configure", "target_arch", "PTX_FEATURES", "SASS_FEATURES", "CompileRecord", "find_features"]
