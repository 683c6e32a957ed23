"""Compile cache: in memory, and on disk as exported objects that later processes load.

A kernel is compiled once per *key* (its frozen config, dtypes and static sizes, plus the target
arch and the DSL's own compile settings: line info, assertions, optimization level, ...) with
``cute.compile(..., options="--enable-tvm-ffi")``, exported with ``export_to_c`` and loaded back with
``cute.runtime.load_module``.  Disk entries live under

    $CUTE_KERNELS_CACHE_DIR (default $XDG_CACHE_HOME/cute_kernels, else ~/.cache/cute_kernels)
        / <fingerprint> / <kernel> / <sha>.o

where the fingerprint hashes our own sources, the DSL and tvm-ffi versions and the Python
version, so editing any kernel (or upgrading the DSL) starts a fresh cache.  A per-entry file lock
(``filelock``) makes concurrent processes compile a key once and the others load it.  Beside each
object: ``.ptx``, ``.cubin``, ``.json`` (compile time, registers) and ``.sass`` (disassembled from the
cubin when first read, where nvdisasm is available).  A folder that cannot be written (or an entry lock
that cannot be taken) warns once and caches in memory only; a complete entry there is still loaded.

``CUTE_KERNELS_CACHE=0`` disables the disk cache (memory only).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Hashable, NamedTuple

from filelock import FileLock, Timeout

from .arch import check_target_arch, dsl_compile_settings, target_arch
from .artifacts import CompileRecord, KernelResources, cubin_resources, nvdisasm_path
from .warn import warn_user

EXPORT_NAME = "func"
_PKG_ROOT = Path(__file__).resolve().parents[1]

_memory: dict[tuple, Any] = {}
_records: dict[tuple, CompileRecord] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    """Root of the on-disk cache (``CUTE_KERNELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/cute_kernels``, else
    ``~/.cache/cute_kernels``), as an absolute path.  A value of blanks counts as unset, and so does a relative
    ``XDG_CACHE_HOME`` (the XDG spec says to ignore one)."""
    root, xdg = os.environ.get("CUTE_KERNELS_CACHE_DIR", ""), os.environ.get("XDG_CACHE_HOME", "")
    if not root.strip():
        root = os.path.join(xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache"), "cute_kernels")
    return _absolute(root)


@functools.lru_cache(maxsize=None)
def _absolute(root: str) -> Path:
    """``root`` as an absolute path, a relative one taken from the working folder of its first use (a process that
    changes folders keeps one cache and one tuned.json).  (os.path.expanduser never raises; Path.expanduser does
    without HOME or a passwd entry.)"""
    return Path(os.path.expanduser(root)).absolute()


_OFF, _ON = ("0", "false", "no", "off", ""), ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """An on/off environment switch, on when unset: 0/false/no/off (any case) or empty is off,
    1/true/yes/on is on; any other value is on with a warning naming the accepted ones."""
    value = os.environ.get(name)
    if value is None:
        return True
    v = value.strip().lower()
    if v not in _OFF + _ON:
        _warn_unknown_flag(name, value)
    return v not in _OFF


@functools.lru_cache(maxsize=None)
def _warn_unknown_flag(name: str, value: str) -> None:
    """Once per (variable, value) and process (``info`` reads a flag in several places)."""
    warn_user(f"{name}={value!r} is not one of 0/false/no/off/(empty) or 1/true/yes/on: taken as on", UserWarning)


def disk_cache_enabled() -> bool:
    """``CUTE_KERNELS_CACHE`` (:func:`env_flag`): 0/false/no/off (any case) or empty turns the disk cache off."""
    return env_flag("CUTE_KERNELS_CACHE")


def disk_cache_problem(probe: bool = True) -> str | None:
    """Why the on-disk cache cannot be used (its folder cannot be created or written), or None.
    ``probe``: create the folder and a temporary file in it (what ``compile`` is about to do anyway);
    ``False``: leave nothing behind (for reports): create and remove a temporary folder in the folder, or
    in its nearest existing parent.  (Asking ``os.access`` is not enough: as root it says yes to folders
    such as ``/proc`` where nothing can be created.)"""
    folder = cache_dir()
    if not probe:
        existing = folder
        while not (existing.exists() or existing.is_symlink()) and existing != existing.parent:
            existing = existing.parent
        if existing.is_symlink() and not existing.exists() or not existing.is_dir():  # (a dangling link too)
            return f"{folder} is not writable ({existing} is not a folder)"
        try:
            os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".probe"))
        except OSError as exc:
            return f"{folder} is not writable (cannot create a folder in {existing}: {exc.strerror or exc})"
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe"):
            pass
    except (FileExistsError, NotADirectoryError):  # the folder, or a parent of it, is a file
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        return f"{folder} is not writable ({blocker} is not a folder)"
    except OSError as exc:
        return f"{folder} is not writable ({exc.strerror or exc})"
    return None


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Hash of the kernel-facing sources (``runtime/``, ``kernels/``) + DSL/tvm-ffi/Python versions.

    The CLI, registry and docs are left out so that editing them keeps the cache warm.
    """
    import cutlass
    import tvm_ffi

    h = hashlib.sha256()
    h.update(f"py{sys.version_info[0]}.{sys.version_info[1]}".encode())
    h.update(f"cutlass={cutlass.__version__};tvm_ffi={tvm_ffi.__version__}".encode())
    sources = sorted(p for d in ("runtime", "kernels") for p in (_PKG_ROOT / d).rglob("*.py"))
    for src in sources:
        h.update(src.relative_to(_PKG_ROOT).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def _key_sha(kernel: str, key: Hashable, arch: str) -> str:
    """An entry's file name: the kernel, its key, the target arch and the DSL's own compile settings
    (:func:`.arch.dsl_compile_settings`: line info, assertions, optimization level, ...)."""
    return hashlib.sha256(repr((kernel, key, arch, dsl_compile_settings())).encode()).hexdigest()[:24]


def _compile(build: Callable[[], tuple], keep_dir: str):
    import cutlass.cute as cute

    fn, args = build()
    # (no --keep-sass: the SASS comes from the kept cubin when first read, CompileRecord.sass)
    opts = f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir {keep_dir}"
    compiled = cute.compile(fn, *args, options=opts)
    if compiled is None:  # the DSL only traced (CUTE_DSL_DRYRUN): nothing to launch or cache
        dry = os.environ.get("CUTE_DSL_DRYRUN")
        raise RuntimeError("the CuTe DSL returned no compiled kernel"
                           + (f" (CUTE_DSL_DRYRUN={dry} makes it trace only: unset it to compile)" if dry else ""))
    return compiled


def nvdisasm_available() -> bool:
    """SASS needs an nvdisasm the DSL accepts (pip ``nvidia-cuda-nvdisasm`` >= 13.4, or a toolkit)."""
    return nvdisasm_path() is not None


def _record_from_compiled(kernel: str, sha: str, arch: str, compiled, seconds: float) -> CompileRecord:
    arts = compiled.artifacts
    cubin = arts.CUBIN if arts is not None else None
    if isinstance(cubin, str):
        cubin = cubin.encode("latin1")
    return CompileRecord(
        kernel=kernel,
        key=sha,
        arch=arch,
        compile_s=seconds,
        ptx=arts.PTX if arts is not None else None,
        resources=cubin_resources(cubin),
        _cubin=cubin,
    )


def _write_record(base: Path, rec: CompileRecord) -> None:
    base.with_suffix(".sass").unlink(missing_ok=True)  # (an earlier compile's; this one's is written when first read)
    if rec.ptx:
        base.with_suffix(".ptx").write_text(rec.ptx)
    if isinstance(rec._cubin, bytes):  # (the SASS is written beside it when first read)
        base.with_suffix(".cubin").write_bytes(rec._cubin)
        rec._cubin = str(base.with_suffix(".cubin"))  # (not kept in memory for the process's lifetime)
    rec._sass_file = str(base.with_suffix(".sass"))
    base.with_suffix(".json").write_text(json.dumps(rec.metadata(), indent=1))


def _read_record(base: Path, load_s: float) -> CompileRecord:
    meta = json.loads(base.with_suffix(".json").read_text())
    meta["resources"] = [KernelResources(**r) for r in meta.get("resources", [])]
    rec = CompileRecord(**meta)
    rec.compile_s = None
    rec.load_s = load_s
    rec._sass_file = str(base.with_suffix(".sass"))
    for suffix, attr in ((".ptx", "ptx"), (".sass", "sass")):
        f = base.with_suffix(suffix)
        try:  # (an empty or unreadable file is missing: the SASS is disassembled again from the cubin)
            if _nonempty(f):
                setattr(rec, attr, f.read_text())
        except OSError:  # (another user's file this one may not read)
            pass
    cubin = base.with_suffix(".cubin")
    if rec._sass is None and _readable(cubin):
        rec._cubin = str(cubin)  # (read when the SASS is)
    return rec


def compile_cached(kernel: str, key: Hashable, build: Callable[[], tuple]) -> Callable:
    """Compiled function for ``(kernel, key)`` on the current target arch.

    ``build()`` returns ``(jit_function_or_callable_object, fake_args)``; it runs only on a miss.
    ``key`` must capture everything that changes the generated code (config, dtypes, static
    sizes).  The result is called with torch tensors and Python scalars, on torch's current
    stream (tvm-ffi environment stream).
    """
    arch = target_arch()
    mkey = (kernel, key, arch)
    hit = _memory.get(mkey)
    if hit is not None:
        return hit
    with _lock:
        hit = _memory.get(mkey)
        if hit is not None:
            return hit
        check_target_arch()
        fn, rec = _compile_or_load(kernel, key, arch, build)
        _records[mkey] = rec  # (first: a function the fast path above finds has its record, compile_record)
        _memory[mkey] = fn
        return fn


def _compile_or_load(kernel: str, key: Hashable, arch: str, build: Callable[[], tuple]):
    sha = _key_sha(kernel, key, arch)
    if not disk_cache_enabled():
        return _compile_in_memory(kernel, sha, arch, build)
    folder = cache_dir() / source_fingerprint() / kernel
    base = folder / sha
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(base.with_suffix(".lock")), timeout=600)
        lock.acquire()
    except Timeout:
        raise
    except OSError as exc:  # read-only cache, a file in the way, ...: keep working, in memory only (a complete
        # entry is loaded without the lock: in a read-only cache nobody can be writing it; in a shared one whose lock
        # another user owns, a half-written entry fails to load and this process compiles in memory instead)
        _warn_no_disk_cache(str(folder), f"{type(exc).__name__}: {exc.strerror or exc}")
        return _load_entry(base) or _compile_in_memory(kernel, sha, arch, build)
    try:
        try:  # (loads too: prune-cache keeps the folders whose entries were locked in the last hour)
            os.utime(base.with_suffix(".lock"))
        except OSError:
            pass
        loaded = _load_entry(base)
        if loaded is not None:
            return loaded
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            compiled = _compile(build, tmp)
            seconds = time.perf_counter() - t0
        rec = _record_from_compiled(kernel, sha, arch, compiled, seconds)
        if not rec.ptx:  # (every compile keeps it, and an entry without it is incomplete: it would recompile)
            warn_user(f"cute_kernels: the CuTe DSL kept no PTX for {kernel} (compiled with --keep-ptx): kept in "
                      "memory only, not in the compile cache")
            return compiled, rec
        partial = base.with_suffix(".o.partial")
        try:
            compiled.export_to_c(str(partial), function_name=EXPORT_NAME)
            _write_record(base, rec)
            os.replace(partial, obj_path(base))  # atomic: readers never see half an object
        except OSError as exc:  # files of the entry this user may not replace or remove (another user's, in a
            # shared folder with the sticky bit, ...): the compiled function is kept in memory only
            _warn_no_disk_cache(str(folder), f"{type(exc).__name__}: {exc.strerror or exc}")
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
        return compiled, rec
    finally:
        lock.release()


