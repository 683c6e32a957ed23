"""What a compiled kernel contains: PTX/SASS features, registers and shared memory.

Used by ``cute-kernels compile`` (one-line summaries) and by the tests, which assert that each
kernel's PTX/SASS shows what its design promises (wgmma, TMA, setmaxnreg, named barriers, ...).
"""

from __future__ import annotations

import functools
import os
import re
import struct
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

# feature name -> regex over PTX (p) or SASS (s)
PTX_FEATURES: dict[str, str] = {
    "ld.global.v4 (16B loads)": (r"ld\.global(\.[a-z:]+)*\.v4\.(b32|u32|f32|s32)"
                                 r"|ld\.global(\.[a-z:]+)*\.v2\.(b64|u64|f64)"),
    "st.global.v4 (16B stores)": (r"st\.global(\.[a-z:]+)*\.v4\.(b32|u32|f32|s32)"
                                  r"|st\.global(\.[a-z:]+)*\.v2\.(b64|u64|f64)"),
    "wgmma": r"wgmma\.mma_async",
    "mma.sync": r"\bmma\.sync\.aligned",
    "tma load (cp.async.bulk.tensor)": r"cp\.async\.bulk\.tensor\.\dd\.shared::(cluster|cta)\.global",
    "tma store (cp.async.bulk.tensor)": r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta",
    "bulk load (cp.async.bulk)": r"cp\.async\.bulk\.shared::(cluster|cta)\.global",
    "bulk store (cp.async.bulk)": r"cp\.async\.bulk\.global\.shared::cta",
    "tma reduce-add": r"cp\.reduce\.async\.bulk(\.tensor)?\S*\.add",
    "L2 prefetch (cp.async.bulk.prefetch)": r"cp\.async\.bulk\.prefetch\.",
    "setmaxnreg": r"setmaxnreg",
    "named barrier": r"\bbar(rier)?\.(sync|arrive)(\.aligned)?\s+(?!0[,;])\d+|\bbar(rier)?\.(sync|arrive)\s+%r",
    "mbarrier": r"mbarrier\.",
    "stmatrix": r"stmatrix",
    "ldmatrix": r"ldmatrix",
    "volatile/system-scope store": r"st\.(volatile|relaxed\.sys|release\.sys)|st\.global\.(volatile|relaxed\.sys)",
    "local memory (spill)": r"\b(ld|st)\.local",
}
SASS_FEATURES: dict[str, str] = {
    "HGMMA": r"\bHGMMA\b",
    "USETMAXREG": r"\bUSETMAXREG\b",
    "UTMALDG": r"\bUTMALDG\b",
    "UTMASTG": r"\bUTMASTG\b",
    "UTMAREDG": r"\bUTMAREDG\b",
    "LDG.E.128": r"\bLDG\.E(\.[A-Z0-9]+)*\.128\b",
    "STG.E.128": r"\bSTG\.E(\.[A-Z0-9]+)*\.128\b",
    "LDSM (ldmatrix)": r"\bLDSM\b",
    "STSM (stmatrix)": r"\bSTSM\b",
    "LDL/STL (local memory)": r"\b(LDL|STL)\b",
}


def find_features(text: str | None, table: dict[str, str]) -> list[str]:
    """Names of the features of ``table`` whose regex occurs in ``text``."""
    if not text:
        return []
    return [name for name, pat in table.items() if re.search(pat, text)]


class SassLoop(NamedTuple):
    """A loop of a kernel's SASS: the instructions from a backward branch's target to the branch."""

    kernel: str  # the function's name in the cubin
    start: int  # byte offset of the loop's first instruction in its function
    end: int  # byte offset of the backward branch
    instructions: int  # in [start, end], nested loops included
    local_memory: int  # LDL / STL among them (register spills and reloads)
    innermost: bool  # no other loop of the function lies inside it


_SASS_FUNCTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)", re.M)
_SASS_LABEL = re.compile(r"^\s*\.(L_x_\d+):", re.M)
_SASS_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+([^;]*);", re.M)
_SASS_BRANCH_TARGET = re.compile(r"\bBRA(\.[A-Z]+)*\s+`\(\.(L_x_\d+)\)")
_SASS_LOCAL_MEMORY = re.compile(r"(@!?U?P\w+\s+)?(LDL|STL)\b")  # (an optional predicate, then the opcode)


