"""Shipped configs per kernel, the tuned-config cache, and the autotuner (issue 8, "Tile shapes and tuning").

* :func:`shipped_configs` lists each kernel's shipped configs, as its module's ``shipped_configs()`` gives them
  (``ranker_fwd`` per head dim and cap, ``ranker_bwd`` per head dim, ``hc_mix``'s walk configs and the six
  configs ``hc_mix_tma.config_for`` picks, the per-shape configs of ``qknorm`` / ``qknorm_tp`` / ``scale``).
  ``cute-kernels configs [--kernel NAME]`` prints them.
* Tuned configs: ``tuned.json`` in the compile cache root (:func:`cute_kernels.runtime.cache.cache_dir`),
  one entry per (kernel, GPU name, source fingerprint, dtype, shape key) holding the winning config's
  fields.  :func:`store` writes it atomically under a file lock; :func:`lookup` / :func:`tuned_config`
  read it (loaded once per process; re-read when the file or the cache folder changes, or on :func:`reload`,
  which also clears the kernels' memos: a kernel keeps the config it chose for a signature until then).
  A corrupt file is ignored with a warning.  ``CUTE_KERNELS_TUNED=0`` ignores the file (read when a
  kernel first sees a shape: kernels memoize their choice per argument signature).
  Any kernel can use it: build a shape key from what its host side knows without a device sync, call
  :func:`tuned_config` on a memo miss, register its memo with :func:`register_memo`.  Wired now:
  ``ranker_fwd`` (:func:`cute_kernels.kernels.ranker_fwd.config_for_shape`).
* The autotuner, ``cute-kernels tune --kernel ranker_fwd --shape B=4,S=4608,H=16,D=128`` (GPU):
  candidates around the shipped config (validated by the config's ``validate()``, enumerated with
  :func:`cute_kernels.layouts.kernel_layouts.enumerate_configs`), each compiled, its output checked
  against the shipped config's on the same random inputs, timed with
  :func:`cute_kernels.runtime.timing.cuda_time_us`; the fastest is stored.  One tuner per kernel in
  :data:`TUNERS`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from .runtime.artifacts import plain_file_mode
from .runtime.cache import cache_dir, source_fingerprint
from .runtime.warn import warn_user

TUNED_FILE = "tuned.json"
FORMAT_VERSION = 1


# ============================================================================ shipped configs
def _dtype_name(dtype) -> str:
    """``torch.bfloat16`` / ``"torch.bfloat16"`` / ``"bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def shipped_configs(kernel: Optional[str] = None) -> dict:
    """Shipped configs: ``{kernel: {label: config}}`` for every registered kernel (or just ``kernel``).

    Labels say where a config applies: ``"head_dim=128 bfloat16"`` (ranker_fwd: head dim, cap, and the dtype
    where the two dtypes' configs differ), ``"method=tma (default) M=4096"``
    (hc_mix: method and rows per call), ``"bfloat16 q=1024 k=256"`` (qknorm, per-rank widths), ...  Values are
    the kernels' frozen config dataclasses.  Raises ``ValueError`` for an unknown kernel name, ``TypeError`` for
    one that is not a str.
    """
    from . import registry

    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a registered kernel's name (a str) or None, got {kernel!r}")
    if kernel is not None and kernel not in registry.KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; registered: {', '.join(registry.names())}")
    return {name: registry.module(name).shipped_configs()
            for name in ([kernel] if kernel is not None else registry.names())}


