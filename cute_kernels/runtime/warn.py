"""Warnings that point at the caller's code.

A warning raised deep inside an op (a caller's config that spills, a ``use_config`` block for another head
dim, an unusable cache folder) should name the line of the caller that made the call, whichever path led
there: the eager fast path, the registered op through torch's dispatcher, a helper such as
``ranker_fwd.config_for_call``.  A fixed ``stacklevel`` fits one of those paths only, so :func:`warn_user`
counts the frames itself: the first frame outside this package and outside torch (what Python 3.12's
``warnings.warn(skip_file_prefixes=...)`` does; this package also runs on 3.10 and 3.11).  Under
:func:`torch.compile` that frame is the generated graph's code, not the caller's.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _skipped_prefixes() -> tuple:
    """This package's folder and torch's (torch's dispatcher and Dynamo frames sit between an op and its caller)."""
    prefixes = [_PACKAGE_DIR]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        prefixes.append(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    return tuple(prefixes)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` call in the function that calls this one name the first
    frame outside this package and torch (1 = that function itself; the outermost frame when every frame is
    inside them)."""
    skip = _skipped_prefixes()
    frame = sys._getframe(1)  # the function that will call warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    return level


def warn_user(message: str, category: type = RuntimeWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the caller's code (:func:`user_stacklevel`)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
