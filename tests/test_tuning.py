"""CPU tests of cute_kernels.tuning: shipped configs, the configs/tune CLI, candidate enumeration,
the tuned-config cache (tuned.json) and the ranker forward's config selection."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from cute_kernels import registry, tuning
from cute_kernels.kernels import ranker_fwd as rf
from cute_kernels.runtime.cache import source_fingerprint
from cute_kernels.runtime.validate import ValidatedConfig
from ranker_fwd_stand_in import stand_in_forward  # (tests/ is on sys.path)

GPU = "Fake GPU 141GB"  # any name: the GPU of an entry is part of its key, nothing is launched


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cute_kernels", *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty compile cache root (tuned.json lives there); tuned configs enabled."""
    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUTE_KERNELS_TUNED", raising=False)
    tuning.reload()
    yield tmp_path
    tuning.reload()


# ---------------------------------------------------------------------------- shipped configs
def test_shipped_configs_lists_every_kernel():
    table = tuning.shipped_configs()
    assert set(table) == set(registry.names())
    for name, configs in table.items():
        assert configs, name
    # every head dim and cap, each dtype's config (one label where both dtypes run the same one)
    want = {}
    for label, d, m in [*((f"head_dim={d}", d, "none") for d in rf.CONFIGS),
                        *((f"head_dim={d} {m} cap", d, m) for m, d in rf.CAP_CONFIGS)]:
        bf16, fp16 = rf.shipped_config(torch.bfloat16, d, m), rf.shipped_config(torch.float16, d, m)
        want.update({label: bf16} if bf16 == fp16 else {f"{label} bfloat16": bf16, f"{label} float16": fp16})
    assert table["ranker_fwd"] == want
    assert table["ranker_fwd"]["head_dim=128 float16"].checked_max is False  # (the fixed max is bf16's)
    from cute_kernels.kernels import hc_mix_tma, hc_mix_walk

    assert list(table["hc_mix"].values()) == [*hc_mix_walk.SHIPPED, *(hc_mix_tma.config_for(m)  # both methods
                                                                 for m in hc_mix_tma.LEVEL_EXAMPLE_M)]
    assert [c.cta_level for c in list(table["hc_mix"].values())[3:]] == [5, 4, 3, 2, 1, 0]
    for name in ("ranker_fwd", "hc_mix", "qknorm", "qknorm_tp", "scale"):  # frozen configs that validate
        for cfg in table[name].values():
            cfg.validate()


def test_shipped_configs_one_kernel_and_public_name():
    import cute_kernels

    assert cute_kernels.shipped_configs("ranker_fwd") == {"ranker_fwd": tuning.shipped_configs()["ranker_fwd"]}
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        tuning.shipped_configs("nope")
    with pytest.raises(TypeError, match="kernel must be"):
        tuning.shipped_configs(3)


def test_configs_cli():
    r = _run("configs")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in registry.names():
        assert f"{name}:" in r.stdout
    assert "head_dim=128" in r.stdout and "smem" in r.stdout
    bulk = [line for line in r.stdout.splitlines() if "bfloat16 q=4096 k=1024 bulk=" in line]
    assert len(bulk) == 1 and "[smem 61440 B of staged rows" in bulk[0]  # 6 stages x 10 KB rows
    r = _run("configs", "--kernel", "nope")
    assert r.returncode == 2 and "unknown kernel" in r.stderr


# ---------------------------------------------------------------------------- candidates
def test_candidates_start_from_the_shipped_config_of_the_cap():
    """The tanh cap at D=128 ships three warpgroups (CAP_CONFIGS); float16 and bfloat16 share tile shapes
    (float16 without the fixed-max options: shipped_config)."""
    import torch

    shape = tuning.TUNERS["ranker_fwd"].parse_shape("B=2,S=1024,H=4,D=64")
    for dtype in (torch.float16, torch.bfloat16):
        assert tuning.candidate_configs("ranker_fwd", shape, dtype=dtype)[0][0] == rf.shipped_config(dtype, 64)
    shape = tuning.TUNERS["ranker_fwd"].parse_shape("B=2,S=1024,H=4,D=128,cap=30")
    assert tuning.candidate_configs("ranker_fwd", shape)[0][0] == rf.CAP_CONFIGS[("tanh", 128)] != rf.CONFIGS[128]