def format_configs(kernel: Optional[str] = None) -> str:
    """The text ``cute-kernels configs`` prints: shipped configs, then tuned entries of this source (with
    ``CUTE_KERNELS_TUNED=0``, a line that says they are ignored: the file is not read)."""
    lines = []
    for name, table in shipped_configs(kernel).items():
        lines.append(f"{name}:")
        width = max((len(label) for label in table), default=0)
        for label, cfg in table.items():
            extra = ""
            smem = getattr(cfg, "smem_bytes", None)
            if callable(smem):
                smem = smem()
            if isinstance(smem, int):  # exact where a kernel lays out its struct (ranker_bwd), else a bound
                extra = (f"  [smem {smem} B dynamic, exact]" if getattr(cfg, "SMEM_EXACT", False)
                         else f"  [smem <= {smem} B, estimate]")
            elif callable(getattr(cfg, "bulk_smem_bytes", None)) and cfg.bulk_smem_bytes():  # qknorm's bulk kernel
                extra = f"  [smem {cfg.bulk_smem_bytes()} B of staged rows + under 2 KB of sums and mbarriers]"
            lines.append(f"  {label:<{width}}  {cfg}{extra}")
    if not tuned_enabled():
        return "\n".join(lines + ["tuned: ignored (CUTE_KERNELS_TUNED=0): calls run the shipped configs"]) + "\n"
    tuned = [e for e in _entries().values() if kernel is None or e.get("kernel") == kernel]
    fp = source_fingerprint() if tuned else None
    tuned = [e for e in tuned if e.get("fingerprint") == fp]
    if tuned:
        lines.append(f"tuned ({tuned_path()}, source {fp}):")
        for e in tuned:
            problem = _entry_problem(e)
            lines.append(f"  {e.get('kernel')} {e.get('gpu')} {e.get('dtype')} {e.get('shape')}: {e.get('config')}"
                         f"  ({e.get('time_us')} us, shipped {e.get('shipped_time_us')} us)"
                         + (f"  UNUSABLE ({problem}): calls run the shipped config" if problem else ""))
    return "\n".join(lines) + "\n"


def config_from_fields(cls, fields):
    """The ``cls`` config a stored entry's ``fields`` describe: every field of ``cls`` (as ``cute-kernels tune``
    stores them: a partial entry would take the others from the class defaults, not from the shipped config),
    each of its default's type where that is a bool, int or float (a hand-edited ``"false"`` string must not
    pass as a truthy bool), and a config that checks out when constructed.  ``TypeError`` / ``ValueError``
    with the reason otherwise."""
    if not isinstance(fields, dict):
        raise TypeError(f"config {fields!r} is not an object of fields")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in fields]
    if missing:
        raise ValueError(f"missing fields {', '.join(missing)} (`cute-kernels tune` stores every field)")
    for f in dataclasses.fields(cls):
        want = type(f.default)
        if want in (bool, int, float) and type(fields[f.name]) is not want:
            raise TypeError(f"field {f.name!r} must be a {want.__name__}, got {fields[f.name]!r}")
    return cls(**fields)


def _entry_problem(entry: dict) -> Optional[str]:
    """Why a stored entry's config cannot be used (None when it can, or when no tuner knows its kernel)."""
    cls = getattr(TUNERS.get(entry.get("kernel")), "config_class", None)
    if cls is None:
        return None
    try:
        config_from_fields(cls, entry.get("config"))
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


# ============================================================================ tuned-config cache
_lock = threading.Lock()
_loaded: dict = {"path": None, "stamp": None, "entries": {}}
_memos: list[dict] = []
_generation = [0]  # reload() count: a choice made before a reload must not be stored after it
_gpu_names: dict = {}


def tuned_path() -> Path:
    """``<cache_dir()>/tuned.json``."""
    return cache_dir() / TUNED_FILE


def tuned_enabled() -> bool:
    """``CUTE_KERNELS_TUNED`` (:func:`.runtime.cache.env_flag`): 0/false/no/off (any case) or empty makes
    kernels ignore tuned configs."""
    from .runtime.cache import env_flag

    return env_flag("CUTE_KERNELS_TUNED")


def entry_key(kernel: str, gpu: str, fingerprint: str, dtype, shape_key: str) -> str:
    """The key of one tuned entry: ``kernel|gpu|fingerprint|dtype|shape_key``."""
    return "|".join((kernel, gpu, fingerprint, _dtype_name(dtype), shape_key))


