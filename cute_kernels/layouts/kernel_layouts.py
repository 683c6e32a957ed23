"""The layouts of our kernels' configs, from the kernels' own code, plus a report writer.

:func:`ranker_fwd_layouts` traces the ranker forward's smem layouts through the module's own
layout function (``ranker_fwd.smem_layouts(dtype, config)``, which ``RankerAttentionFwd.__call__`` calls), its WGMMA
accumulator and epilogue copy thread-value layouts, the TMA boxes, the epilogue's bank conflicts,
and the smem budget.  :func:`ranker_bwd_layouts` does the same for the backward mainloop (through
``ranker_bwd.smem_layouts`` / ``tiled_mmas``: Q, dO, K, V, dS^T and float32 dQ buffers, the five GEMMs'
accumulators, the dS^T stmatrix and dQ stores' bank conflicts) and :func:`hc_mix_tma_layouts` for the
mHC TMA kernel (its x and hc_fn piece rings, the WGMMA accumulator, the squares' 16-byte reads).  :func:`write_report`
is what ``cute-kernels layouts`` runs.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from . import analysis, viz
from .hopper import cutlass_dtype, elem_bytes, tma_box
from .static import StaticLayout, trace


@dataclass
class TVLayout:
    """A thread-value layout over an ``(M, N)`` tile; ``vec`` values per access."""

    layout: StaticLayout
    tile: tuple[int, int]
    vec: int = 1
    note: str = ""


@dataclass
class KernelLayouts:
    """Everything :func:`write_report` draws and prints for one kernel config."""

    kernel: str
    config: Any
    dtype: str
    smem: dict[str, StaticLayout] = field(default_factory=dict)
    tma: dict[str, dict] = field(default_factory=dict)
    tv: dict[str, TVLayout] = field(default_factory=dict)
    conflicts: list[analysis.ConflictReport] = field(default_factory=list)
    budget: Optional[analysis.SmemBudget] = None
    source: str = ""  # where the smem layouts came from
    smem_elem_bytes: dict[str, int] = field(default_factory=dict)  # buffers not of the kernel's dtype


# ---------------------------------------------------------------------------- config parsing
def parse_config(cls, text: Optional[str], base=None, **implied):
    """``"tile_n=176,stages=3"`` -> ``dataclasses.replace(base or cls(), tile_n=176, stages=3)``.

    Each value is parsed as the type of the field's current value (int, float, bool as
    true/false); unknown fields and unparsable values raise ``ValueError`` naming the field.
    ``implied``: fields set unless the text names them (e.g. the dQ form that goes with a ``tile_m``).
    All fields are replaced at once, and the config checks itself when constructed: ``ValueError``
    with the reason for one that does not fit.
    """
    cfg = base if base is not None else cls()
    example = CONFIG_EXAMPLES.get(cls.__name__, "stages=3")
    items = key_values(text, f"{cls.__name__} config field", [f.name for f in dataclasses.fields(cls)], example)
    kw = {k: parse_field(cfg, k, v) for k, v in items.items()}
    kw = {**{k: v for k, v in implied.items() if k not in kw}, **kw}
    try:
        return dataclasses.replace(cfg, **kw) if kw else cfg
    except TypeError as exc:  # a field of the wrong type (the parser gives each its type: not expected)
        raise ValueError(str(exc)) from None


def parse_field(config, name: str, text: str):
    """``text`` as the value of field ``name`` of the config dataclass ``config``: of the type of its value there
    (int, float, bool as true/false, an ``x``-joined int tuple); a field defaulting to None also takes ``none``
    and, otherwise, what its metadata's ``type`` says (``walk_stagger``: an int) or true/false
    (``gqa_group_per_cta``).  ``ValueError`` naming the field for a value it cannot take."""
    f = next(f for f in dataclasses.fields(config) if f.name == name)
    optional = f.metadata.get("type", bool) if f.default is None else None
    return _parse_value(name, text, getattr(config, name), optional)


# a valid --config per kernel config class (the messages' example)
CONFIG_EXAMPLES = {"RankerFwdConfig": "head_dim=128,stages=3,persistent=false", "HcMixTmaConfig": "tile_m=256,stages=4",
                   "RankerBwdConfig": "head_dim=64,tile_m=128"}


def key_values(text: Optional[str], what: str, known, example: str = "stages=3") -> dict:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (values unparsed; None or "" -> ``{}``).  ``ValueError``
    naming ``what`` for an empty item (``"a=1,,b=2"``, a trailing comma: a value may have been lost), an
    item without ``=``, a name not in ``known`` or a name given twice (``example``: a valid spec, for the
    message about spaces)."""
    out: dict = {}
    if not (text or "").strip():
        return out
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"{what}s {text!r}: an empty item (two commas in a row, or one at an end); "
                             f"items are key=value separated by commas (e.g. {example})")
        if any(c.isspace() for c in part):
            raise ValueError(f"{what} {part!r}: items are key=value separated by commas, no spaces (e.g. {example})")
        if "=" not in part:
            raise ValueError(f"{what} {part!r}: expected key=value (items are separated by commas; a tuple value "
                             "is its integers joined by x, e.g. tree=8x4x4)")
        k, v = part.split("=", 1)
        if k not in known:
            raise ValueError(f"{what} {k!r} unknown; known: {', '.join(sorted(known))}")
        if k in out:
            raise ValueError(f"{what} {k!r} given twice")
        out[k] = v
    return out


def _parse_value(field: str, v: str, current, optional=None):
    """``v`` parsed as the type of ``current`` (the field's value in the base config).  A field that may be
    None (``optional``: the type it holds otherwise, see :func:`parse_field`) takes none, or true / false
    (an optional bool such as ``gqa_group_per_cta``), or an integer (``walk_stagger``)."""
    if optional is not None and v.lower() == "none":
        return None
    if optional is int:
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"config field {field!r} takes an integer or none, got {v!r}") from None
    if optional is bool or current is None:
        if v.lower() not in ("true", "false"):
            raise ValueError(f"config field {field!r} takes true, false or none, got {v!r}")
        return v.lower() == "true"
    if isinstance(current, bool):
        if v.lower() not in ("true", "false"):
            raise ValueError(f"config field {field!r} takes true or false, got {v!r}")
        return v.lower() == "true"
    if isinstance(current, tuple):  # e.g. hc_mix_tma's tree: "4x2x2x2x2"
        try:
            return tuple(int(x) for x in v.split("x"))
        except ValueError:
            raise ValueError(f"config field {field!r} takes integers joined by 'x' (e.g. 4x2x2), got {v!r}") from None
    for typ in (int, float):
        if isinstance(current, typ):
            try:
                return typ(v)
            except ValueError:
                kind = "an integer" if typ is int else "a number"
                raise ValueError(f"config field {field!r} takes {kind}, got {v!r}") from None
    return v