@pytest.mark.parametrize("d", sorted(rf.CONFIGS))
def test_candidates_are_validated(d):
    shape = tuning.TUNERS["ranker_fwd"].parse_shape(f"B=2,S=1024,H=4,D={d}")
    accepted, rejected = tuning.candidate_configs("ranker_fwd", shape)
    assert accepted[0] == rf.CONFIGS[d]  # the shipped config comes first (the reference)
    assert len(set(accepted)) == len(accepted) > 1
    for cfg in accepted:
        cfg.validate()  # raises if not accepted
        assert cfg.head_dim == d
    for fields, why in rejected:  # (a rejected candidate never exists as a config: its fields and the reason)
        with pytest.raises(ValueError):
            dataclasses.replace(accepted[0], **fields)
        assert why
    assert {c.persistent for c in accepted} <= {True, False}


def test_candidates_from_the_command_line():
    shape = tuning.TUNERS["ranker_fwd"].parse_shape("B=4,S=4608,H=16,D=128")
    accepted, rejected = tuning.candidate_configs("ranker_fwd", shape, "tile_n=176,160,stages=2,persistent=false")
    assert {c.tile_n for c in accepted[1:]} == {160, 176} and all(not c.persistent for c in accepted[1:])
    assert all(not c.intra_wg_overlap for c in accepted[1:] if c.tile_n == 176)  # without it P reuses S's registers
    assert rejected and all(c["tile_n"] == 176 and c["intra_wg_overlap"] and "accumulator registers" in why
                            for c, why in rejected)
    with pytest.raises(ValueError, match="unknown"):
        tuning.parse_candidates("tile_k=64", rf.CONFIGS[128])
    with pytest.raises(ValueError, match="true or false"):
        tuning.parse_candidates("persistent=maybe", rf.CONFIGS[128])
    assert tuning.parse_candidates("tile_n=96,128, stages=3", rf.CONFIGS[128]) == dict(tile_n=[96, 128], stages=[3])
    from cute_kernels.kernels import ranker_bwd as rb  # a field that is None or an int (walk_stagger)

    assert tuning.parse_candidates("walk_stagger=none,0,2", rb.CONFIGS[128]) == dict(walk_stagger=[None, 0, 2])
    with pytest.raises(ValueError, match="an integer or none"):
        tuning.parse_candidates("walk_stagger=true", rb.CONFIGS[128])
    for text in ("tile_n=96,,128", "tile_n=96,", ",tile_n=96"):  # an empty item: a value may have been lost
        with pytest.raises(ValueError, match="empty item"):
            tuning.parse_candidates(text, rf.CONFIGS[128])
    with pytest.raises(ValueError, match="'tile_N' unknown"):  # a typo is not "every candidate rejected"
        tuning.candidate_configs("ranker_fwd", shape, "tile_N=96")
    with pytest.raises(ValueError, match="'tile_n' given twice"):
        tuning.parse_candidates("tile_n=96,tile_n=128", rf.CONFIGS[128])


@pytest.mark.parametrize("text,msg", [
    ("B=4,S=4608,D=128", "needs H"),
    ("B=4,S=4608,H=16,D=96", "D=96 unsupported"),
    ("B=4,S=4608,H=16,Hkv=3,D=128", "multiple of Hkv"),
    ("B=4,S=100,H=16,D=128,hist=90,cand=20", "fit in S=100"),
    ("B=4,S=4608,H=16,D=128,tile=3", "unknown"),
    ("B=x,S=4608,H=16,D=128", "not a valid value"),
    ("B=4,S=4608,H=16,D=128,cap_method=soft_sign", "without cap"),
])
def test_tune_shape_errors(text, msg):
    with pytest.raises(ValueError, match=msg):
        tuning.TUNERS["ranker_fwd"].parse_shape(text)