def sass_loops(sass: str | None) -> list[SassLoop]:
    """Every loop of every function in ``sass`` (nvdisasm text as :func:`disassemble` gives it), with its
    instruction count and local-memory instructions, in the order of their backward branches: where a
    kernel's ptxas stack (``KernelResources.stack_bytes``) is spent, e.g. whether the spills sit in the hot
    loop (one reload per iteration) or around it.  A loop is a branch to a label at or before the branch; loops
    that share a branch target (``continue``-like edges) are listed once per branch.  ``[]`` for None."""
    if not sass:
        return []
    heads = list(_SASS_FUNCTION.finditer(sass))
    loops = []
    for i, head in enumerate(heads):
        body = sass[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(sass)]
        events = sorted([(m.start(), "label", m.group(1)) for m in _SASS_LABEL.finditer(body)]
                        + [(m.start(), "ins", m) for m in _SASS_INSTRUCTION.finditer(body)], key=lambda e: e[0])
        labels, instructions, pending = {}, [], []
        for _, kind, item in events:
            if kind == "label":
                pending.append(item)
                continue
            offset = int(item.group(1), 16)
            for name in pending:
                labels[name] = offset
            pending = []
            instructions.append((offset, item.group(2)))
        spans = []
        for offset, text in instructions:
            m = _SASS_BRANCH_TARGET.search(text)
            if m and labels.get(m.group(2), offset + 1) <= offset:
                spans.append((labels[m.group(2)], offset))
        for start, end in spans:
            inside = [text for offset, text in instructions if start <= offset <= end]
            local = sum(bool(_SASS_LOCAL_MEMORY.match(text.strip())) for text in inside)
            innermost = not any((s, e) != (start, end) and start <= s and e <= end for s, e in spans)
            loops.append(SassLoop(head.group(1), start, end, len(inside), local, innermost))
    return loops


@dataclass
class KernelResources:
    """Per-kernel resources read from a cubin's ``.nv.info`` sections."""

    name: str
    registers: int | None = None
    static_smem_bytes: int = 0
    stack_bytes: int | None = None


# EIATTR codes of the CUDA ELF .nv.info attribute records
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11


class _Section(NamedTuple):
    """The fields of an ELF64 section header that :func:`cubin_resources` reads."""

    name: int  # offset of its name in the section-name string table
    type: int  # SHT_* (2: a symbol table)
    offset: int  # where its bytes start in the file
    size: int  # bytes
    link: int  # a symbol table's string table (section index)
    entsize: int  # bytes per entry (tables)


