"""``cute-kernels``: compile, check, bench and describe the registered kernels.

    cute-kernels compile [--kernel NAME] [--arch sm_90a]   # CPU or GPU: fill the on-disk cache
    cute-kernels check   [--kernel NAME]                   # GPU: correctness table vs references
    cute-kernels bench   [--kernel NAME] [--shapes SEL] [--json PATH]   # GPU: benchmark records
    cute-kernels info                                      # versions, arch, cache, GPU
    cute-kernels prune-cache [--dry-run]                   # remove cache folders of other sources unused for an hour
    cute-kernels layouts --kernel ranker_fwd|ranker_bwd|hc_mix [--config head_dim=64,tile_n=96] --out DIR
                                                           # CPU: pictures + report
    cute-kernels configs [--kernel NAME]                   # shipped configs per kernel (and tuned ones)
    cute-kernels tune --kernel ranker_fwd --shape B=4,S=4608,H=16,D=128 [--candidates tile_n=96,128] [--list]
                                                           # GPU: time candidates, store the winner (tuned.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings

from . import registry


def _select(kernel: str | None) -> list[str]:
    if kernel is None:
        return registry.names()
    if kernel not in registry.KERNELS:  # exit status 2, as for every bad argument of the CLI
        print(f"unknown kernel {kernel!r}; registered: {', '.join(registry.names())}{_part_hint(kernel)}",
              file=sys.stderr)
        raise SystemExit(2)
    return [kernel]


def _part_hint(kernel: str) -> str:
    """`` (... is a launch of PARENT: use --kernel PARENT)`` for a kernel name that is a registered
    kernel's part (e.g. hc_mix_tma), else ``""``."""
    parent = next((name for name in registry.names() if kernel.startswith(name + "_") and _has_part(name, kernel)),
                  None)
    return f" ({kernel!r} is a launch of {parent!r}: use --kernel {parent})" if parent else ""


def _has_part(name: str, part: str) -> bool:
    """Whether registry entry ``name`` compiles kernels named ``part`` (``compile`` lists them by that name)."""
    try:
        return any(t.kernel == part for t in registry.module(name).compile_targets())
    except Exception:  # noqa: BLE001 (only a hint)
        return False