def test_tune_shape_defaults_and_key():
    t = tuning.TUNERS["ranker_fwd"]
    s = t.parse_shape("B=4,S=4608,H=16,D=128")
    assert (s["Hkv"], s["hist"], s["cand"], s["cap"]) == (16, 4096, 512, None)
    assert t.shape_key(s) == "B=4,S=4608,Hq=16,Hkv=16,D=128,cap=none"
    assert t.shape_key(t.parse_shape("B=4,S=4608,H=16,Hkv=4,D=128,cap=50")) == "B=4,S=4608,Hq=16,Hkv=4,D=128,cap=tanh"


def test_tune_cli_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    r = _run("tune", "--kernel", "ranker_fwd", "--shape", "B=1,S=256,H=2,D=128")
    assert r.returncode == 2 and "tune needs a CUDA GPU" in r.stderr, r.stdout + r.stderr
    r = _run("tune", "--kernel", "ranker_fwd", "--shape", "B=1,S=256,H=2,D=128", "--list",
             "--candidates", "tile_n=96,128")
    assert r.returncode == 0, r.stderr
    assert "shipped" in r.stdout and "tile_n=96" in r.stdout and "min or more to compile" not in r.stderr
    # many candidates: a note on the compile time they will take
    r = _run("tune", "--kernel", "ranker_fwd", "--shape", "B=1,S=256,H=2,D=128", "--list",
             "--candidates", "tile_n=64,80,96,112,128,stages=1,2,3,persistent=true,false,intra_wg_overlap=true,false")
    assert r.returncode == 0 and "min or more to compile" in r.stderr, r.stdout + r.stderr
    # every candidate rejected by validate(): listed with the reasons, and exit 2 (nothing to tune)
    r = _run("tune", "--kernel", "ranker_fwd", "--shape", "B=1,S=256,H=2,D=128", "--list", "--candidates", "tile_n=97")
    assert r.returncode == 2 and "rejected every one" in r.stderr and "rejected tile_n=97" in r.stdout, r.stdout + r.stderr
    assert "rejected tile_n=97: must be a multiple of 16" in r.stdout, r.stdout  # (said "tile_n=97: tile_n=97: ...")
    r = _run("tune", "--kernel", "qknorm", "--shape", "N=4")
    assert r.returncode == 2 and "no tuner" in r.stderr
    r = _run("tune", "--kernel", "ranker_fwd", "--shape", "B=1,S=256,D=128")
    assert r.returncode == 2 and "needs H" in r.stderr


# ---------------------------------------------------------------------------- tuned cache
def _tuned_cfg():
    return rf.RankerFwdConfig(head_dim=128, tile_n=96, stages=3, persistent=False)


KEY = rf.tuned_shape_key(4, 4608, 16, 16, 128, "none")


def test_store_and_lookup(cache):
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None  # no file yet
    path = tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU, time_us=1.0, shipped_time_us=2.0)
    assert path == cache / "tuned.json"
    assert not [p for p in cache.iterdir() if p.name.endswith(".partial")]  # the temporary file was renamed
    fields = tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU)
    assert rf.RankerFwdConfig(**fields) == _tuned_cfg()
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu="Other GPU") is None
    assert tuning.lookup("ranker_fwd", torch.float16, KEY, gpu=GPU) is None
    assert tuning.lookup("ranker_fwd", "bfloat16", KEY, gpu=GPU) == fields  # dtype given by name
    data = json.loads(path.read_text())
    (key, entry), = data["entries"].items()
    fp = source_fingerprint()
    assert GPU in key and fp in key and entry["fingerprint"] == fp and entry["gpu"] == GPU
    assert entry["shape"] == KEY and entry["time_us"] == 1.0
    # a second entry keeps the first
    tuning.store("ranker_fwd", torch.bfloat16, KEY, rf.CONFIGS[128], "Other GPU")
    assert len(json.loads(path.read_text())["entries"]) == 2
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) == fields


def test_entry_of_other_sources_is_not_used(cache):
    tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU)
    path = cache / "tuned.json"
    data = json.loads(path.read_text())
    data["entries"] = {k.replace(source_fingerprint(), "0" * 16): dict(e, fingerprint="0" * 16)
                       for k, e in data["entries"].items()}
    path.write_text(json.dumps(data))
    tuning.reload()
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None