def gpu_name(device=None) -> str:
    """``torch.cuda.get_device_name`` of ``device`` (index, ``torch.device``, a string such as ``"cuda:1"``, or
    None = current; ``"cuda"`` too), memoized by device index."""
    import torch

    if isinstance(device, str):  # (kept by index: "cuda" names the current device, whichever it is then)
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type != "cuda":
        raise ValueError(f"{device} is not a CUDA device")
    idx = device.index if isinstance(device, torch.device) else device
    if idx is None:
        idx = torch.cuda.current_device()
    name = _gpu_names.get(idx)
    if name is None:
        name = _gpu_names[idx] = torch.cuda.get_device_name(idx)
    return name


def _warn(msg: str) -> None:
    warn_user(f"cute_kernels tuned configs: {msg}")


def _read_file(path: Path) -> dict:
    """Entries of ``path`` ({} when absent; {} and a warning when unreadable or malformed)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # (ValueError: not UTF-8 text)
        _warn(f"cannot read {path} ({type(exc).__name__}: {exc}); ignoring it "
              "(the next `cute-kernels tune` rewrites it)")
        return {}
    try:
        data = json.loads(text)
        entries = data["entries"]
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise ValueError("'entries' is not a mapping of objects")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {FORMAT_VERSION}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # (Recursion: deep nesting)
        _warn(f"{path} is corrupt ({type(exc).__name__}: {exc}); ignoring it "
              "(the next `cute-kernels tune` rewrites it)")
        return {}
    return entries


def _stamp(path: Path):
    try:
        st = path.stat()
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


def _entries() -> dict:
    """The entries of the current ``tuned.json``: read once, re-read when the file (its mtime or size)
    or the cache folder changes.  Called on kernels' memo misses only (a ``stat``)."""
    path = tuned_path()
    stamp = _stamp(path)
    if _loaded["path"] == path and _loaded["stamp"] == stamp:
        return _loaded["entries"]
    with _lock:
        if _loaded["path"] != path or _loaded["stamp"] != stamp:
            _loaded["entries"] = _read_file(path)
            _loaded["path"], _loaded["stamp"] = path, stamp
        return _loaded["entries"]


def register_memo(memo: dict) -> dict:
    """Register a kernel's per-signature memo of chosen configs: :func:`reload` clears it."""
    _memos.append(memo)
    return memo


def reload() -> None:
    """Forget the loaded ``tuned.json`` and clear the kernels' memos (the next call re-reads the file)."""
    with _lock:
        _loaded["path"] = None
        _loaded["entries"] = {}
        _generation[0] += 1
        for memo in _memos:
            memo.clear()


def generation() -> int:
    """How many times :func:`reload` ran: take it before choosing a config, give it to :func:`memo_store`."""
    return _generation[0]


def memo_store(memo: dict, key, value, since: int) -> None:
    """``memo[key] = value`` unless :func:`reload` ran after :func:`generation` returned ``since`` (the value
    was chosen from what the reload discarded: storing it would outlive the reload)."""
    with _lock:
        if _generation[0] == since:
            memo[key] = value


def lookup(kernel: str, dtype, shape_key: str, gpu: Optional[str] = None, device=None) -> Optional[dict]:
    """Fields of the tuned config of ``(kernel, gpu, this source's fingerprint, dtype, shape_key)``, or None.

    ``gpu`` defaults to the name of ``device`` (a CUDA device; None = current).  None when
    ``CUTE_KERNELS_TUNED=0``, when ``tuned.json`` is absent/corrupt or has no such entry.
    """
    if not tuned_enabled():
        return None
    entries = _entries()
    if not entries:
        return None
    if gpu is None:
        try:
            gpu = gpu_name(device)
        except (RuntimeError, AssertionError, ValueError):  # not a CUDA device / no CUDA: nothing was tuned for it
            return None
    e = entries.get(entry_key(kernel, gpu, source_fingerprint(), dtype, shape_key))
    cfg = e.get("config") if e else None
    if e and not isinstance(cfg, dict):
        _warn(f"tuned {kernel} entry for {shape_key} has config {cfg!r}, not an object of fields; using the "
              "shipped one")
    return cfg if isinstance(cfg, dict) else None