def ranker_config(text: Optional[str] = None, dtype="bf16", cap_method: Optional[str] = None):
    """A ranker forward config from ``"head_dim=64,tile_n=96"``: the shipped config of that head dim for
    ``dtype`` and ``cap_method`` (``ranker_fwd.shipped_config``: None or ``"none"`` the uncapped one, ``"tanh"`` /
    ``"soft_sign"`` the capped one where one is shipped; float16 takes the online max) with the other fields
    replaced; ``fixed_row_max=true`` (a capped config) turns the uncapped ``checked_max`` off unless the text
    sets it.  ``ValueError`` with the reason for a config that does not fit (see :func:`parse_config`) or an
    unknown ``cap_method``."""
    from ..kernels import ranker_fwd as rf

    torch_dtype = _ranker_torch_dtype(dtype)
    default = rf.RankerFwdConfig()
    items = key_values(text, "RankerFwdConfig config field", [f.name for f in dataclasses.fields(rf.RankerFwdConfig)],
                       CONFIG_EXAMPLES["RankerFwdConfig"])  # (the same items parse_config reads below)
    head_dim = _parse_value("head_dim", items["head_dim"], 0) if "head_dim" in items else default.head_dim
    # (an unsupported head dim starts from the default one; the config's check then names it)
    base = rf.shipped_config(torch_dtype, head_dim if head_dim in rf.CONFIGS else default.head_dim,
                             _check_cap_method(cap_method))
    capped = "fixed_row_max" in items and _parse_value("fixed_row_max", items["fixed_row_max"], False)
    return parse_config(rf.RankerFwdConfig, text, base, **(dict(checked_max=False) if capped else {}))


def parse_tma_type(text: str) -> dict:
    """Box and bytes of a DSL TMA atom from its type string, e.g.
    ``...tiled_tma_load<sm_90, bf16, copy_bits = 131072, tma_gbasis = <"(64,128):(1@1,1@0)">...``:
    the box is 64 elements along tensor mode 1 by 128 along mode 0, 16384 bytes per copy.
    Returns ``dict(dsl_box=(extent of mode 0, extent of mode 1, ...), dsl_box_bytes=..., dsl_type=text)``
    (only ``dsl_type`` when the string has another form)."""
    import re

    out: dict = {"dsl_type": text}
    m = re.search(r'tma_gbasis = <"\(([\d,]+)\):\(([^)]*)\)">', text)
    b = re.search(r"copy_bits = (\d+)", text)
    if m:
        extents = [int(x) for x in m.group(1).split(",")]
        modes = [int(x.split("@")[1]) for x in m.group(2).split(",")]
        if len(extents) == len(modes) and sorted(modes) == list(range(len(modes))):
            box = [0] * len(modes)
            for e, md in zip(extents, modes):
                box[md] = e
            out["dsl_box"] = tuple(box)
    if b:
        out["dsl_box_bytes"] = int(b.group(1)) // 8
    return out


def enumerate_configs(base, **choices) -> tuple[list, list]:
    """Every combination of ``choices`` (field -> values) applied to the frozen config ``base``, split by
    whether the config can be constructed (its ``validate()``): ``(accepted configs, [(fields, reason), ...]
    rejected)``, ``fields`` the combination's ``{field: value}`` (a config that does not fit never exists).

    Example: ``enumerate_configs(ranker_fwd.CONFIGS[128], tile_n=range(64, 257, 16), stages=(1, 2, 3, 4))``.
    NumPy integers and bools (``np.arange``) count as Python ones.  ``ValueError`` for a field the config does
    not have; ``TypeError`` (raised, not counted as rejected) for a value of the wrong type.
    """
    import itertools
    import numbers

    import numpy as np

    names = list(choices)
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(base)})
    if unknown:  # (a typo, not a config that does not fit)
        raise ValueError(f"{type(base).__name__} has no field {', '.join(unknown)}")
    accepted, rejected = [], []

    def plain(v):  # np.int64(64) -> 64, np.bool_(True) -> True; anything else as given
        if isinstance(v, numbers.Integral) and not isinstance(v, int):
            return int(v)
        return bool(v) if isinstance(v, np.bool_) else v

    for values in itertools.product(*(list(choices[n]) for n in names)):
        fields = {n: plain(v) for n, v in zip(names, values)}
        try:
            accepted.append(dataclasses.replace(base, **fields))
        except ValueError as exc:
            rejected.append((fields, str(exc)))
    return accepted, rejected


def _check_cap_method(cap_method: Optional[str]) -> str:
    """``cap_method`` (None: no cap) as the rankers name it, ``"none"``, ``"tanh"`` or ``"soft_sign"``;
    ``ValueError`` for another."""
    from ..kernels.ranker_fwd import CAP_METHODS

    if cap_method is None:
        return "none"
    if cap_method not in CAP_METHODS:
        raise ValueError(f"cap_method must be one of {', '.join(CAP_METHODS)} (--cap on the command line), "
                         f"got {cap_method!r}")
    return cap_method


def _resolve_config(config, cls, parse):
    """``config`` as a ``cls`` instance: None or a string go through ``parse`` (``ValueError`` with the
    reason for one that does not fit; ``TypeError`` for anything else)."""
    if config is None or isinstance(config, str):
        config = parse(config)
    if not isinstance(config, cls):
        raise TypeError(f"config must be a {cls.__name__}, a string or None, got {type(config).__name__}")
    return config


def _tma_box_2d(lay: StaticLayout, dtype) -> dict:
    """:func:`tma_box` of the first two modes (rows, cols) of a possibly staged smem layout."""
    two_d = lay if len(lay.dims) == 2 else StaticLayout(lay.shape[:2], lay.stride[:2], lay.swizzle, lay.offset,
                                                        lay.name)
    return tma_box(two_d, dtype)