_LOOKUP = ("import json, torch; from cute_kernels import tuning; "
           "print(json.dumps(tuning.lookup('ranker_fwd', torch.bfloat16, {key!r}, gpu={gpu!r})))")


def _lookup_in_fresh_process(cache, **env):
    r = subprocess.run([sys.executable, "-c", _LOOKUP.format(key=KEY, gpu=GPU)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache), **env))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_round_trip_in_a_fresh_process(cache):
    tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU)
    fields, _ = _lookup_in_fresh_process(cache)
    assert rf.RankerFwdConfig(**fields) == _tuned_cfg()
    fields, _ = _lookup_in_fresh_process(cache, CUTE_KERNELS_TUNED="0")
    assert fields is None


def test_corrupt_file_is_ignored_with_a_warning(cache):
    path = cache / "tuned.json"
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None
    fields, err = _lookup_in_fresh_process(cache)
    assert fields is None and "corrupt" in err
    path.write_text(json.dumps({"version": 1, "entries": [1, 2]}))
    tuning.reload()
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None
    with pytest.warns(RuntimeWarning, match="corrupt"):  # the tuner rewrites a corrupt file
        tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU)
    assert rf.RankerFwdConfig(**tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU)) == _tuned_cfg()


def test_disabled_by_environment(cache, monkeypatch):
    tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU)
    monkeypatch.setenv("CUTE_KERNELS_TUNED", "0")
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None
    assert rf.config_for_shape(torch.bfloat16, 4, 4608, 16, 16, 128, "none", gpu=GPU) == rf.CONFIGS[128]


# ---------------------------------------------------------------------------- ranker selection
def test_ranker_selects_the_tuned_config(cache):
    base = dict(dtype=torch.bfloat16, nb=4, seq=4608, hq=16, hkv=16, d=128, cap_method="none", gpu=GPU)
    sel = lambda **kw: rf.config_for_shape(**{**base, **kw})  # noqa: E731
    assert sel() == rf.CONFIGS[128]
    tuning.store("ranker_fwd", torch.bfloat16, KEY, _tuned_cfg(), GPU)
    assert sel() == _tuned_cfg()
    assert sel(seq=4609) == rf.CONFIGS[128]  # another shape
    assert sel(cap_method="tanh") == rf.CAP_CONFIGS[("tanh", 128)]  # another shape key: the shipped tanh config
    assert sel(dtype=torch.float16) == rf.shipped_config(torch.float16, 128)  # (no checked_max)
    assert sel(gpu="Other GPU") == rf.CONFIGS[128]
    assert sel(varlen=True) == rf.CONFIGS[128]  # packed calls: shipped
    assert sel(device=torch.device("cpu"), gpu=None) == rf.CONFIGS[128]  # not a CUDA device: nothing tuned


def test_ranker_tuned_key_tells_caps_above_the_fixed_max_apart(cache):
    """A cap above FIXED_MAX_CAP runs the online max (another kernel than a cap <= 50, which takes the
    fixed max): its tuned configs live under their own key, ``cap=tanh>50``."""
    assert rf.tuned_shape_key(4, 4608, 16, 16, 128, "tanh", 50.0) == rf.tuned_shape_key(4, 4608, 16, 16, 128, "tanh")
    assert rf.tuned_shape_key(4, 4608, 16, 16, 128, "tanh", 50.5).endswith(",cap=tanh>50")
    assert rf.tuned_shape_key(4, 4608, 16, 16, 128, "none", 80.0).endswith(",cap=none")
    tuner = tuning.TUNERS["ranker_fwd"]
    assert tuner.shape_key(tuner.parse_shape("B=4,S=4608,H=16,D=128,cap=80")).endswith(",cap=tanh>50")
    assert tuner.shape_key(tuner.parse_shape("B=4,S=4608,H=16,D=128,cap=30")).endswith(",cap=tanh")
    tuned = dataclasses.replace(rf.CAP_CONFIGS[("tanh", 128)], stages=3)
    tuning.store("ranker_fwd", torch.bfloat16, rf.tuned_shape_key(4, 4608, 16, 16, 128, "tanh", 80.0), tuned, GPU)
    sel = lambda cap: rf.config_for_shape(torch.bfloat16, 4, 4608, 16, 16, 128, "tanh", gpu=GPU, cap=cap)  # noqa: E731
    assert sel(80.0) == tuned and sel(30.0) == rf.CAP_CONFIGS[("tanh", 128)]