def tuned_config(kernel: str, cls, dtype, shape_key: str, default, gpu: Optional[str] = None, device=None,
                 accept: Optional[Callable[[Any], Optional[str]]] = None):
    """The tuned ``cls`` config of this key, else ``default``.

    The stored fields must build a ``cls`` (:func:`config_from_fields`) that ``accept`` takes (``accept(cfg)``
    returns None, or the reason it does not fit this call, e.g. another head dim); otherwise a warning and
    ``default``.
    """
    fields = lookup(kernel, dtype, shape_key, gpu=gpu, device=device)
    if fields is None:
        return default
    try:
        cfg = config_from_fields(cls, fields)
        why = accept(cfg) if accept is not None else None
        if why:
            raise ValueError(f"does not fit this call: {why}")
    except (TypeError, ValueError) as exc:
        _warn(f"tuned {kernel} config {fields} for {shape_key} is unusable ({exc}); using the shipped one")
        return default
    return cfg


def store(kernel: str, dtype, shape_key: str, config, gpu: str, **meta) -> Path:
    """Write the tuned ``config`` (a dataclass or a dict of its fields) of this key into ``tuned.json``.

    Read-modify-write under a file lock, written to a temporary file and renamed (atomic: a reader
    sees the old or the new file).  ``meta`` (times, the inputs it was tuned on) is stored beside.
    A corrupt existing file is replaced (with a warning).  Returns the file's path.  A dict is stored as
    given: the reader checks it (:func:`tuned_config` falls back to the shipped config with a warning, and
    ``cute-kernels configs`` marks the entry unusable).
    """
    from filelock import FileLock

    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    path = tuned_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fp = source_fingerprint()
    with FileLock(str(path) + ".lock", timeout=60):
        entries = _read_file(path)
        entries[entry_key(kernel, gpu, fp, dtype, shape_key)] = dict(
            kernel=kernel, gpu=gpu, fingerprint=fp, dtype=_dtype_name(dtype), shape=shape_key, config=fields,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **meta)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TUNED_FILE + ".", suffix=".partial")
        try:
            os.fchmod(fd, plain_file_mode())  # (mkstemp's 0o600 would hide the file from the cache's other users)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    reload()
    return path


# ============================================================================ autotuner
def parse_candidates(text: Optional[str], base) -> dict:
    """``"tile_n=96,128,stages=2,3,persistent=false"`` -> ``{"tile_n": [96, 128], "stages": [2, 3], ...}``.

    An item with ``=`` starts a field; items without one add values to the last field.  Values are
    parsed as the type of ``base``'s field (int, float, true/false); unknown or repeated fields raise
    ``ValueError``.
    """
    from .layouts.kernel_layouts import parse_field

    out: dict[str, list] = {}
    names = {f.name for f in dataclasses.fields(base)}
    field = None
    if not (text or "").strip():
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"candidates {text!r}: an empty item (two commas in a row, or one at an end); "
                             "e.g. 'tile_n=96,128,stages=2,3'")
        if any(c.isspace() for c in part):
            raise ValueError(f"candidate item {part!r} has a space inside: separate values with commas "
                             "(e.g. 'stages=1,2')")
        if "=" in part:
            field, part = part.split("=", 1)
            if field not in names:
                raise ValueError(f"candidate field {field!r} unknown for {type(base).__name__}; "
                                 f"fields: {sorted(names)}")
            if field in out:  # (as --shape and layouts --config refuse a repeated name)
                raise ValueError(f"candidate field {field!r} given twice: list its values once "
                                 f"({field}=a,b,...)")
            out[field] = []
        elif field is None:
            raise ValueError(f"candidate item {part!r}: expected field=value[,value...]")
        value = parse_field(base, field, part)
        if value not in out[field]:
            out[field].append(value)
    return out


def _parse_shape_items(text: str, allowed: dict) -> dict:
    """``"B=4,S=4608"`` -> ``{"B": 4, "S": 4608}`` with values parsed by ``allowed[name]``."""
    from .layouts.kernel_layouts import key_values

    out = {}
    for k, v in key_values(text, "shape item", list(allowed), example="B=4,S=4608,H=16,D=128").items():
        try:
            out[k] = allowed[k](v)
        except ValueError:
            raise ValueError(f"shape item {k}={v!r}: not a valid value") from None
    return out


