"""Check that the wheel set in .whl/ is complete for the GPU machine: every requirement of every
carried distribution (wheel METADATA, the DeepSpeed sdist's requirements.txt), evaluated for
Python 3.12 on Linux, is either carried or in the machine's image (present.txt). Exit 1 naming
each missing one. Usage: ``python benchmarks/gpu/check.py [.whl]``."""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux"}


def _dist_name(path: Path) -> str:
    return canonicalize_name(re.split(r"-\d", path.name, maxsplit=1)[0])


def _requirements(path: Path) -> list[str]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            text = wheel.read(meta).decode()
        return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    with tarfile.open(path) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.endswith("requirements/requirements.txt"))
        text = sdist.extractfile(member).read().decode()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def main(folder: str = ".whl") -> int:
    files = sorted(Path(folder).glob("*.whl")) + sorted(Path(folder).glob("*.tar.gz"))
    if not files:
        print(f"no wheels in {folder}: run benchmarks/gpu/fetch.sh first", file=sys.stderr)
        return 1
    carried = {_dist_name(f) for f in files}
    present = {canonicalize_name(n) for n in (HERE / "present.txt").read_text().split() if not n.startswith("#")}
    wanted = {
        canonicalize_name(Requirement(line).name)
        for line in (HERE / "wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    missing = []
    for name in sorted(wanted - carried):
        missing.append(f"{name}: listed in wheels.txt but not in {folder}")
    for path in files:
        for line in _requirements(path):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**ENV, "extra": ""}):
                continue
            name = canonicalize_name(req.name)
            if name not in carried and name not in present:
                missing.append(f"{name} (needed by {path.name}: {line})")
    for line in missing:
        print("missing:", line)
    print(f"{len(files)} distributions carried, {len(missing)} requirement(s) missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
