"""Which failed GPU tests of a sharded run failed only for want of GPU memory (gpu_run.sh --jobs N).

    python3 scripts/junit_oom.py OOM_IDS_FILE SHARD.xml [SHARD.xml ...]

Many pytest processes share one GPU under ``--jobs``; the float64 references of the big cases can then run
the GPU out of memory (session 62: 12 shards on an 80 GB H100, three ``torch.OutOfMemoryError`` in the
reference, all passing alone).  This reads the shards' junit XML and writes to OOM_IDS_FILE the pytest node ids
of the tests whose failure or error is a ``torch.OutOfMemoryError``, one per line, for gpu_run.sh to run again
in one process after the shards.  Exit status 0 when every other test passed or skipped, 1 when some test
failed or errored for another reason, or a shard's XML is missing or unreadable (a crashed shard).
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OOM_PREFIX = "torch.OutOfMemoryError"


def node_id(classname: str, name: str, root: Path = Path(".")) -> str:
    """pytest's node id from a junit ``testcase``: ``tests.gpu.test_x`` (+ ``.TestClass``) and the test name ->
    ``tests/gpu/test_x.py[::TestClass]::name``; the module is the longest dotted prefix that is a file."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    raise ValueError(f"no test module found for junit classname {classname!r}")


def oom_failures(xml_paths: list[str], root: Path = Path(".")) -> tuple[list[str], list[str]]:
    """(node ids that failed with a CUDA out-of-memory error, reasons the run is red for another cause)."""
    oom, other = [], []
    for p in xml_paths:
        try:
            cases = ET.parse(p).getroot().iter("testcase")
        except (OSError, ET.ParseError) as e:
            other.append(f"{p}: no readable junit XML ({e})")
            continue
        for case in cases:
            for bad in (*case.findall("failure"), *case.findall("error")):
                nid = f"{case.get('classname')}::{case.get('name')}"
                if (bad.get("message") or "").startswith(OOM_PREFIX):
                    oom.append(node_id(case.get("classname"), case.get("name"), root))
                else:
                    other.append(f"{nid}: {(bad.get('message') or bad.tag)[:120]}")
    return oom, other


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    oom, other = oom_failures(argv[1:])
    Path(argv[0]).write_text("".join(f"{n}\n" for n in dict.fromkeys(oom)))
    for line in other:
        print(f"junit_oom: {line}", file=sys.stderr)
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