def _first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (DSL errors start with a blank line)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # DSL messages carry ANSI colours
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def cmd_compile(args) -> int:
    from tqdm import tqdm

    from .runtime.arch import check_target_arch
    from .runtime.cache import (cache_dir, clear_memory_cache, compile_record, disk_cache_enabled, disk_cache_problem,
                                entry_on_disk, load_from_disk, nvdisasm_available)

    names = _select(args.kernel)
    try:  # a CUTE_DSL_ARCH the kernels do not support: one error up front, not the same one per config
        check_target_arch()
    except RuntimeError as exc:
        print(f"compile: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "list", False):
        return _list_targets(names)
    problem = disk_cache_problem() if disk_cache_enabled() else None
    if problem and not cache_dir().is_dir():  # compile's job is to fill the disk cache: one that cannot even
        # exist is an error, not a warning
        print(f"compile: the compile cache folder {problem}; set CUTE_KERNELS_CACHE_DIR to a writable folder "
              "(or CUTE_KERNELS_CACHE=0 to compile without it)", file=sys.stderr)
        return 1
    read_only = problem is not None  # a folder that exists but cannot be written (a shared, pre-filled cache):
    if read_only:  # check that it holds every entry, compiling nothing
        print(f"compile: the compile cache folder {problem}; checking that it already holds every config "
              "(nothing is compiled or written)", file=sys.stderr)
    clear_memory_cache()  # (each config through the disk cache, even where this process compiled it already)
    missing = 0  # read-only: configs not in the cache
    failures = 0  # configs that did not compile
    targets, unlisted = _compile_targets(names)  # (unlisted: modules that could not list their configs)

    def report(line):  # one line per target as it finishes (above the bar where there is one)
        tqdm.write(line, file=sys.stdout)

    kw = max((len(t.kernel) for t in targets), default=0)  # the table's columns: the longest kernel and label
    lw = max((len(t.label) for t in targets), default=0)
    # (disable=None: no bar where stderr is not a terminal, e.g. a log file, which would get one long line of \r)
    for t in tqdm(targets, desc="compiling", unit="cfg", file=sys.stderr, disable=True if args.quiet else None):
        try:
            t0 = time.perf_counter()
            if read_only:  # load only: t.build() would compile a missing or broken entry in memory
                why = ("missing or incomplete in the read-only cache" if not entry_on_disk(t.kernel, t.key) else
                       "its entry in the read-only cache did not load" if load_from_disk(t.kernel, t.key) is None
                       else None)
                if why:
                    missing += 1
                    report(f"MISS {t.kernel:<{kw}} {t.label:<{lw}} {why}")
                    continue
                wall, rec = time.perf_counter() - t0, compile_record(t.kernel, t.key)
            else:
                t.build()
                wall, rec = time.perf_counter() - t0, compile_record(t.kernel, t.key)  # (before the load below)
                # the entry must load from the disk: one compiled in memory only (a folder of the cache this user
                # cannot write, over files another user left, broken or not) is a failure of compile's job
                if disk_cache_enabled() and load_from_disk(t.kernel, t.key) is None:
                    failures += 1
                    report(f"FAIL {t.kernel:<{kw}} {t.label:<{lw}} compiled, but its entry on disk is missing "
                           f"or does not load (a folder of {cache_dir()} that cannot be written?)")
                    continue
            report(f"ok   {t.kernel:<{kw}} {t.label:<{lw}} {wall:6.2f}s  {rec.summary()}")
        except Exception as exc:
            failures += 1
            report(f"FAIL {t.kernel:<{kw}} {t.label:<{lw}} {type(exc).__name__}: {_first_line(exc)}")
            if args.verbose:
                traceback.print_exc()
    many = unlisted > 1
    broken = f"; {unlisted} module{'s' if many else ''} could not list {'their' if many else 'its'} configs" \
        if unlisted else ""
    done = ("found in the read-only cache" if read_only else "compiled" if disk_cache_enabled() else
            "compiled in memory only (CUTE_KERNELS_CACHE=0: nothing written)")
    print(f"{len(targets) - failures - missing}/{len(targets)} configs {done} for {os.environ['CUTE_DSL_ARCH']}"
          f"{broken}")
    if not nvdisasm_available():
        print("note: no nvdisasm, so no SASS (PTX features only): pip install nvidia-cuda-nvdisasm (in the [test] "
              "extra); the SASS is then disassembled from each entry's kept cubin when first read", file=sys.stderr)
    return 1 if failures or unlisted or missing else 0


def _compile_targets(names: list[str]) -> tuple[list, int]:
    """The compile targets of the kernels ``names``, and how many modules could not list theirs (each reported on
    stderr; the others are still listed)."""
    targets, unlisted = [], 0
    for name in names:
        try:
            targets += registry.module(name).compile_targets()
        except Exception as exc:  # noqa: BLE001 (a broken module is reported, the others still listed)
            unlisted += 1
            print(f"FAIL {name}: cannot list configs: {exc}", file=sys.stderr)
    return targets, unlisted


def _list_targets(names: list[str]) -> int:
    """``compile --list``: one line per compile target (kernel, label, in the disk cache or not), then a count;
    exit 1 where a module cannot list its targets."""
    from .runtime.cache import disk_cache_enabled, entry_on_disk

    rows, unlisted = _compile_targets(names)
    on = disk_cache_enabled()
    cached = [on and entry_on_disk(t.kernel, t.key) for t in rows]
    kw = max((len(t.kernel) for t in rows), default=0)
    for t, hit in zip(rows, cached):
        print(f"{t.kernel:<{kw}}  {t.label}  ({'cached' if hit else 'not cached'})")
    where = "in the disk cache" if on else "cached (CUTE_KERNELS_CACHE=0: no disk cache)"
    print(f"{len(rows)} compile targets for {os.environ['CUTE_DSL_ARCH']}, {sum(cached)} {where}")
    return 1 if unlisted else 0


def cmd_check(args) -> int:
    import torch

    names = _select(args.kernel)  # an unknown kernel first: exit 2 before anything else is said
    if not torch.cuda.is_available():
        print("no CUDA GPU: compiling only (check needs a GPU)")
        return cmd_compile(args)
    rows, failed = [], 0
    for name in names:
        try:
            rows += registry.module(name).check()
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            if args.verbose:
                traceback.print_exc()
    print(f"{'kernel':<11} {'case':<44} {'result':<6} {'max_abs_err':>12} {'rel_err':>10} {'tol':>9}")
    for r in rows:
        failed += not r.passed
        print(f"{r.kernel:<11} {r.case:<44} {'pass' if r.passed else 'FAIL':<6} {r.max_abs_err:12.3e} "
              f"{r.rel_err:10.3e} {r.tol:9.1e} {r.note}")
    print(f"{len(rows) - sum(not r.passed for r in rows)} passed, {sum(not r.passed for r in rows)} failed")
    return 1 if failed else 0


def run_metadata() -> dict:
    """Date, GPU, commit and versions stamped on every benchmark record."""
    import torch

    try:
        # the env var wins: a device copy of the tree may carry a stale .git (seen on the H200 tool)
        commit = os.environ.get("CUTE_KERNELS_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(__file__)).stdout.strip()
        # with the commit given, the local git state says nothing about the tree that ran: unknown (None)
        dirty = None if os.environ.get("CUTE_KERNELS_COMMIT") else bool(subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
            cwd=os.path.dirname(__file__)).stdout.strip())
    except OSError:
        commit, dirty = None, None
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        commit=commit,
        dirty=dirty,
        torch=torch.__version__,
    )