def cubin_resources(cubin: bytes | None) -> list[KernelResources]:
    """Registers, static shared memory and stack size per kernel of a cubin (ELF64).

    Parses the section headers, the symbol table and the ``.nv.info`` attribute records
    (format: 1-byte format, 1-byte attribute, 2-byte size, payload).  Dynamic shared memory is set
    at launch and does not appear here.
    """
    if not cubin or cubin[:4] != b"\x7fELF":
        return []
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", cubin, shoff + i * shentsize
        )
        sections.append(_Section(name, typ, off, size, link, entsize))
    strtab_off = sections[shstrndx].offset

    def sec_name(idx: int) -> str:
        start = strtab_off + sections[idx].name
        return cubin[start:cubin.index(b"\0", start)].decode()

    names = [sec_name(i) for i in range(shnum)]
    symbols: list[str] = []
    for sec in sections:
        if sec.type == 2:  # SHT_SYMTAB
            str_off = sections[sec.link].offset
            for j in range(sec.size // sec.entsize):
                st_name, = struct.unpack_from("<I", cubin, sec.offset + j * sec.entsize)
                end = cubin.index(b"\0", str_off + st_name)
                symbols.append(cubin[str_off + st_name:end].decode())
    kernels: dict[str, KernelResources] = {}
    for nm in names:
        if nm.startswith(".text."):
            kernels[nm[6:]] = KernelResources(nm[6:])
    for sec, nm in zip(sections, names):
        if nm.startswith(".nv.shared.") and nm[11:] in kernels:
            kernels[nm[11:]].static_smem_bytes = sec.size
        if nm == ".nv.info":
            off, size = sec.offset, sec.size
            pos = off
            while pos + 4 <= off + size:
                fmt, attr, sz = struct.unpack_from("<BBH", cubin, pos)
                payload = pos + 4
                if fmt == 0x04 and sz >= 8:  # EIFMT_SVAL: (symbol index, value)
                    sym, val = struct.unpack_from("<II", cubin, payload)
                    kname = symbols[sym] if sym < len(symbols) else None
                    if kname in kernels:
                        if attr == _EIATTR_REGCOUNT:
                            kernels[kname].registers = val
                        elif attr == _EIATTR_FRAME_SIZE:
                            kernels[kname].stack_bytes = val
                    pos = payload + sz
                elif fmt == 0x04:
                    pos = payload + sz
                else:  # EIFMT_NVAL / BVAL / HVAL: the value (if any) sits in the size slot
                    pos = payload
    return list(kernels.values())


@functools.lru_cache(maxsize=1)
def nvdisasm_path() -> str | None:
    """An nvdisasm the DSL accepts (pip ``nvidia-cuda-nvdisasm`` >= 13.4, the [test] extra, or a toolkit's), or None."""
    try:
        from cutlass.base_dsl.env_manager import _find_nvdisasm_binary

        return _find_nvdisasm_binary()
    except Exception:
        return None


def disassemble(cubin: bytes | str) -> str | None:
    """SASS text of a cubin (its bytes, or the path of a cubin file), as the DSL's ``--keep-sass`` writes it
    (``nvdisasm -g -c``); None without :func:`nvdisasm_path` or where nvdisasm fails (a missing file)."""
    nvdisasm = nvdisasm_path()
    if nvdisasm is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = cubin
        if isinstance(cubin, bytes):
            path = os.path.join(tmp, "kernel.cubin")
            Path(path).write_bytes(cubin)
        try:
            return subprocess.run([nvdisasm, "-g", "-c", path], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None


_UMASK_LOCK = threading.Lock()


def _umask_from_proc() -> int | None:
    """The umask as Linux reports it (``Umask:`` of ``/proc/self/status``, Linux 4.7+), read without setting it;
    None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


@functools.lru_cache(maxsize=1)
def plain_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666`` less the umask (read once per process:
    from ``/proc`` where it can be, else ``os.umask`` is read by setting it, under a lock: two threads setting
    it at once left the process's umask at 0).  ``tempfile.mkstemp`` creates its files ``0o600``, which a file
    renamed into a shared cache must not keep (other users could not read it)."""
    mask = _umask_from_proc()
    if mask is None:
        with _UMASK_LOCK:
            mask = os.umask(0)
            os.umask(mask)
    return 0o666 & ~mask


def _write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it (a reader never sees half of it), with the
    mode of a plain write (:func:`plain_file_mode`); a folder that cannot be written is skipped silently (the
    text is kept in memory)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".partial")
        os.fchmod(fd, plain_file_mode())
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


@dataclass
class CompileRecord:
    """What one compile produced; stored beside the cached object as JSON + text files (and the cubin).

    ``sass`` is disassembled from the cubin on first read (nvdisasm; None without it), not during the
    compile: about 1 s of a D=128 forward's compile on a 2-core machine (session 27), which a call that
    never looks at SASS should not pay."""

    kernel: str
    key: str
    arch: str
    compile_s: float | None = None
    load_s: float | None = None
    ptx: str | None = None
    resources: list[KernelResources] = field(default_factory=list)
    _sass: str | None = field(default=None, repr=False)
    # the cubin until disassembled: its bytes (a compile without the disk cache) or its cache file's path
    _cubin: bytes | str | None = field(default=None, repr=False, compare=False)
    _sass_file: str | None = field(default=None, repr=False, compare=False)  # where the SASS is kept

    @property
    def sass(self) -> str | None:
        cubin = self._cubin  # (read once: another thread's first read may set it to None after the test below)
        if self._sass is None and cubin is not None:
            text = disassemble(cubin)
            if text is not None:  # (else: no nvdisasm; a later read tries again)
                self._sass, self._cubin = text, None
                if self._sass_file:
                    _write_atomically(self._sass_file, text)
        return self._sass

    @sass.setter
    def sass(self, text: str | None) -> None:
        self._sass = text

    def metadata(self) -> dict:
        """The JSON part (everything but the PTX, SASS and cubin, which are files of their own)."""
        return {k: v for k, v in asdict(self).items() if k not in ("ptx", "_sass", "_cubin", "_sass_file")}

    @property
    def ptx_features(self) -> list[str]:
        return find_features(self.ptx, PTX_FEATURES)

    @property
    def sass_features(self) -> list[str]:
        return find_features(self.sass, SASS_FEATURES)

    def summary(self) -> str:
        regs = ",".join(str(r.registers) for r in self.resources if r.registers is not None) or "?"
        smem = ",".join(str(r.static_smem_bytes) for r in self.resources) or "0"
        t = f"{self.compile_s:.2f}s compile" if self.compile_s is not None else f"{(self.load_s or 0) * 1e3:.1f}ms load"
        sass = self.sass  # (read once: without it, each read runs nvdisasm again)
        feats = ", ".join(self.ptx_features + find_features(sass, SASS_FEATURES))
        if sass is None:  # (said, not left out silently: the SASS checks were not made)
            feats += "; no SASS (no nvdisasm, or the cached cubin is missing or unreadable)"
        return f"{t}; regs {regs}; static smem {smem} B; {feats}"