def test_ranker_rejects_an_unusable_tuned_config(cache):
    """Hand-edited entries that cannot run this call fall back to the shipped config with a warning that
    names the reason; ``cute-kernels configs`` marks them (session 37 review)."""
    full = dataclasses.asdict(rf.CONFIGS[128])
    for fields, why in ((dict(full, tile_n=176), "accumulator registers"),  # does not fit
                        (dataclasses.asdict(rf.CONFIGS[64]), "head_dim=64, the call's is 128"),  # another head dim
                        (dict(full, tile_q=3), "tile_q"),  # unknown field
                        (dict(tile_n=96), "missing fields"),  # partial: not filled from the class defaults
                        (None, "not an object")):
        tuning.store("ranker_fwd", torch.bfloat16, KEY, {} if fields is None else fields, GPU)
        if fields is None:  # (store takes a dict; write the entry's config as JSON null by hand)
            data = json.loads(tuning.tuned_path().read_text())
            next(iter(data["entries"].values()))["config"] = None
            tuning.tuned_path().write_text(json.dumps(data))
            tuning.reload()
        with pytest.warns(RuntimeWarning, match=why):
            assert rf.config_for_shape(torch.bfloat16, 4, 4608, 16, 16, 128, "none", gpu=GPU) == rf.CONFIGS[128]
    tuning.store("ranker_fwd", torch.bfloat16, KEY, dict(full, stages=4), GPU)
    listing = tuning.format_configs("ranker_fwd")
    assert "UNUSABLE (config needs" in listing and "shared memory" in listing


def test_configs_listing_with_tuning_off_does_not_read_the_file(cache, monkeypatch, recwarn):
    """``CUTE_KERNELS_TUNED=0``: ``cute-kernels configs`` says the tuned entries are ignored, without reading
    tuned.json (a corrupt one warned there until session 83, though calls ignore it)."""
    path = tuning.tuned_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    tuning.reload()
    monkeypatch.setenv("CUTE_KERNELS_TUNED", "0")
    listing = tuning.format_configs("scale")
    assert listing.endswith("tuned: ignored (CUTE_KERNELS_TUNED=0): calls run the shipped configs\n")
    assert "scale:" in listing and not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("content", [b'{"version": 1, "entries": {"k": {"note": "Jos\xe9"}}}', b"[" * 200000])
def test_undecodable_tuned_file_is_ignored(cache, content):
    """A tuned.json that is not UTF-8 or nests too deeply is ignored with a warning, by readers and by
    store (which rewrites it), instead of crashing every call (session 37 review)."""
    path = tuning.tuned_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    tuning.reload()
    with pytest.warns(RuntimeWarning, match="ignoring it"):
        assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None
    with pytest.warns(RuntimeWarning):
        tuning.store("ranker_fwd", torch.bfloat16, KEY, rf.CONFIGS[128], GPU)
    assert rf.RankerFwdConfig(**tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU)) == rf.CONFIGS[128]


