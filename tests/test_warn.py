"""runtime.warn: a warning raised inside the package names the caller's line, whatever path led to it."""
import warnings

import pytest

from cute_kernels.runtime import cache, warn


def test_warn_user_names_the_first_frame_outside_the_package(monkeypatch):
    """Called through package frames (here cache.env_flag's unknown-value warning, two frames deep) or directly,
    the warning's file is this test's, not the package's."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE", "maybe")
    cache._warn_unknown_flag.cache_clear()
    with pytest.warns(UserWarning, match="taken as on") as rec:
        assert cache.disk_cache_enabled()
    assert [w.filename for w in rec] == [__file__]
    with pytest.warns(RuntimeWarning, match="direct") as rec:
        warn.warn_user("direct")
    assert [w.filename for w in rec] == [__file__]


def test_user_stacklevel_counts_package_frames(monkeypatch):
    """Every frame inside a skipped folder is counted: here this file's own folder is skipped as well, so the
    warning lands on the outermost frame outside it (pytest's), never on a frame of this file."""
    import os

    skipped = warn._skipped_prefixes() + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
    monkeypatch.setattr(warn, "_skipped_prefixes", lambda: skipped)

    def inner():
        warn.warn_user("deep")

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        inner()
    assert len(rec) == 1 and rec[0].filename != __file__ and "pytest" in rec[0].filename.replace(os.sep, "/")