# ---------------------------------------------------------------------------- ranker forward
def _ranker_dsl_objects(rf, dt, config):
    """DSL side (inside trace): smem layouts, tiled MMAs and epilogue copies as the kernel builds them."""
    import cutlass.cute as cute

    smem = dict(rf.smem_layouts(dt, config))  # (sO: the layout of its own buffer or of sQ, which it aliases)
    mma_qk, mma_pv = rf.tiled_mmas(dt, config)
    stsm = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
    epi_copy = cute.make_tiled_copy_C(stsm, mma_pv)
    # varlen epilogue: 16-byte reads of sO by rows (RankerAttentionFwd.epilogue, varlen branch: one epilogue
    # for the tile, wg_epilogue being fixed-length only)
    vec = 128 // dt.width
    cols = config.head_dim // vec
    nthr = 128 * config.consumer_wgs
    rd_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=128)
    rd_copy = cute.make_tiled_copy_tv(rd_atom, cute.make_ordered_layout((nthr // cols, cols), order=(1, 0)),
                                      cute.make_layout((1, vec)))
    # self_kv_tma: q_i, k_i, v_i read from sQ / a K/V stage into the O accumulator layout (ldmatrix)
    ldsm = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
    self_copy = cute.make_tiled_copy_C(ldsm, mma_pv)
    # TMA atoms as __call__ builds them, over a stand-in row-major (rows, head_dim) global tensor
    # (the kernel's (S, D) view of q/k/v/o has the same mode order, D contiguous)
    from cutlass.cute.nvgpu import cpasync

    def tma_type(op, smem_layout, rows):
        ptr = cute.make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=16)
        g = cute.make_tensor(ptr, cute.make_layout((rows * 4, config.head_dim), stride=(config.head_dim, 1)))
        atom, _ = cpasync.make_tiled_tma_atom(op, g, smem_layout, (rows, config.head_dim))
        return str(atom.type)

    # the O store (fixed length): the tile, or (wg_epilogue) one warpgroup's 64 rows of sO, as __call__ builds its atom
    epi_rows = 64 if config.wg_epilogue else config.tile_m
    sO_box = cute.composition(smem["sO"], (cute.make_layout(epi_rows), cute.make_layout(config.head_dim)))
    tma = {}
    for name, op, lay, rows in (("sQ", cpasync.CopyBulkTensorTileG2SOp(), smem["sQ"], config.tile_m),
                                ("sK", cpasync.CopyBulkTensorTileG2SOp(), smem["sK"], config.tile_n),
                                ("sV", cpasync.CopyBulkTensorTileG2SOp(), smem["sV"], config.tile_n),
                                ("sO", cpasync.CopyBulkTensorTileS2GOp(), sO_box, epi_rows)):
        if cute.rank(lay) == 3:
            lay = cute.select(lay, mode=[0, 1])
        tma[name] = tma_type(op, lay, rows)
    out = {k: v for k, v in smem.items()}
    out["sO store box"] = sO_box  # (not an smem buffer: the region one TMA store of O reads)
    out["tma_types"] = tma
    out["tv:S=QK^T accumulator"] = mma_qk.tv_layout_C_tiled
    out["tv:O=PV accumulator"] = mma_pv.tv_layout_C_tiled
    out["tv:epilogue stmatrix (dst)"] = epi_copy.layout_dst_tv_tiled
    out["tv:varlen epilogue 16B reads (src)"] = rd_copy.layout_src_tv_tiled
    out["tv:self term ldmatrix (src)"] = self_copy.layout_src_tv_tiled
    out["tiles"] = {k: tuple(int(cute.size(m)) for m in c.tiler_mn)
                    for k, c in (("tv:epilogue stmatrix (dst)", epi_copy),
                                 ("tv:varlen epilogue 16B reads (src)", rd_copy),
                                 ("tv:self term ldmatrix (src)", self_copy))}
    return out


def _ranker_dtype(dtype):
    """The cutlass dtype of a ranker kernel's ``dtype`` argument: ``ValueError`` unless 16-bit (bf16/fp16)."""
    dt = cutlass_dtype(dtype)
    if dt.__name__ not in ("BFloat16", "Float16"):
        raise ValueError(f"dtype {dtype!r}: the ranker kernels take bf16 or fp16 only")
    return dt


def ranker_fwd_layouts(config=None, dtype="bf16", cap_method: Optional[str] = None) -> KernelLayouts:
    """Layouts, TMA boxes, TV layouts, smem bank conflicts (the epilogue's stmatrix writes and varlen row
    reads of sO; where the kernel takes ``self_kv_tma``, the self term's ldmatrix reads of sQ, which stand for
    its reads of a K/V stage too: the stage has sQ's layout there, tile_m == tile_n) and smem budget of a ranker
    forward config.

    Args:
        config: a ``RankerFwdConfig``, a string such as ``"head_dim=64,tile_n=96"`` or None (the
            shipped head-dim-128 config for ``dtype`` and ``cap_method``).
        dtype: "bf16"/"fp16" (or torch/cutlass dtype).
        cap_method: for a string or None, the cap whose shipped config fills the fields the string does not
            set (:func:`ranker_config`; None: no cap).
    """
    from ..kernels import ranker_fwd as rf

    config = _resolve_config(config, rf.RankerFwdConfig, lambda text: ranker_config(text, dtype, cap_method))
    dt = _ranker_dtype(dtype)
    eb = elem_bytes(dt)
    objs = trace(lambda: _ranker_dsl_objects(rf, dt, config))
    copy_tiles = objs.pop("tiles")
    tma_types = objs.pop("tma_types")
    kl = KernelLayouts("ranker_fwd", config, dt.__name__,
                       source="ranker_fwd.smem_layouts")
    for k, v in objs.items():
        if k.startswith("tv:"):
            continue
        kl.smem[k] = v.named(f"{k} {v.dims}")
    tiles = {"tv:S=QK^T accumulator": ((config.tile_m, config.tile_n), 1),
             "tv:O=PV accumulator": ((config.tile_m, config.head_dim), 1),
             "tv:epilogue stmatrix (dst)": (copy_tiles["tv:epilogue stmatrix (dst)"], 16 // eb),
             "tv:varlen epilogue 16B reads (src)": (copy_tiles["tv:varlen epilogue 16B reads (src)"], 16 // eb)}
    if rf.self_kv_tma_taken(config):  # (the kernel's own rule)
        tiles["tv:self term ldmatrix (src)"] = (copy_tiles["tv:self term ldmatrix (src)"], 16 // eb)
    for k, (tile, vec) in tiles.items():
        kl.tv[k[3:]] = TVLayout(objs[k].named(k[3:]), tile, vec)
    # the O store reads one warpgroup's 64 rows of sO (wg_epilogue) or the tile: its box from that region
    sO_box = kl.smem.pop("sO store box")
    for name in ("sQ", "sK", "sV", "sO"):
        if name in kl.smem:
            kl.tma[name] = _tma_box_2d(sO_box if name == "sO" else kl.smem[name], dt)
            kl.tma[name].update(parse_tma_type(tma_types.get(name, "")))
    # bank conflicts of each smem access, on the kernel's layout and on the same tile unswizzled: the epilogue's
    # over sO; the self term's ldmatrix over sQ (a K/V stage has sQ's layout when tile_m == tile_n)
    for buffer, keys in (("sO", ("epilogue stmatrix (dst)", "varlen epilogue 16B reads (src)")),
                         ("sQ", ("self term ldmatrix (src)",))):
        lay = kl.smem.get(buffer)
        for key in keys:
            if lay is not None and key in kl.tv:
                tv = kl.tv[key]
                pat = analysis.pattern_from_tv(tv.layout, tv.tile, tv.vec, key, warp=None)
                for candidate in (lay, lay.unswizzled()):
                    kl.conflicts.append(analysis.bank_conflicts(candidate, pat, eb))
    # budget from the layouts; 'extra' is what the config's own accounting adds (barriers, alignment)
    bufs = {}
    for name in ("sQ", "sK", "sV"):
        if name in kl.smem:
            bufs[f"{name} {'x'.join(map(str, kl.smem[name].dims))}"] = kl.smem[name].cosize * eb
    if config.persistent and "sO" in kl.smem:  # persistent: sO is its own buffer
        bufs[f"sO {'x'.join(map(str, kl.smem['sO'].dims))} (persistent)"] = kl.smem["sO"].cosize * eb
    per_stage = sum(v for k, v in bufs.items() if k.startswith(("sK", "sV"))) // max(config.stages, 1)
    extra = config.smem_bytes(eb) - sum(bufs.values())  # (its accounting holds ptxas' 1 KiB of static smem too)
    kl.budget = analysis.SmemBudget(bufs, config.stages, per_stage, extra, rf.SMEM_CAPACITY,
                                    "static smem, barriers, align")
    return kl


# ---------------------------------------------------------------------------- ranker backward
def ranker_bwd_config(text: Optional[str] = None, cap_method: Optional[str] = None):
    """A ``RankerBwdConfig`` from ``"head_dim=64,tile_m=128"``: the shipped config of that head dim (D=128
    unless the text sets ``head_dim``) for ``cap_method`` (:func:`.ranker_bwd.config_for`: None or ``"none"``
    without a cap, ``"tanh"`` / ``"soft_sign"`` with one; a ``tile_m`` with the dQ form shipped for it,
    :func:`.ranker_bwd.tile_m_fields`) with the given fields replaced.  ``ValueError`` with the reason for a
    config that does not fit (see :func:`parse_config`) or an unknown ``cap_method``."""
    from ..kernels import ranker_bwd as rb

    capped = _check_cap_method(cap_method) != "none"
    fields = key_values(text, "config", {f.name for f in dataclasses.fields(rb.RankerBwdConfig)},
                        CONFIG_EXAMPLES["RankerBwdConfig"])
    head_dim, tile_m = (_parse_value(n, fields[n], 0) if n in fields else None for n in ("head_dim", "tile_m"))
    base = rb.config_for(128 if head_dim is None else head_dim, capped)
    implied = rb.tile_m_fields(base, tile_m) if tile_m is not None else {}  # its dQ form
    return parse_config(rb.RankerBwdConfig, text, base=base, **implied)


def _ranker_bwd_dsl_objects(rb, dt, config):
    """DSL side (inside trace): the mainloop's smem layouts and WGMMAs from the kernel module's own
    builders (what ``RankerAttentionBwd.__call__`` calls), the dS^T stmatrix copy the MMA warpgroups
    use, and TMA atoms made over the layouts as ``__call__`` makes them."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    smem = rb.smem_layouts(dt, config)
    sdp, dkv, dq = rb.tiled_mmas(dt, config)
    stsm = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
    ds_copy = cute.make_tiled_copy_C(stsm, sdp)
    types = {}
    for name, rows, cols, op, el in (
            ("sQ", config.tile_m, config.head_dim, cpasync.CopyBulkTensorTileG2SOp(), dt),
            ("sdO", config.tile_m, config.head_dim, cpasync.CopyBulkTensorTileG2SOp(), dt),
            ("sK", config.tile_n, config.head_dim, cpasync.CopyBulkTensorTileG2SOp(), dt),
            ("sV", config.tile_n, config.head_dim, cpasync.CopyBulkTensorTileG2SOp(), dt),
            ("sdQpart", cute.size(smem["sdQpart"], mode=[0]), cute.size(smem["sdQpart"], mode=[1]),
             cpasync.CopyReduceBulkTensorTileS2GOp(),
             cutlass.Float32)):
        lay = smem[name]
        if cute.rank(lay) == 3:
            lay = cute.select(lay, mode=[0, 1])
        ptr = cute.make_ptr(el, 0, cute.AddressSpace.gmem, assumed_align=16)
        g = cute.make_tensor(ptr, cute.make_layout((rows * 4, config.head_dim), stride=(config.head_dim, 1)))
        atom, _ = cpasync.make_tiled_tma_atom(op, g, lay, (rows, cols))
        types[name] = str(atom.type)
    out = {k: v for k, v in smem.items() if k in ("sQ", "sdO", "sK", "sV", "sdSt", "sdQ", "sdQpart")}
    for key, mma in (("S^T and dP^T accumulators", sdp), ("dK and dV accumulators", dkv), ("dQ accumulator", dq)):
        out["tv:" + key] = mma.tv_layout_C_tiled  # (over one tile of the tiled MMA: mma_tile, which the kernel
        out["mma_tile:" + key] = (int(mma.get_tile_size(0)), int(mma.get_tile_size(1)))  # repeats over its tile)
    out.update({"tma_types": types,
                "tv:dS^T stmatrix (dst)": ds_copy.layout_dst_tv_tiled,
                "ds_tile": tuple(int(cute.size(m)) for m in ds_copy.tiler_mn)})
    return out


def ranker_bwd_layouts(config=None, dtype="bf16", cap_method: Optional[str] = None) -> KernelLayouts:
    """The ranker backward mainloop's shared-memory layouts (Q/dO stages, resident K and V, dS^T
    buffers, the float32 dQ tile and one TMA reduce-add box of it), TMA boxes, the five GEMMs'
    accumulator thread-value layouts (S^T/dP^T, dK/dV, dQ or dQ^T with ``dq_swap_ab``), the bank
    conflicts of the MMA warpgroups' two shared-memory stores per q block (dS^T by stmatrix, the
    dQ accumulator's ``autovec_copy``: 8-byte stores of two neighbouring values, or 4-byte ones with
    ``dq_swap_ab``, whose neighbouring values of dQ^T are a column of sdQ; kernel layouts vs the same tiles
    unswizzled) and the smem budget (``config.smem_bytes()``).

    Args:
        config: a ``RankerBwdConfig``, a string such as ``"head_dim=64,tile_m=128"`` or None (the
            shipped D=128 config for ``cap_method``).
        dtype: "bf16"/"fp16" (or torch/cutlass dtype).
        cap_method: for a string or None, the cap whose shipped config fills the fields the string does not
            set (:func:`ranker_bwd_config`; None: no cap).
    """
    from ..kernels import ranker_bwd as rb

    config = _resolve_config(config, rb.RankerBwdConfig, lambda text: ranker_bwd_config(text, cap_method))
    dt = _ranker_dtype(dtype)
    eb = elem_bytes(dt)
    objs = trace(lambda: _ranker_bwd_dsl_objects(rb, dt, config))
    kl = KernelLayouts("ranker_bwd", config, dt.__name__, source="ranker_bwd.smem_layouts / tiled_mmas")
    for name in ("sQ", "sdO", "sK", "sV", "sdSt", "sdQ", "sdQpart"):
        kl.smem[name] = objs[name].named(f"{name} {objs[name].dims}")
    if config.split_head_dim:  # P^T's buffers, laid out as dS^T's
        kl.smem["sPt"] = objs["sdSt"].named(f"sPt {objs['sdSt'].dims}")
    kl.smem_elem_bytes.update(sdQ=4, sdQpart=4)
    for name in ("sQ", "sdO", "sK", "sV", "sdQpart"):
        kl.tma[name] = _tma_box_2d(kl.smem[name], "fp32" if name == "sdQpart" else dt)
        kl.tma[name].update(parse_tma_type(objs["tma_types"][name]))
    dq_tile = (config.head_dim, config.tile_m) if config.dq_swap_ab else (config.tile_m, config.head_dim)
    for key, tile, note in (("S^T and dP^T accumulators", (config.tile_n, config.tile_m), "keys x q rows"),
                            ("dK and dV accumulators", (config.tile_n, config.head_dim), "keys x head dim"),
                            ("dQ accumulator", dq_tile,
                             "dQ^T: head dim x q rows" if config.dq_swap_ab else "q rows x head dim")):
        mma_tile = objs["mma_tile:" + key]  # the tiled MMA's own tile, which the kernel repeats over the whole tile
        if mma_tile != tile:  # (D=64 with tile_m=128 and dq_split_rows=False: dQ's 64 x 64 MMA tile twice over M)
            note += f", one {mma_tile[0]} x {mma_tile[1]} MMA tile of the {tile[0]} x {tile[1]} tile"
        kl.tv[key] = TVLayout(objs["tv:" + key].named(key), mma_tile, 1, note)
    kl.tv["dS^T stmatrix (dst)"] = TVLayout(objs["tv:dS^T stmatrix (dst)"].named("dS^T stmatrix"), objs["ds_tile"],
                                           16 // eb)
    # dS^T (and P^T into sPt, laid out alike, with split_head_dim): stmatrix rows of 16 bytes into sdSt (stage 0); dQ:
    # autovec_copy merges an accumulator's two neighbouring values (consecutive head-dim columns of sdQ) into one
    # 8-byte store (the PTX's st.shared.v2.b32); with dq_swap_ab they are consecutive q rows, so one 4-byte store each
    tv = kl.tv["dS^T stmatrix (dst)"]
    pat = analysis.pattern_from_tv(tv.layout, tv.tile, tv.vec, "dS^T stmatrix stores (warp 0)")
    for lay in (kl.smem["sdSt"], kl.smem["sdSt"].unswizzled()):
        kl.conflicts.append(analysis.bank_conflicts(lay, pat, eb))
    tv = kl.tv["dQ accumulator"]
    dq_vec = 1 if config.dq_swap_ab else 2
    pat = analysis.pattern_from_tv(tv.layout, tv.tile, dq_vec, f"dQ accumulator stores (warp 0, {4 * dq_vec} B each)")
    if config.dq_swap_ab:  # the accumulator holds dQ^T: element (d, m) goes to sdQ[m, d]
        pat = analysis.AccessPattern(pat.name, pat.coords[..., ::-1].copy(), 1)
    for lay in (kl.smem["sdQ"], kl.smem["sdQ"].unswizzled()):
        kl.conflicts.append(analysis.bank_conflicts(lay, pat, 4))
    bufs = {}
    for name in ("sK", "sV", "sQ", "sdO", "sdSt", "sPt", "sdQ"):
        if name not in kl.smem:  # (sPt: split_head_dim only)
            continue
        lay = kl.smem[name]
        bufs[f"{name} {'x'.join(map(str, lay.dims))}"] = lay.cosize * kl.smem_elem_bytes.get(name, eb)
    bufs["sLSE + sdPsum"] = sum(size for name, size, _ in config.smem_members(eb) if name in ("sLSE", "sdPsum"))
    per_stage = sum(v for k, v in bufs.items() if k.startswith(("sQ", "sdO"))) // max(config.stages, 1)
    kl.budget = analysis.SmemBudget(bufs, config.stages, per_stage, config.smem_bytes(eb) - sum(bufs.values()),
                                    rb.SMEM_CAPACITY - rb.STATIC_SMEM_BYTES)  # what validate() allows
    return kl


def hc_mix_tma_config(text: Optional[str] = None):
    """An ``HcMixTmaConfig`` from ``"stages=4,tile_m=256"`` (``tree`` as ``4x2x2``): the defaults
    (whose smem rings every shipped config shares: 128-row tiles, 6 stages) with the given fields
    replaced.  ``ValueError`` with the reason for a config that does not fit (see :func:`parse_config`)."""
    from ..kernels import hc_mix_tma

    return parse_config(hc_mix_tma.HcMixTmaConfig, text)


def _hc_mix_tma_dsl_objects(tma, config):
    """DSL side (inside trace): the walk's smem rings and WGMMA from the kernel module's own builders
    (``hc_mix_tma.smem_layouts`` / ``make_tiled_mma``, what ``HcMixTmaKernel.__call__`` calls), and TMA
    atoms made over them as ``__call__`` makes them."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import cpasync

    smem = dict(zip(("sX", "sW", "sWf"), tma.smem_layouts(config)))
    mma = tma.make_tiled_mma()
    types = {}
    for name, rows, dtype in (("sX", config.tile_m, cutlass.BFloat16), ("sWf", tma.N_MIX, cutlass.Float32)):
        ptr = cute.make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=16)
        g = cute.make_tensor(ptr, cute.make_layout((rows * 4, config.tile_k * 4), stride=(config.tile_k * 4, 1)))
        atom, _ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), g,
                                              cute.select(smem[name], mode=[0, 1]), (rows, config.tile_k))
        types[name] = str(atom.type)
    return dict(**smem, tma_types=types, acc=mma.tv_layout_C_tiled)