def obj_path(base: Path) -> Path:
    """The exported object of the entry ``base`` (the cache folder / sha)."""
    return base.with_suffix(".o")


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _readable(path: Path) -> bool:
    """A file that is not empty and that this process may read (another user's ``0o600`` file is missing)."""
    return _nonempty(path) and os.access(path, os.R_OK)


def _entry_complete(base: Path) -> bool:
    """Whether the entry ``base`` has every part a load needs (object, record, PTX: every compile keeps it, and the
    PTX feature checks read it; and readable SASS or cubin where nvdisasm is there to need them)."""
    return (_nonempty(obj_path(base)) and base.with_suffix(".json").exists() and _readable(base.with_suffix(".ptx"))
            and (_readable(base.with_suffix(".sass")) or _readable(base.with_suffix(".cubin"))
                 or not nvdisasm_available()))


def entry_on_disk(kernel: str, key: Hashable) -> bool:
    """Whether the disk cache holds a complete entry for ``(kernel, key)`` on the current target arch, sources
    and DSL settings (what ``cute-kernels compile`` checks in a cache it cannot write); nothing is compiled."""
    arch = target_arch()
    return _entry_complete(cache_dir() / source_fingerprint() / kernel / _key_sha(kernel, key, arch))


def load_from_disk(kernel: str, key: Hashable) -> Callable | None:
    """The function of ``(kernel, key)`` on the current target arch loaded from its complete disk entry (kept in
    memory, its record for :func:`compile_record`), or None where there is none or it does not load; nothing is
    compiled, written or removed (what ``cute-kernels compile`` checks in a cache it cannot write)."""
    arch = target_arch()
    check_target_arch()
    if not disk_cache_enabled():
        return None
    base = cache_dir() / source_fingerprint() / kernel / _key_sha(kernel, key, arch)
    loaded = _load_entry(base, remove_broken=False)
    if loaded is None:
        return None
    mkey = (kernel, key, arch)
    with _lock:
        _records[mkey], _memory[mkey] = loaded[1], loaded[0]  # (the record first, as compile_cached)
    return loaded[0]