def test_ranker_launch_uses_the_tuned_config_once_per_signature(cache, monkeypatch):
    """_ranker_impl on CPU tensors with a recording stand-in kernel: the config it compiles with is the
    tuned one, chosen once per signature; a new entry (tuning.store -> reload) is picked up."""
    chosen, full_select = [], rf.config_for_shape
    launched = stand_in_forward(monkeypatch)
    monkeypatch.setattr(rf, "config_for_shape", lambda *a, **kw: chosen.append(a) or full_select(*a, **kw))
    monkeypatch.setattr(tuning, "gpu_name", lambda device=None: GPU)
    q = torch.randn(1, 64, 2, 128, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    bounds = torch.tensor([[0, 48, 48, 64]], dtype=torch.int32)
    call = lambda: rf._ranker_impl(q, k, v, bounds, None, None, "tanh", None, None)  # noqa: E731
    call()
    assert launched[-1][0][1] == rf.CONFIGS[128]  # (checked_max at any length)
    key = rf.tuned_shape_key(1, 64, 2, 2, 128, "none")
    tuning.store("ranker_fwd", torch.bfloat16, key, _tuned_cfg(), GPU)  # clears the memo
    call()
    call()
    assert [a[1] for a, _ in launched[-2:]] == [_tuned_cfg(), _tuned_cfg()]
    assert len(chosen) == 2  # once before the entry, once after; not per call
    monkeypatch.setenv("CUTE_KERNELS_TUNED", "0")
    tuning.reload()
    call()
    assert launched[-1][0][1] == rf.CONFIGS[128]


def test_config_for_call_looks_up_the_tensors_gpu(cache, monkeypatch):
    """config_for_call on tensors of CUDA device 1 names device 1's tuned config, as the launch (which looks it up
    for q.device) does, not the current device's; CPU and meta tensors look up the current device's (fake CUDA
    tensors: no GPU here)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    names = {1: "Fake GPU one", None: "Fake GPU current"}
    monkeypatch.setattr(tuning, "gpu_name", lambda device=None: names[getattr(device, "index", device)])
    key = rf.tuned_shape_key(1, 64, 2, 2, 128, "none")
    tuning.store("ranker_fwd", torch.bfloat16, key, _tuned_cfg(), names[1])
    mode = FakeTensorMode()
    q = FakeTensor(mode, torch.empty(1, 64, 2, 128, dtype=torch.bfloat16, device="meta"), torch.device("cuda", 1))
    b = FakeTensor(mode, torch.empty(1, 4, dtype=torch.int32, device="meta"), torch.device("cuda", 1))
    assert rf.config_for_call(q, q, q, b) == _tuned_cfg()
    qm, bm = q.new_empty(q.shape, device="meta"), b.new_empty(b.shape, device="meta")
    assert rf.config_for_call(qm, qm, qm, bm) == rf.CONFIGS[128]  # the current GPU has no entry
    tuning.store("ranker_fwd", torch.bfloat16, key, _tuned_cfg(), names[None])
    assert rf.config_for_call(qm, qm, qm, bm) == _tuned_cfg()


def test_gpu_name_memo_follows_the_current_device_for_cuda(monkeypatch):
    """gpu_name keeps names by device index: "cuda" (as config_for_shape(device="cuda") passes it) names the
    current device each time, not the one that was current at the first call (it was kept under the string
    "cuda": after torch.cuda.set_device(1) it still named device 0, and the lookup found another GPU's config)."""
    current = [0]
    names = {0: "Fake GPU zero", 1: "Fake GPU one"}
    monkeypatch.setattr(tuning, "_gpu_names", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])

    def device_name(d=None):  # (torch's: an index, a torch.device or a string; None or no index: the current one)
        d = torch.device(d) if isinstance(d, str) else d
        d = d.index if isinstance(d, torch.device) else d
        return names[current[0] if d is None else d]

    monkeypatch.setattr(torch.cuda, "get_device_name", device_name)
    assert tuning.gpu_name("cuda") == names[0]
    current[0] = 1
    assert tuning.gpu_name("cuda") == tuning.gpu_name() == tuning.gpu_name(torch.device("cuda")) == names[1]
    assert tuning.gpu_name("cuda:0") == tuning.gpu_name(0) == names[0]
    with pytest.raises(ValueError, match="not a CUDA device"):
        tuning.gpu_name("cpu")


# ---------------------------------------------------------------------------- the tuner's flow (no GPU)
@dataclasses.dataclass(frozen=True)
class ToyConfig(ValidatedConfig):  # (as every kernel's config: checked when constructed)
    block: int = 4
    wrong: bool = False  # a candidate whose output differs: must be dropped

    def validate(self):
        if self.block not in (1, 2, 4, 8):
            raise ValueError(f"block={self.block}: must be 1, 2, 4 or 8")


class ToyTuner:
    """A CPU stand-in of a kernel tuner: outputs x (or x + 1 when ``wrong``); block 2 is the fastest."""

    def __init__(self):
        self.last = None

    def parse_shape(self, text):
        return {"N": int(text.split("=")[1])}

    def shape_key(self, s):
        return f"N={s['N']}"

    def shipped(self, s, dtype=None):
        return ToyConfig()

    def default_choices(self, base):
        return dict(block=[1, 2, 3, 4, 8], wrong=[False, True])

    def make_inputs(self, s, dtype):
        return dict(x=torch.arange(s["N"], dtype=torch.float32))

    def inputs_meta(self, s):
        return {}

    def outputs(self, cfg, x):
        return (x["x"] + cfg.wrong,)

    def run(self, cfg, x):
        self.last = cfg

    def mismatch(self, got, ref):
        return None if torch.equal(got[0], ref[0]) else "differs"


def test_tune_flow_with_a_stand_in_kernel(cache, monkeypatch):
    import cute_kernels.runtime.timing as timing

    toy = ToyTuner()
    monkeypatch.setitem(tuning.TUNERS, "toy", toy)
    monkeypatch.setattr(tuning, "gpu_name", lambda device=None: GPU)

    timed = []

    def fake_time(fn, graph=True, **kw):
        fn()
        timed.append((toy.last.block, kw.get("settle_s")))
        return {1: 30.0, 2: 10.0, 4: 20.0, 8: 40.0}[toy.last.block]

    monkeypatch.setattr(timing, "cuda_time_us", fake_time)
    rows, path = tuning.tune("toy", "N=16", echo=lambda s: None)
    assert rows[0].config == ToyConfig()  # shipped first
    live = [r.config.block for r in rows if not r.error]
    assert [b for b, _ in timed] == live + live[1:] + live[:1]  # (the second round starts one candidate later)
    assert {st for _, st in timed} == {timing.SETTLE_S}  # (each timed after the settling calls)
    assert {r.config.block for r in rows} == {1, 2, 4, 8}  # block=3 rejected by validate()
    assert all(r.error == "differs" and r.time_us is None for r in rows if r.config.wrong)
    assert all(not r.error and r.time_us for r in rows if not r.config.wrong)
    entry = json.loads(path.read_text())["entries"][tuning.entry_key("toy", GPU, source_fingerprint(), "bfloat16",
                                                                      "N=16")]
    assert entry["config"] == dict(block=2, wrong=False) and entry["time_us"] == 10.0
    assert entry["shipped_time_us"] == 20.0 and entry["candidates"] == 4
    assert tuning.tuned_config("toy", ToyConfig, torch.bfloat16, "N=16", ToyConfig(), gpu=GPU) == ToyConfig(block=2)


def test_file_written_by_another_process_is_seen(cache):
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU) is None  # loaded: empty
    code = ("import torch; from cute_kernels import tuning; from cute_kernels.kernels import ranker_fwd as rf; "
            f"tuning.store('ranker_fwd', torch.bfloat16, {KEY!r}, rf.RankerFwdConfig(tile_n=96), {GPU!r})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache)))
    assert r.returncode == 0, r.stderr
    assert tuning.lookup("ranker_fwd", torch.bfloat16, KEY, gpu=GPU)["tile_n"] == 96  # no reload() needed


def test_concurrent_writers_keep_every_entry(cache):
    code = ("import sys, torch; from cute_kernels import tuning; from cute_kernels.kernels import ranker_fwd as rf; "
            "[tuning.store('ranker_fwd', torch.bfloat16, f'B={sys.argv[1]},i={i}', rf.CONFIGS[128], 'G') "
            "for i in range(5)]")
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], env=env, stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    entries = json.loads((cache / "tuned.json").read_text())["entries"]
    assert len(entries) == 15