def hc_mix_tma_layouts(config=None) -> KernelLayouts:
    """The hc_mix TMA walk's smem rings (x tile and hc_fn pieces, 128B-swizzled K-major; the float32 hc_fn
    tiles, unswizzled), the TMA boxes (x, float32 hc_fn), the WGMMA accumulator's thread-value layout, the
    bank conflicts of the squares' 16-byte smem reads and of the split warps' 16-byte piece stores (kernel
    layout vs the same ring unswizzled) and the smem budget.

    Args:
        config: an ``HcMixTmaConfig``, a string such as ``"stages=4,tile_m=256"`` or None (the
            defaults: the smem rings of every shipped config).
    """
    import numpy as np

    from ..kernels import hc_mix_tma as tma

    config = _resolve_config(config, tma.HcMixTmaConfig, hc_mix_tma_config)
    objs = trace(lambda: _hc_mix_tma_dsl_objects(tma, config))
    kl = KernelLayouts("hc_mix_tma", config, "BFloat16", source="hc_mix_tma.smem_layouts")
    for name in ("sX", "sW", "sWf"):
        kl.smem[name] = objs[name].named(f"{name} {objs[name].dims}")
    for name, dtype in (("sX", "bf16"), ("sWf", "fp32")):
        kl.tma[name] = _tma_box_2d(kl.smem[name], dtype)
        kl.tma[name].update(parse_tma_type(objs["tma_types"][name]))
    kl.tv["WGMMA accumulator (x times pieces^T)"] = TVLayout(objs["acc"].named("accumulator"), (128, tma.N_W), 1,
                                                         "per m64 atom of each consumer warpgroup")
    # the squares (HcMixTmaKernel.squares): thread 2 r + h of a warp reads row r, half h, 16 bytes at a time
    t = np.arange(32)
    halves = config.tile_k // 16  # 16-byte vectors per half row
    reads = analysis.AccessPattern("squares: 16-byte reads of half a row per thread", np.array(
        [np.stack([t // 2, 8 * ((t % 2) * halves + v)], -1) for v in range(halves)]), vec=8)
    for lay in (kl.smem["sX"], kl.smem["sX"].unswizzled()):
        kl.conflicts.append(analysis.bank_conflicts(lay, reads, 2))
    # the split warps' piece stores (HcMixTmaKernel.split): lane l of a warp writes 8 columns (chunk l % 8)
    # of row l // 8 of one piece
    stores = analysis.AccessPattern("split: 16-byte piece stores, 8 lanes per row", np.array(
        [np.stack([t // 8, 8 * (t % 8)], -1)]), vec=8)
    for lay in (kl.smem["sW"], kl.smem["sW"].unswizzled()):
        kl.conflicts.append(analysis.bank_conflicts(lay, stores, 2))
    bufs = {f"{k} {'x'.join(map(str, v.dims))}": v.cosize * (4 if k == "sWf" else 2) for k, v in kl.smem.items()}
    kl.budget = analysis.SmemBudget(bufs, config.stages, sum(bufs.values()) // config.stages,
                                    config.smem_bytes() - sum(bufs.values()), tma.SMEM_LIMIT)
    return kl


def ranker_run_config(config, dtype="bf16", cap_method: str = "none"):
    """``config`` as :func:`~cute_kernels.ranker_attention` runs it for ``dtype`` and ``cap_method``: a fixed max the
    call cannot take (``checked_max`` with a cap or float16, ``fixed_row_max`` without a cap or with float16) is
    dropped as the op drops it (:func:`~cute_kernels.kernels.ranker_fwd.chosen_config`; a capped call taken with a
    cap of ``FIXED_MAX_CAP``).  ``TypeError`` for a ``config`` that is not a ``RankerFwdConfig``, ``ValueError``
    for a ``dtype`` other than bf16 / fp16 or an unknown ``cap_method``."""
    from ..kernels import ranker_fwd as rf

    if not isinstance(config, rf.RankerFwdConfig):
        raise TypeError(f"config must be a RankerFwdConfig, got {type(config).__name__}")
    capped = _check_cap_method(cap_method) != "none"
    return rf.chosen_config(config, _ranker_torch_dtype(dtype), rf.FIXED_MAX_CAP if capped else None)


def _ranker_torch_dtype(dtype):
    """The torch dtype of a ranker kernel's ``dtype`` argument (:func:`_ranker_dtype`'s rule)."""
    import torch

    return torch.float16 if _ranker_dtype(dtype).__name__ == "Float16" else torch.bfloat16


def ranker_compile_record(config, dtype="bf16", qhead_per_kvhead: int = 1, cap_method: Optional[str] = None,
                          varlen: bool = False):
    """Compile (CPU, sm_90a) the ranker forward with ``config`` as :func:`~cute_kernels.ranker_attention` runs it
    for ``dtype`` and ``cap_method`` (:func:`ranker_run_config`) and return its compile record (``.resources``
    registers, ``.ptx_features``, ``.sass_features``).  ``cap_method`` None: ``"tanh"`` for a
    ``fixed_row_max`` config (it runs capped calls only), else ``"none"``.  ``qhead_per_kvhead``: the GQA ratio
    compiled in (an int >= 1); ``varlen``: a bool.  Raises ``TypeError`` / ``ValueError`` for arguments of another
    type or range (:func:`ranker_run_config`'s too)."""
    from ..kernels import ranker_fwd as rf
    from ..runtime.cache import compile_record
    from ..runtime.validate import check_int

    if not isinstance(config, rf.RankerFwdConfig):
        raise TypeError(f"config must be a RankerFwdConfig, got {type(config).__name__}")
    qhead_per_kvhead = check_int("qhead_per_kvhead", qhead_per_kvhead)
    if not isinstance(varlen, bool):
        raise TypeError(f"varlen must be a bool, got {type(varlen).__name__}")
    if cap_method is None:
        cap_method = "tanh" if config.fixed_row_max else "none"
    config = ranker_run_config(config, dtype, cap_method)
    tdt = _ranker_torch_dtype(dtype)
    rf._compile(tdt, config, qhead_per_kvhead, cap_method, varlen)
    return compile_record(rf.NAME, (str(tdt), config, qhead_per_kvhead, cap_method, varlen))


# ---------------------------------------------------------------------------- report
def format_report(kl: KernelLayouts, record=None) -> str:
    """The text report of :func:`write_report`."""
    lines = [f"kernel {kl.kernel}  dtype {kl.dtype}", f"config {kl.config}"]
    if kl.kernel == "ranker_fwd" and kl.config.self_kv_tma:
        from ..kernels import ranker_fwd as rf

        if not rf.self_kv_tma_taken(kl.config):  # (the kernel's rule: it reads the self term from global memory)
            lines.append(f"  self_kv_tma{' and prefetch_self_kv' if kl.config.prefetch_self_kv else ''} not taken: "
                         f"the self term's K/V stage needs tile_m == tile_n (here {kl.config.tile_m} and "
                         f"{kl.config.tile_n}) and head_dim <= 128; the kernel reads q_i, k_i, v_i from global memory")
    lines += [f"smem layouts from {kl.source}", ""]
    lines.append("shared-memory layouts (swizzle o offset o shape:stride, elements; swizzle acts on byte addresses):")
    w = max([4, *map(len, [*kl.smem, *kl.tma])])  # (names such as sdQpart line up too)
    for k, v in kl.smem.items():
        sw = v.swizzle.byte_swizzle_name if v.swizzle is not None else "none"
        lines.append(f"  {k:<{w}} dims {str(v.dims):<16} {sw:>5} swizzle  {v}")
        if k == "sO" and kl.kernel == "ranker_fwd" and not kl.config.persistent:
            lines.append(f"  {'':<{w}} (one tile per CTA: sO reuses sQ's memory, written once the tile's GEMMs "
                         "are done with Q; the budget counts it once)")
    lines.append("")
    lines.append("TMA boxes:")
    for k, b in kl.tma.items():
        box = b.get("dsl_box", b["box"])
        src = "DSL atom" if "dsl_box" in b else "from the layout"
        lines.append(f"  {k:<{w}} tile {b['rows']}x{b['cols']}: box {box[0]}x{box[1]} ({src}), "
                     f"{b['bytes'] // max(b.get('dsl_box_bytes', b['bytes'] // b['boxes']), 1)} box(es) per tile, "
                     f"{b['swizzle']} swizzle, {b['bytes']} B per tile")
    lines.append("")
    lines.append("thread-value layouts ((thread, value) -> column-major tile index):")
    for k, tv in kl.tv.items():
        note = f" ({tv.note})" if tv.note else ""
        lines.append(f"  {k:<36} tile {tv.tile[0]}x{tv.tile[1]}{note}  {tv.layout}")
    lines.append("")
    lines.append("bank conflicts (32 banks x 4 B; 16-byte accesses served per quarter-warp):")
    for rep in kl.conflicts:
        lines.append(f"  {rep}")
    lines.append("")
    if kl.budget is not None:
        lines.append("shared memory budget:")
        lines.append(str(kl.budget))
    if record is not None:
        lines.append("")
        lines.append("compile record (sm_90a):")
        for r in record.resources:
            spill = (f"stack {r.stack_bytes} B: REGISTER SPILLS (local memory)" if r.stack_bytes
                     else "stack 0 B (no spills)")
            lines.append(f"  {r.name[:70]}: {r.registers} registers/thread at launch (a kernel with setmaxnreg "
                         f"redistributes them per warpgroup), static smem {r.static_smem_bytes} B, {spill}")
        lines.append(f"  PTX features: {', '.join(record.ptx_features)}")
        if record.sass_features:
            lines.append(f"  SASS features: {', '.join(record.sass_features)}")
    return "\n".join(lines) + "\n"


def draw_all(kl: KernelLayouts, out_dir: str) -> list[str]:
    """Write the pictures of ``kl`` (PNG + SVG each) into ``out_dir``; returns the files."""
    import cutlass

    files = []
    for k, lay in kl.smem.items():
        if k == "sO" and "sQ" in kl.smem and kl.smem["sQ"].shape == lay.shape:
            continue  # the same layout as sQ (and with one tile per CTA the same buffer)
        eb = kl.smem_elem_bytes.get(k, getattr(cutlass, kl.dtype).width // 8)  # (kl.dtype: a cutlass type's name)
        fig = viz.draw_offsets(lay, elem_bytes=eb, stage=0, title=f"{kl.kernel} {k}: element offsets (stage 0)\n{lay}")
        files += viz.save(fig, os.path.join(out_dir, f"{k}_offsets"))
        fig = viz.draw_offsets(lay, elem_bytes=eb, stage=0, region=(16, 32),
                               title=f"{kl.kernel} {k}: element offsets, rows 0-15, columns 0-31 (stage 0)")
        files += viz.save(fig, os.path.join(out_dir, f"{k}_offsets_zoom"))
        fig = viz.draw_banks(lay, eb, stage=0, rows=min(lay.dims[0], 16),
                             title=f"{kl.kernel} {k}: banks of the first rows (pattern repeats every 8 rows)")
        files += viz.save(fig, os.path.join(out_dir, f"{k}_banks"))
    for k, tv in kl.tv.items():
        stem = "tv_" + "_".join(w for w in k.replace("=", "_").replace("^", "").replace("(", "").replace(")", "")
                                .split(" ") if w)
        fig = viz.draw_tv(tv.layout, tv.tile, title=f"{kl.kernel} {k}: threads over the {tv.tile[0]}x{tv.tile[1]} tile")
        files += viz.save(fig, os.path.join(out_dir, stem))
        fig = viz.draw_tv(tv.layout, tv.tile, region=(16, 16),
                          title=f"{kl.kernel} {k}: rows 0-15, columns 0-15 (T = thread, V = value)")
        files += viz.save(fig, os.path.join(out_dir, stem + "_zoom"))
    return files


def write_report(kernel: str, config: Optional[str], out_dir: str, dtype: Optional[str] = None,
                 compile: bool = False, cap_method: Optional[str] = None) -> tuple[str, list[str]]:
    """``cute-kernels layouts``: pictures + ``report.txt`` for ``kernel`` and ``config`` into ``out_dir``.

    ranker_fwd: everything of :func:`ranker_fwd_layouts`; ranker_bwd: :func:`ranker_bwd_layouts` (the
    mainloop); hc_mix: :func:`hc_mix_tma_layouts` (the default ``method="tma"`` kernel).  Other kernels (no smem
    layouts exposed): their shipped compile targets, compiled when ``compile`` is set, with registers and features.
    Returns (report text, files written).  Raises ``ValueError`` for a config the kernel rejects, for ``config`` given
    to another kernel (they take none), and for an ``out_dir`` that exists and is not a folder; nothing
    is written then.  ``dtype``: ``"bf16"`` (None) or ``"fp16"`` for ranker_fwd / ranker_bwd (hc_mix: bf16
    only); the other kernels list every compile target, of every dtype, and refuse one (``ValueError``).
    ``cap_method`` (ranker_fwd / ranker_bwd): ``"none"``, ``"tanh"`` or ``"soft_sign"``: the config's fields
    that ``config`` does not set come from the config shipped for that cap (:func:`ranker_config`,
    :func:`ranker_bwd_config`; None: the uncapped one), and with ``compile`` the variant compiled (None: no cap,
    or tanh for a forward ``fixed_row_max`` config), fixed length and MHA; the forward's config as the op runs it
    for that variant (:func:`ranker_run_config`), said in the report where it differs.
    """
    if not out_dir:
        raise ValueError("--out: give a folder to write the pictures and report.txt into")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} exists and is not a folder")
    if cap_method is not None and kernel not in ("ranker_fwd", "ranker_bwd"):
        raise ValueError("--cap picks the shipped config and the compiled variant of ranker_fwd / ranker_bwd only")
    if cap_method is not None:
        _check_cap_method(cap_method)
    files: list[str] = []
    variant = None  # (the rankers, compiled: what the report says of the variant compiled)
    if kernel in ("ranker_fwd", "ranker_bwd", "hc_mix"):
        dtype = dtype or "bf16"
        if kernel == "ranker_fwd":
            kl = ranker_fwd_layouts(config, dtype, cap_method)  # validates before anything is written
            rec = None
            if compile:
                capm = cap_method or ("tanh" if kl.config.fixed_row_max else "none")
                variant = f"  (the variant compiled: cap {capm}, fixed length, MHA; --cap picks another cap)\n"
                if ranker_run_config(kl.config, dtype, capm) != kl.config:
                    variant += (f"  (cap {capm}, {dtype}: the op runs this config with the online max, "
                                "fixed_row_max=False, checked_max=False: that is what was compiled)\n")
                rec = ranker_compile_record(kl.config, dtype, cap_method=capm)
        elif kernel == "ranker_bwd":
            kl = ranker_bwd_layouts(config, dtype, cap_method)  # validates before anything is written
            rec = None
            if compile:
                import torch

                from ..kernels import ranker_bwd as rb
                from ..runtime.cache import compile_record

                tdt = {"BFloat16": torch.bfloat16, "Float16": torch.float16}[kl.dtype]
                args = rb.launch_args(tdt, kl.config, 1, cap_method or "none", False)["main"]
                rb._compile(*args)
                rec = compile_record(rb.NAME, (str(tdt), *args[1:]))
                variant = (f"  (the variant compiled: cap {cap_method or 'none'}, fixed length, MHA; --cap picks "
                           "another cap)\n")
        else:
            try:
                hc_dt = cutlass_dtype(dtype)
            except TypeError as exc:  # (an unknown dtype: a bad value of this argument, as the rankers' ValueError)
                raise ValueError(f"--dtype {dtype}: hc_mix takes bf16 x only ({exc})") from None
            if hc_dt.__name__ != "BFloat16":
                raise ValueError(f"--dtype {dtype}: hc_mix takes bf16 x only")
            kl = hc_mix_tma_layouts(config)
            rec = None
            if compile:
                from ..kernels import hc_mix_tma
                from ..runtime.cache import compile_record

                hc_mix_tma._compile(kl.config)
                rec = compile_record(hc_mix_tma.NAME, kl.config)
        text = format_report(kl, rec) + (variant or "")
        if rec is not None and kernel == "hc_mix":
            text += (f"  (the TMA kernel's count is its launch budget; setmaxnreg then gives the producer warpgroup "
                     f"{kl.config.producer_regs} and the consumers {kl.config.consumer_registers} registers)\n")
        os.makedirs(out_dir, exist_ok=True)
        files += draw_all(kl, out_dir)
    else:
        from .. import registry
        from ..runtime.cache import compile_record

        mod = registry.module(kernel)
        if config:
            raise ValueError(f"--config applies to ranker_fwd, ranker_bwd and hc_mix only: {kernel} exposes no "
                             f"smem layouts to draw (its shipped configs: `cute-kernels configs --kernel {kernel}`)")
        if dtype is not None:
            raise ValueError(f"--dtype applies to ranker_fwd, ranker_bwd and hc_mix only: {kernel} lists its compile "
                             "targets of every dtype")
        lines = [f"kernel {kernel}: no shared-memory layouts exposed to cute_kernels.layouts;",
                 "shipped compile targets:"]
        for t in mod.compile_targets():
            lines.append(f"  {t.label}")
            if compile:
                t.build()
                rec = compile_record(t.kernel, t.key)
                for r in rec.resources:
                    lines.append(f"    {r.name[:60]}: {r.registers} registers, static smem {r.static_smem_bytes} B")
                lines.append(f"    PTX features: {', '.join(rec.ptx_features)}")
        text = "\n".join(lines) + "\n"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "report.txt")
    names = sorted(os.path.basename(f) for f in files)
    if names:  # which pictures are this report's, in a folder that may hold older ones
        text += "pictures of this report:\n" + "".join(f"  {n}\n" for n in names)
    with open(path, "w") as f:
        f.write(text)
    return text, files + [path]


def older_pictures(out_dir: str, files: list[str]) -> list[str]:
    """The picture files (``.png``, ``.svg``, ``.pdf``) in ``out_dir`` that ``files`` (what a
    :func:`write_report` call wrote) does not name: left there by an earlier run, e.g. of another
    kernel or config, and not described by the new ``report.txt``.  Nothing is deleted."""
    ours = {os.path.basename(f) for f in files}
    return sorted(n for n in os.listdir(out_dir)
                  if n not in ours and os.path.splitext(n)[1].lower() in (".png", ".svg", ".pdf"))