def _cap(v: str):
    return None if v.lower() == "none" else float(v)


class RankerFwdTuner:
    """Tuner of :mod:`cute_kernels.kernels.ranker_fwd` (the shape key is what ``ranker_attention``
    sees without a device sync: B, S, Hq, Hkv, D and the cap method; hist/cand only shape the inputs)."""

    kernel = "ranker_fwd"

    @property
    def config_class(self):
        return self._module().RankerFwdConfig

    shape_help = "B=4,S=4608,H=16,D=128[,Hkv=..,hist=..,cand=..,cap=..,cap_method=tanh|soft_sign]"
    _items = dict(B=int, S=int, H=int, Hq=int, D=int, Hkv=int, hist=int, cand=int, cap=_cap, cap_method=str)

    @staticmethod
    def _module():
        from .kernels import ranker_fwd

        return ranker_fwd

    def parse_shape(self, text: str) -> dict:
        """Shape items; defaults: ``Hkv = H``, ``cand = S // 9``, ``hist = S - cand``, no cap."""
        s = _parse_shape_items(text, self._items)
        given_items = set(s)
        if "H" in s and "Hq" in s and s["H"] != s["Hq"]:
            raise ValueError("give H or Hq, not both")
        s["Hq"] = s.pop("H", s.get("Hq"))
        missing = [k for k in ("B", "S", "Hq", "D") if s.get(k) is None]
        if missing:
            raise ValueError(f"shape needs {', '.join(m if m != 'Hq' else 'H' for m in missing)} ({self.shape_help})")
        s.setdefault("Hkv", s["Hq"])
        s.setdefault("cand", s["S"] // 9 if "hist" not in s else s["S"] - s["hist"])
        s.setdefault("hist", s["S"] - s["cand"])
        s.setdefault("cap", None)
        if s["cap"] is None and s.get("cap_method") == "none":
            s.pop("cap_method")  # the library's own spelling of no cap
        if s["cap"] is None and "cap_method" in s:
            raise ValueError(f"cap_method={s['cap_method']} without cap=..: give the cap too ({self.shape_help})")
        s.setdefault("cap_method", "tanh")
        rf = self._module()
        tile_m = min(c.tile_m for c in (*rf.CONFIGS.values(), *rf.CAP_CONFIGS.values()))  # (the most tiles)
        tiles = -(-s["S"] // tile_m) * s["Hq"] * s["B"]  # the op refuses more than MAX_WORK_TILES (its work list)
        if tiles > rf.MAX_WORK_TILES:
            raise ValueError(f"shape B={s['B']}, S={s['S']}, H={s['Hq']}: {tiles} work tiles of {tile_m} q rows; the "
                             f"op takes at most {rf.MAX_WORK_TILES} (2**30)")
        if min(s["B"], s["S"], s["Hq"], s["Hkv"]) < 1:
            raise ValueError("B, S, H, Hkv must be positive")
        if s["Hq"] % s["Hkv"]:
            raise ValueError(f"H={s['Hq']} must be a multiple of Hkv={s['Hkv']}")
        if s["D"] not in rf.CONFIGS:
            raise ValueError(f"D={s['D']} unsupported; shipped head dims: {sorted(rf.CONFIGS)}")
        if s["hist"] < 0 or s["cand"] < 0 or s["hist"] + s["cand"] > s["S"]:
            given = " + ".join(f"{k}={s[k]}" for k in ("hist", "cand") if k in given_items) or "hist + cand"
            raise ValueError(f"{given} must be non-negative and fit in S={s['S']}")
        rf._check_scalars(None, s["cap"], s["cap_method"])
        return s

    def shape_key(self, s: dict) -> str:
        return self._module().tuned_shape_key(s["B"], s["S"], s["Hq"], s["Hkv"], s["D"],
                                              "none" if s["cap"] is None else s["cap_method"], s["cap"])

    def shipped(self, s: dict, dtype=None):
        """The shipped config for the shape's head dim and ``dtype`` (a torch dtype; None: bfloat16)."""
        import torch

        return self._module().shipped_config(dtype or torch.bfloat16, s["D"],
                                             "none" if s["cap"] is None else s["cap_method"])

    def default_choices(self, base) -> dict:
        """Around ``base``: both schedules, overlap on/off, +-1 stage (>= 1), tile_n +-32."""
        return dict(persistent=[False, True], intra_wg_overlap=[True, False],
                    stages=sorted({max(1, base.stages - 1), base.stages, base.stages + 1}),
                    tile_n=sorted({t for t in (base.tile_n - 32, base.tile_n, base.tile_n + 32) if 64 <= t <= 256}))

    def make_inputs(self, s: dict, dtype, seed: int = 0) -> dict:
        import torch

        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(s["B"], s["S"], s["Hq"], s["D"], device="cuda", dtype=dtype, generator=g)
        k = torch.randn(s["B"], s["S"], s["Hkv"], s["D"], device="cuda", dtype=dtype, generator=g)
        v = torch.randn(s["B"], s["S"], s["Hkv"], s["D"], device="cuda", dtype=dtype, generator=g)
        h, c = s["hist"], s["cand"]
        bounds = torch.tensor([[0, h, h, h + c]] * s["B"], device="cuda", dtype=torch.int32)
        return dict(q=q, k=k, v=v, bounds=bounds, cap=s["cap"], cap_method=s["cap_method"],
                    out=torch.empty_like(q),
                    lse=torch.empty(s["B"], s["Hq"], s["S"], device="cuda", dtype=torch.float32))

    def inputs_meta(self, s: dict) -> dict:
        """What the inputs were beyond the shape key (stored beside the winner)."""
        return {k: s[k] for k in ("hist", "cand", "cap")}

    def outputs(self, cfg, x: dict) -> tuple:
        """``(out, lse)`` of ``cfg`` on ``x``: buffers NaN-poisoned before the launch, copies after."""
        import torch

        x["out"].fill_(float("nan"))
        x["lse"].fill_(float("nan"))
        self.run(cfg, x)
        torch.cuda.synchronize()
        return x["out"].clone(), x["lse"].clone()

    def run(self, cfg, x: dict):
        """Launch ``cfg`` as the forward would run it once stored (``ranker_fwd.chosen_config``: e.g. with the
        online max for float16) into the preallocated ``out``/``lse`` (compiles on first use)."""
        mod = self._module()
        cfg = mod.chosen_config(cfg, x["q"].dtype, x["cap"])
        return mod._ranker_impl(x["q"], x["k"], x["v"], x["bounds"], None, x["cap"], x["cap_method"],
                                None, None, out=x["out"], lse=x["lse"], config=cfg)

    @staticmethod
    def mismatch(got, ref) -> Optional[str]:
        """None when ``got`` (out, lse) matches ``ref`` up to summation order; else why not.

        ``out`` (bf16/fp16): within 4 bf16 ulps relative + 2e-3 absolute (outputs are averages of
        N(0, 1) values, ~0.03 on history rows: a missed or doubled KV block is far outside);
        ``lse`` (float32, ~8): within 1e-3."""
        import torch

        for name, a, b, rtol, atol in (("out", got[0], ref[0], 2**-6, 2e-3), ("lse", got[1], ref[1], 1e-4, 1e-3)):
            a, b = a.float(), b.float()
            ok = torch.isclose(a, b, rtol=rtol, atol=atol)  # -inf == -inf; NaN never matches
            if not bool(ok.all()):
                bad = int((~ok).sum())
                finite = torch.isfinite(a) & torch.isfinite(b)
                err = (a - b)[finite].abs().max().item() if bool(finite.any()) else float("nan")
                return f"{name}: {bad} elements differ (max finite abs err {err:.3e}; rtol {rtol}, atol {atol})"
        return None


# kernel -> its tuner: parse_shape(text) -> shape dict, shape_key(shape) -> str (what the kernel's host side
# looks up), shipped(shape, dtype) -> config, default_choices(base) -> {field: values}, make_inputs(shape, dtype),
# outputs(config, inputs) -> tensors, run(config, inputs) (timed), mismatch(got, ref) -> None | reason,
# inputs_meta(shape) -> dict
TUNERS: dict[str, Any] = {"ranker_fwd": RankerFwdTuner()}


def candidate_configs(kernel: str, shape: dict, candidates: Optional[str] = None,
                      dtype=None) -> tuple[list, list]:
    """``(accepted, rejected)`` candidates of ``kernel`` for ``shape`` (and ``dtype``, a torch dtype; None:
    bfloat16): the shipped config first, then every combination of the choices (``--candidates`` fields
    replace the defaults) that ``validate()`` accepts, via
    :func:`cute_kernels.layouts.kernel_layouts.enumerate_configs`."""
    from .layouts.kernel_layouts import enumerate_configs

    tuner = TUNERS[kernel]
    base = tuner.shipped(shape, dtype)
    choices = tuner.default_choices(base)
    choices.update(parse_candidates(candidates, base))
    fixed = [f for f in ("head_dim",) if f in choices and any(v != getattr(base, f, v) for v in choices[f])]
    if fixed:  # the shape decides these; a candidate with another value would never serve this shape
        raise ValueError(f"--candidates may not change {', '.join(fixed)}: the shape sets it")
    accepted, rejected = enumerate_configs(base, **choices)
    return [base] + [c for c in dict.fromkeys(accepted) if c != base], rejected


def config_diff(cfg, base) -> str:
    """``"tile_n=96,persistent=False"``: the fields of ``cfg`` (a config, or a ``{field: value}`` dict of
    changes, e.g. a rejected candidate's) that differ from ``base`` ("shipped" if none)."""
    values = cfg if isinstance(cfg, dict) else {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    diff = [f"{f.name}={values[f.name]}" for f in dataclasses.fields(base)
            if f.name in values and values[f.name] != getattr(base, f.name)]
    return ",".join(diff) or "shipped"


@dataclasses.dataclass
class TuneRow:
    config: Any
    time_us: Optional[float] = None
    mode: str = ""
    error: str = ""


def tune(kernel: str, shape_text: str, candidates: Optional[str] = None, dtype: str = "bf16", rounds: int = 2,
         save: bool = True, echo: Callable[[str], None] = print) -> tuple[list[TuneRow], Optional[Path]]:
    """Time the candidates of ``kernel`` on ``shape_text`` (GPU), store the winner; see the module docstring.

    Returns the rows (shipped config first) and the ``tuned.json`` path (None when not saved).
    """
    import torch

    from .runtime.timing import SETTLE_S, cuda_time_us, rotated

    tuner = TUNERS[kernel]
    shape = tuner.parse_shape(shape_text)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    configs, rejected = candidate_configs(kernel, shape, candidates, dtype=tdtype)
    echo(f"{kernel} {tuner.shape_key(shape)} {_dtype_name(tdtype)} on {gpu_name()}: {len(configs)} candidates "
         f"({len(rejected)} rejected by validate())")
    x = tuner.make_inputs(shape, tdtype)
    rows = [TuneRow(c) for c in configs]
    ref = None
    for row in rows:
        try:
            got = tuner.outputs(row.config, x)
            if ref is None:
                ref = got  # the shipped config's output
            else:
                row.error = tuner.mismatch(got, ref) or ""
        except Exception as exc:  # a candidate that does not compile or launch is dropped
            row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]
        echo(f"  {'ok  ' if not row.error else 'drop'} {config_diff(row.config, configs[0])}"
             f"{'  ' + row.error if row.error else ''}")
        if ref is None:
            raise RuntimeError(f"the shipped config failed on this shape: {row.error}")
    live = [r for r in rows if not r.error]
    for i in range(rounds):  # interleaved rounds, each starting one candidate later: a noisy machine hits every
        # candidate alike; each timed after SETTLE_S s of calls (the board's sustained clock, not an idle spell's)
        for r in rotated(live, i):
            fn = lambda r=r: tuner.run(r.config, x)  # noqa: E731
            try:
                t, mode = cuda_time_us(fn, graph=True, settle_s=SETTLE_S), "graph"
            except Exception:
                torch.cuda.synchronize()
                t, mode = cuda_time_us(fn, graph=False, settle_s=SETTLE_S), "eager"
            r.time_us = t if r.time_us is None else min(r.time_us, t)
            r.mode = mode
    best = min(live, key=lambda r: r.time_us)
    path = None
    if save:
        path = store(kernel, tdtype, tuner.shape_key(shape), best.config, gpu_name(), time_us=round(best.time_us, 2),
                     shipped_time_us=round(rows[0].time_us, 2), candidates=len(live),
                     inputs=tuner.inputs_meta(shape))
    return rows, path


MANY_CANDIDATES = 50  # tune_cli notes the compile time above this many candidates


def tune_cli(kernel: str, shape: str, candidates: Optional[str] = None, dtype: str = "bf16", list_only: bool = False,
             rounds: int = 2, save: bool = True) -> int:
    """``cute-kernels tune``: exit status 0 (tuned or listed), 2 (bad arguments, no GPU, no tuner, or
    ``--candidates`` of which ``validate()`` rejected every one: nothing besides the shipped config to time)."""
    if rounds < 1:
        print("tune: --rounds must be >= 1", file=sys.stderr)
        return 2
    if kernel not in TUNERS:
        from . import registry

        what = "no tuner for kernel" if kernel in registry.KERNELS else "unknown kernel"
        print(f"{what} {kernel!r}; tunable: {', '.join(TUNERS)}", file=sys.stderr)
        return 2
    tuner = TUNERS[kernel]
    try:
        import torch

        s = tuner.parse_shape(shape)
        if dtype not in ("bf16", "fp16"):
            raise ValueError(f"--dtype {dtype!r}: bf16 or fp16")
        configs, rejected = candidate_configs(kernel, s, candidates,
                                              dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    except (ValueError, TypeError) as exc:
        print(f"tune: {exc}", file=sys.stderr)
        return 2
    nothing_to_try = candidates is not None and len(configs) == 1 and bool(rejected)
    if list_only:
        print(f"{kernel} {tuner.shape_key(s)}: {len(configs)} candidates, as changes of the shipped {configs[0]}")
        for c in configs:
            print(f"  {config_diff(c, configs[0])}")
        for c, why in rejected:
            change = config_diff(c, configs[0])
            # (validate()'s reason often starts with the change itself: "tile_n=7: must be ...")
            print(f"  rejected {change}: {why[len(change) + 2:] if why.startswith(change + ': ') else why}")
    if len(configs) > MANY_CANDIDATES:  # each compiles for a few seconds before it is timed
        print(f"tune: note: {len(configs)} candidates take about {len(configs) * 5 // 60 + 1} min or more to compile "
              "(a few seconds each) before any is timed; narrow --candidates to try fewer", file=sys.stderr)
    if nothing_to_try:
        print(f"tune: validate() rejected every one of the {len(rejected)} candidates of --candidates "
              f"{candidates!r}: nothing besides the shipped config to time", file=sys.stderr)
        return 2
    if list_only:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("tune needs a CUDA GPU (none found); `cute-kernels tune --list ...` shows the candidates on a CPU",
              file=sys.stderr)
        return 2
    try:
        rows, path = tune(kernel, shape, candidates, dtype=dtype, rounds=rounds, save=save)
    except RuntimeError as exc:  # the shipped config itself failed: nothing to compare against
        print(f"tune: {exc}", file=sys.stderr)
        return 1
    base = rows[0].time_us
    print(f"{'time_us':>9} {'vs shipped':>10}  config (changes of the shipped one)")
    for r in sorted(rows, key=lambda r: (r.time_us is None, r.time_us or 0.0)):
        if r.time_us is not None:
            print(f"{r.time_us:9.2f} {base / r.time_us:9.3f}x  {config_diff(r.config, rows[0].config)} ({r.mode})")
        else:
            print(f"{'-':>9} {'-':>10}  {config_diff(r.config, rows[0].config)}  dropped: {r.error}")
    if path:
        print(f"winner stored in {path}")
    return 0