def test_shipped_configs_of_the_backward_are_per_head_dim():
    """The table shows what config_for runs: at D=64 it depends on the cap (128-row q tiles without)."""
    from cute_kernels.kernels import ranker_bwd as rb

    table = tuning.shipped_configs("ranker_bwd")["ranker_bwd"]
    assert {"head_dim=64 no cap", "head_dim=64 cap", "head_dim=128", "head_dim=128 deterministic",
            "head_dim=64 no cap deterministic"} <= set(table)
    assert table["head_dim=128 deterministic"].deterministic and not table["head_dim=128"].deterministic
    assert table["head_dim=64 no cap"] == rb.config_for(64, False) and table["head_dim=64 no cap"].tile_m == 128
    assert table["head_dim=64 cap"] == rb.config_for(64, True) and table["head_dim=64 cap"].tile_m == 64


def test_candidates_cannot_change_what_the_shape_sets():
    shape = tuning.TUNERS["ranker_fwd"].parse_shape("B=4,S=4608,H=16,D=128")
    with pytest.raises(ValueError, match="may not change head_dim"):
        tuning.candidate_configs("ranker_fwd", shape, "head_dim=64")
    with pytest.raises(ValueError, match="given twice"):
        tuning.TUNERS["ranker_fwd"].parse_shape("B=4,S=4608,H=16,D=128,B=8")