def _load_entry(base: Path, remove_broken: bool = True):
    """``(function, record)`` of a complete disk entry, or None: missing parts, or a load that fails (a
    truncated or stale object is a miss, not an error: with ``remove_broken`` the object is removed where it can
    be, and recompiled).  An entry of an older cache without SASS nor cubin counts as missing once nvdisasm is
    there."""
    import cutlass.cute as cute

    obj = obj_path(base)
    if not _entry_complete(base):
        return None
    try:
        t0 = time.perf_counter()
        fn = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)[EXPORT_NAME]
        return fn, _read_record(base, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001
        print(f"cute_kernels cache: reloading the entry {base} (.o, .json) failed ({exc})"
              + ("; recompiling" if remove_broken else ""), file=sys.stderr)
        if not remove_broken:
            return None
        try:
            obj.unlink(missing_ok=True)
        except OSError:
            pass
        return None


def _compile_in_memory(kernel: str, sha: str, arch: str, build: Callable[[], tuple]):
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        compiled = _compile(build, tmp)
        return compiled, _record_from_compiled(kernel, sha, arch, compiled, time.perf_counter() - t0)


@functools.lru_cache(maxsize=None)
def _warn_no_disk_cache(folder: str, reason: str) -> None:
    """Once per (folder, reason) and process."""
    warn_user(f"cute_kernels: compile cache folder {folder} is unusable ({reason}); caching in memory only. "
              "Set CUTE_KERNELS_CACHE_DIR to a writable folder.")


PRUNE_IDLE_S = 3600  # prune keeps the folders used in the last hour (the cache may be shared by other checkouts)
_ENTRY_SUFFIXES = (".o", ".ptx", ".cubin", ".json", ".sass", ".lock", ".partial")  # the files of a cache entry


def _is_fingerprint_folder(path: Path) -> bool:
    """A folder named like :func:`source_fingerprint` (16 hex digits)."""
    return path.is_dir() and not path.is_symlink() and len(path.name) == 16 and all(
        c in "0123456789abcdef" for c in path.name)


def _cache_folder_files(path: Path) -> list[Path] | None:
    """The files of ``path`` where it is a compile cache folder of some fingerprint (named like one, holding kernel
    folders only, each holding compiled entries: ``KEY.o`` and files of those keys, ``.json``, ``.sass``, ...,
    besides locks and partial writes), else None: only such a folder is counted by :func:`cache_usage` and
    removed by :func:`prune` (a folder of ``results.json`` files, say, is not one)."""
    if not _is_fingerprint_folder(path):
        return None
    files = []
    try:
        for kernel in path.iterdir():
            if kernel.is_symlink() or not kernel.is_dir():
                return None
            entries = list(kernel.iterdir())
            keys = {f.name.split(".")[0] for f in entries if f.suffix == ".o"}
            for f in entries:
                if (f.is_symlink() or not f.is_file() or not f.name.endswith(_ENTRY_SUFFIXES)
                        or not (f.name.split(".")[0] in keys or f.name.endswith((".lock", ".partial")))):
                    return None
            if not keys:
                return None
            files += entries
    except OSError:
        return None
    return files or None


def _in_use(files: list[Path], now: float) -> str | None:
    """Why the cache folder of ``files`` is in use (a file written or an entry locked in the last
    :data:`PRUNE_IDLE_S` seconds: a process locks each entry it compiles or loads; an entry lock held now; locks
    this process cannot check), or None."""
    mtimes = []
    for f in files:
        try:
            mtimes.append(f.stat().st_mtime)
        except OSError:  # (removed since it was listed: in use)
            mtimes.append(now)
    age = now - max(mtimes)
    if age < PRUNE_IDLE_S:
        return f"used {max(age, 0) / 60:.0f} min ago (folders used in the last hour are kept)"
    for lock in (f for f in files if f.suffix == ".lock"):
        try:
            free = _lock_is_free(lock)
        except OSError as exc:
            return f"its entry locks cannot be checked ({lock.parent.name}/{lock.name}: {exc.strerror or exc})"
        if not free:
            return f"an entry lock is held ({lock.parent.name}/{lock.name}: a process is compiling or loading it)"
    return None


def _folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def cache_usage() -> dict:
    """What the disk cache holds: ``entries`` (compiled objects of this source fingerprint), ``bytes`` (its
    folder), ``stale`` / ``stale_bytes`` (cache folders of other fingerprints: earlier sources or DSL versions, or
    other checkouts sharing the cache; :func:`prune` removes those not used in the last hour).  Zeros where the
    folder does not exist."""
    root, fp = cache_dir(), source_fingerprint()
    here = root / fp
    entries = sum(1 for _ in here.glob("*/*.o")) if here.is_dir() else 0
    stale = [p for p in root.iterdir() if p.name != fp and _cache_folder_files(p)] if root.is_dir() else []
    return dict(entries=entries, bytes=_folder_bytes(here) if here.is_dir() else 0, stale=len(stale),
                stale_bytes=sum(_folder_bytes(p) for p in stale))


class PruneResult(NamedTuple):
    """What :func:`prune` removed (or, with ``dry_run``, would remove) and what it kept."""

    removed: list[Path]  # cache folders of other fingerprints removed (or, with dry_run, that would be)
    bytes: int  # their size
    kept: list[tuple[Path, str]]  # (folder, why) of the other fingerprint-named folders left


def _lock_is_free(lock: Path) -> bool:
    """Whether nobody holds the entry lock ``lock``, leaving the file as it is: on POSIX a non-blocking
    ``flock`` on a read-only descriptor, the lock filelock takes there (taking it through filelock would
    write the file: filelock 4.0 empties a lock it takes, which made a dry run's folder look just used and kept
    it from the next prune; session 71).  ``OSError`` where the file cannot be opened."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: filelock's own lock)
        try:
            with FileLock(str(lock), timeout=0):
                return True
        except Timeout:
            return False
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (closing the descriptor releases a lock it took)
    return True


def prune(dry_run: bool = False) -> PruneResult:
    """Remove the cache folders of other source fingerprints that no process used in the last hour
    (:data:`PRUNE_IDLE_S`): the default cache is shared by every checkout, of any version.  Kept, with the reason:
    folders with a file written or an entry locked in the last hour, or an entry lock held now, and folders named
    like a fingerprint that do not hold cache entries only.  This fingerprint's folder, ``tuned.json`` and any
    other file stay.  ``dry_run``: only say what would be removed."""
    import shutil

    root, fp = cache_dir(), source_fingerprint()
    if not root.is_dir():
        return PruneResult([], 0, [])
    now = time.time()
    removed, nbytes, kept = [], 0, []
    for p in sorted(root.iterdir()):
        if p.name == fp or not _is_fingerprint_folder(p):
            continue
        files = _cache_folder_files(p)
        why = "not a compile cache folder (files other than kernel folders of cache entries, or none)" \
            if files is None else _in_use(files, now)
        if why:
            kept.append((p, why))
            continue
        nbytes += _folder_bytes(p)
        removed.append(p)
        if not dry_run:
            shutil.rmtree(p)
    return PruneResult(removed, nbytes, kept)


def compile_record(kernel: str, key: Hashable) -> CompileRecord:
    """The :class:`CompileRecord` (PTX, SASS, registers, times) of an entry compiled or loaded here."""
    return _records[(kernel, key, target_arch())]


def warn_if_spills(kernel: str, key: Hashable, what: str) -> int:
    """``RuntimeWarning`` when the entry ``(kernel, key)`` compiled or loaded in this process keeps registers in
    local memory (stack bytes in its cubin), naming ``what`` (the config and call); returns the largest stack in
    bytes.  The ranker ops call it for a caller's config (``config=``, ``use_config``) when they first build it.
    The warning names the caller's line (:func:`.warn.warn_user`)."""
    stack = max((r.stack_bytes or 0 for r in compile_record(kernel, key).resources), default=0)
    if stack:
        warn_user(f"{what} keeps {stack} B per thread in local memory (register spills): expect it slower "
                  "than a spill-free tile shape (`cute-kernels layouts --compile` reports the registers)")
    return stack


def clear_memory_cache() -> None:
    """Forget in-process entries (the disk cache stays); used by tests and timing of loads."""
    with _lock:
        _memory.clear()
        _records.clear()