def cmd_bench(args) -> int:
    import torch

    names = _select(args.kernel)  # an unknown name is refused first, on any machine
    for name in names:  # then the --shapes spec (kernel-specific), before any timing
        try:
            registry.module(name).bench_shapes(args.shapes)
        except ValueError as exc:
            hint = "" if args.kernel else " (--shapes is per kernel: give --kernel NAME)"
            print(f"{exc}{hint}", file=sys.stderr)
            return 2
        except Exception:  # noqa: BLE001 (a broken kernel module: its bench below reports FAIL, the others run)
            pass
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.json:  # writable? (checked by opening it; a file that was not there is removed again)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            existed = os.path.exists(args.json)
            with open(args.json, "a"):
                pass
            if not existed:
                os.remove(args.json)
        except OSError as exc:
            print(f"bench: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    meta = run_metadata()
    records, failed = [], 0
    for name in names:
        try:
            recs = registry.module(name).bench(args.shapes)
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            continue
        for r in recs:
            r.update(meta)
            records.append(r)
            shape = ",".join(f"{k}={v}" for k, v in r.get("shape", {}).items())
            if r.get("time_us") is None:  # a peer (or case) that failed: its record carries the error
                print(f"{r['kernel']:<11} {r['impl']:<26} {'':<6} {shape:<60} error: {r.get('error', '?')}")
                continue
            rate = f"{r['tflops']:.1f} TFLOP/s" if r.get("tflops") is not None else (
                f"{r['gbps']:.0f} GB/s" if r.get("gbps") is not None else "")
            print(f"{r['kernel']:<11} {r['impl']:<26} {r.get('mode', ''):<6} {shape:<60} "
                  f"{r['time_us']:10.2f} us  {rate}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {args.json}")
    return 1 if failed else 0


def cmd_info(args) -> int:
    import cutlass
    import torch

    from .runtime.arch import SUPPORTED_ARCHS, target_arch
    from .runtime.arch import dsl_compile_settings
    from .runtime.cache import cache_dir, cache_usage, disk_cache_enabled, disk_cache_problem, source_fingerprint

    try:
        import tvm_ffi

        tvm = tvm_ffi.__version__
    except ImportError:
        tvm = "missing"
    from . import __version__, registry

    print(f"cute_kernels     {__version__} ({os.path.dirname(os.path.abspath(__file__))})")
    print(f"python           {platform.python_version()}")
    print(f"torch            {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"nvidia-cutlass-dsl {cutlass.__version__}; apache-tvm-ffi {tvm}")
    arch = target_arch()
    note = ("" if arch in SUPPORTED_ARCHS
            else f"  NOT SUPPORTED: the kernels compile for {', '.join(SUPPORTED_ARCHS)} only")
    print(f"target arch      {arch} (CUTE_DSL_ARCH){note}")
    problem = disk_cache_problem(probe=False) if disk_cache_enabled() else None  # a report: no side effect
    here = cache_dir() / source_fingerprint()
    try:
        here_is_dir = here.is_dir()
    except OSError:  # (a cache folder this user may not list)
        here_is_dir = False
    if problem and here_is_dir:  # (a read-only cache: what it holds still loads)
        problem += "; its existing entries still load, new ones compile in memory only"
    state = "off" if not disk_cache_enabled() else f"NOT USABLE: {problem}" if problem else "on"
    print(f"compile cache    {here} ({state})")
    try:
        use = cache_usage() if disk_cache_enabled() else None
    except OSError as exc:
        use = None
        print(f"                 its contents cannot be listed: {exc.strerror or exc}")
    if use is not None:
        stale = (f"; {use['stale']} folder{'s' if use['stale'] != 1 else ''} of other sources, "
                 f"{use['stale_bytes'] / 2**20:.0f} MiB (cute-kernels prune-cache removes those unused for an hour)"
                 ) if use["stale"] else ""
        print(f"                 {use['entries']} entries, {use['bytes'] / 2**20:.0f} MiB{stale}")
        keyed = {k: v for k, v in (kv.split("=", 1) for kv in dsl_compile_settings().split(";") if "=" in kv)
                 if k in ("lineinfo", "debug", "enable_assertions", "compiler_opt")}
        print(f"                 keyed by the DSL settings too: {', '.join(f'{k}={v}' for k, v in keyed.items())}")
    print(f"GPU              {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    print(f"kernels          {', '.join(registry.names())}")
    return 0


def cmd_prune_cache(args) -> int:
    from .runtime.cache import cache_dir, prune

    try:
        removed, nbytes, kept = prune(dry_run=args.dry_run)
    except OSError as exc:
        what = "list" if args.dry_run else "list or remove"
        print(f"prune-cache: cannot {what} the folders of {cache_dir()}: {exc.strerror or exc}"
              f"{f' ({exc.filename})' if exc.filename else ''}", file=sys.stderr)
        return 1
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} folder{'' if len(removed) == 1 else 's'} of other sources ({nbytes / 2**20:.0f} MiB) "
          f"from {cache_dir()}")
    for folder in removed:  # (the default cache is shared by every checkout: say which)
        print(f"{verb} {folder.name}")
    for folder, why in kept:
        print(f"kept {folder.name}: {why}")
    return 0


def cmd_layouts(args) -> int:
    from .layouts.kernel_layouts import older_pictures, write_report
    from .runtime.arch import check_target_arch

    try:  # the kernels' layouts come from their sm_90a atoms: another target is refused up front
        check_target_arch()
    except RuntimeError as exc:
        print(f"layouts: {exc}", file=sys.stderr)
        return 2
    try:
        text, files = write_report(args.kernel, args.config, args.out, dtype=args.dtype, compile=args.compile,
                                   cap_method=args.cap)
    except ValueError as exc:  # a config the kernel rejects, or bad arguments: say why
        print(f"layouts: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # the pictures need matplotlib (in the [test] extra)
        if not (exc.name or "").startswith("matplotlib"):
            raise
        print("layouts: matplotlib is not installed: the layout pictures need it (pip install matplotlib, or "
              "the package's [test] extra)", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown kernel
        print(f"{exc.args[0] if exc.args else exc}{_part_hint(args.kernel)}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out not writable
        print(f"layouts: cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(text, end="")
    print(f"wrote {len(files)} file{'' if len(files) == 1 else 's'} to {args.out}")
    older = older_pictures(args.out, files)
    if older:
        shown = ", ".join(older[:4]) + (", ..." if len(older) > 4 else "")
        print(f"note: {args.out} also holds {len(older)} older picture file{'' if len(older) == 1 else 's'} "
              f"that this run did not write ({shown}); report.txt lists this run's", file=sys.stderr)
    return 0


def cmd_configs(args) -> int:
    from .tuning import format_configs

    try:
        text = format_configs(args.kernel)
    except ValueError as exc:  # unknown kernel
        print(f"{exc}{_part_hint(args.kernel) if args.kernel else ''}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


def cmd_tune(args) -> int:
    from .tuning import tune_cli

    return tune_cli(args.kernel, args.shape, args.candidates, dtype=args.dtype, list_only=args.list,
                    rounds=args.rounds, save=not args.no_store)


KERNEL_HELP = "a registry name: " + ", ".join(registry.KERNELS)
# ranker_fwd.CAP_METHODS, written out: `--help` imports no DSL (a test pins it)
CAP_CHOICES = ("none", "tanh", "soft_sign")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cute-kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    c = sub.add_parser("compile", help="compile every registered config into the on-disk cache")
    c.add_argument("--kernel", help=KERNEL_HELP + " (default: all)")
    c.add_argument("--arch", choices=("sm_90a",), help="target arch (sm_90a: the kernels are Hopper-only; "
                   "default: $CUTE_DSL_ARCH, else sm_90a)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument("-v", "--verbose", action="store_true", help="print the traceback of each failed compile")
    c.add_argument("--list", action="store_true", help="list the compile targets and whether the disk cache holds "
                   "each (this arch, sources and DSL settings); compile nothing")
    c.set_defaults(fn=cmd_compile)
    k = sub.add_parser("check", help="GPU correctness of every kernel vs its reference")
    k.add_argument("--kernel", help=KERNEL_HELP + " (default: all)")
    k.add_argument("--quiet", action="store_true", help="no progress bar (without a GPU check only compiles)")
    k.add_argument("-v", "--verbose", action="store_true", help="print the traceback of each failure")
    k.set_defaults(fn=cmd_check)
    b = sub.add_parser("bench", help="GPU benchmarks against the peers")
    b.add_argument("--kernel", help=KERNEL_HELP + " (default: all)")
    b.add_argument("--json", help="write the records to this file")
    b.add_argument("--shapes", help="kernel-specific shape selection (see each kernel's bench())")
    b.set_defaults(fn=cmd_bench)
    lay = sub.add_parser("layouts", help="CPU: a kernel config's smem/TV layouts as pictures + a text report")
    lay.add_argument("--kernel", required=True,
                     help="ranker_fwd, ranker_bwd or hc_mix (pictures and report); the other registry names "
                          "(qknorm, qknorm_tp, scale) list their compile targets only")
    lay.add_argument("--config", help="config fields, e.g. 'head_dim=64,tile_n=96,stages=3' (ranker_fwd), "
                                      "'head_dim=64,tile_m=128' (ranker_bwd) or "
                                      "'tile_m=256,stages=4,tree=4x2x2x2x2' (hc_mix; a tuple field as integers "
                                      "joined by x)")
    lay.add_argument("--dtype", choices=("bf16", "fp16"),
                     help="ranker_fwd / ranker_bwd: the inputs' dtype (default bf16); hc_mix: bf16 only")
    lay.add_argument("--out", required=True, help="output folder")
    lay.add_argument("--compile", action="store_true", help="also compile (sm_90a) and report registers/features")
    lay.add_argument("--cap", choices=CAP_CHOICES,
                     help="ranker_fwd / ranker_bwd: the fields --config does not set come from the config shipped "
                          "for this cap (default: none), and with --compile the variant compiled (default: none; "
                          "tanh for a forward fixed_row_max config): the capped variants may spill where the plain "
                          "one does not")
    lay.set_defaults(fn=cmd_layouts)
    cf = sub.add_parser("configs", help="shipped configs per kernel and head dim (and tuned winners)")
    cf.add_argument("--kernel", help=KERNEL_HELP + " (default: all)")
    cf.set_defaults(fn=cmd_configs)
    t = sub.add_parser("tune", help="GPU: time candidate configs on a shape, store the winner in tuned.json")
    t.add_argument("--kernel", required=True, help="ranker_fwd (the kernel with tunable tile shapes)")
    t.add_argument("--shape", required=True, help="e.g. 'B=4,S=4608,H=16,D=128[,Hkv=4,hist=4096,cand=512,cap=50,"
                   "cap_method=tanh|soft_sign]' (Hq= for H=; cap_method only with cap, default tanh)")
    t.add_argument("--candidates", help="values to try for the fields named (the other fields keep their default "
                   "variations), e.g. 'tile_n=96,128,stages=2,3'")
    t.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="the inputs' dtype (default bf16)")
    t.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (best of; default 2, >= 1)")
    t.add_argument("--list", action="store_true", help="print the validated candidates and exit (no GPU needed)")
    t.add_argument("--no-store", action="store_true", help="time only; do not write tuned.json")
    t.set_defaults(fn=cmd_tune)
    i = sub.add_parser("info", help="versions, arch, cache location, GPU")
    i.set_defaults(fn=cmd_info)
    pc = sub.add_parser("prune-cache", help="remove the compile cache's folders of other sources or DSL versions "
                                            "that were not used in the last hour")
    pc.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    pc.set_defaults(fn=cmd_prune_cache)
    args = p.parse_args(argv)
    # a warning on the command line is its message: not the library's file, line and source line
    warnings.formatwarning = lambda message, category, *_args, **_kw: f"cute-kernels: {category.__name__}: {message}\n"
    if getattr(args, "arch", None):
        if "cutlass" in sys.modules and os.environ.get("CUTE_DSL_ARCH") != args.arch:
            raise SystemExit("--arch must be set before cutlass is imported")
        os.environ["CUTE_DSL_ARCH"] = args.arch
    import cute_kernels  # noqa: F401  (sets CUTE_DSL_ARCH before cutlass loads)

    # each line as it is printed, piped or logged too (for the rest of the process: main is the program's entry;
    # streams without reconfigure, e.g. Jupyter's or StringIO, are left alone)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        return args.fn(args)
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second BrokenPipeError when Python flushes stdout at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