def test_tuned_entry_with_a_string_for_a_bool_is_ignored(cache):
    from cute_kernels.kernels import ranker_fwd as rf

    base = rf.CONFIGS[128]
    fields = {**dataclasses.asdict(base), "persistent": "false"}
    tuning.store("ranker_fwd", torch.bfloat16, KEY, fields, GPU)
    with pytest.warns(RuntimeWarning, match="must be a bool"):
        assert tuning.tuned_config("ranker_fwd", rf.RankerFwdConfig, torch.bfloat16, KEY, base, gpu=GPU) is base


def test_candidate_and_shape_parsing_review_cases():
    """A space inside a candidate item is an error (it used to read 'stages=1 2' as stages=12);
    cap_method=none is the library's own spelling of no cap; a shape error names only what was given."""
    with pytest.raises(ValueError, match="space inside"):
        tuning.parse_candidates("stages=1 2", rf.CONFIGS[128])
    tuner = tuning.TUNERS["ranker_fwd"]
    assert tuner.parse_shape("B=4,S=4608,H=16,D=128,cap_method=none")["cap"] is None
    with pytest.raises(ValueError, match=r"^hist=5000 must be"):
        tuner.parse_shape("B=4,S=4608,H=16,D=128,hist=5000")


def test_shape_beyond_the_ops_extent_is_refused():
    """tune --shape listed candidates for shapes the op refuses (newcomer review, session 20; since session 54 the
    op's limit is its work list, 2**30 q tiles x heads x batch rows, not the tensors' 2**31 elements)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "cute_kernels", "tune", "--kernel", "ranker_fwd", "--shape",
                        "B=1000000,S=1000000,H=128,D=128", "--list"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "2**30" in r.stderr, r.stdout + r.stderr


def test_ranker_tuner_times_candidates_as_they_would_run(monkeypatch):
    """The tuner launches a candidate through ranker_fwd.chosen_config, as the forward runs a stored
    winner: the fixed max only where it applies (checked_max for bfloat16 without a cap, fixed_row_max for caps
    up to FIXED_MAX_CAP), so a stored config was timed in the form it runs in."""
    launched = []
    monkeypatch.setattr(rf, "_ranker_impl", lambda *a, config=None, **kw: launched.append(config))
    tuner = tuning.TUNERS["ranker_fwd"]
    for seq, cap, dtype, want in ((64, None, torch.bfloat16, True), (3000, None, torch.bfloat16, True),
                                  (3000, 30.0, torch.bfloat16, False), (64, None, torch.float16, False)):
        x = dict(q=torch.zeros(1, seq, 2, 128, dtype=dtype), k=None, v=None, bounds=None, cap=cap,
                 cap_method="tanh", out=None, lse=None)
        tuner.run(rf.CONFIGS[128], x)
        assert launched[-1].checked_max == want, (seq, cap, dtype)
    x["cap"] = 80.0  # above FIXED_MAX_CAP: the capped config runs with the online max
    tuner.run(rf.CAP_CONFIGS[("tanh", 128)], x)
    assert not launched[-1].fixed_row_max
