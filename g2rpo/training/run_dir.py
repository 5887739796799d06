"""Whose files are in ``output.dir``: a run's folder is marked, and nothing else in a folder is touched.

A fresh run writes :data:`MARKER` (``.g2rpo-run.json``: the g2rpo version, the config hash and
when) into ``output.dir`` before any other file, so the ``config.yaml``, ``metrics.jsonl``,
``checkpoints/`` and ``export/`` beside it are known to be the run's. The trainer writes only into
a folder that is

- new, or empty;
- marked (a g2rpo run's, resumed or restarted there); or
- unmarked but g2rpo's own: a ``checkpoints/`` folder holding only checkpoint directories (what a
  restore from a mirrored checkpoint URI puts in a fresh folder), and — when at least one of them
  is complete — the files a run made before the marker existed (``config.yaml``, ``metrics.jsonl``,
  ``export/``, ...). Such a folder is adopted: the marker is added and the run resumes there.

Anything else — a user's own ``config.yaml`` next to the output, another tool's ``metrics.jsonl`` —
is refused before any work starts, naming the files, so that no file of the user's is ever
overwritten or appended to. (A pre-marker folder of a run killed before its first checkpoint is
refused too: it cannot be told apart from someone else's, and it holds nothing to resume.)
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

from g2rpo import __version__
from g2rpo.artifacts.storage import check_writable
from g2rpo.errors import G2RPOError, problem
from g2rpo.training.checkpoint import is_complete

__all__ = ["MARKER", "check_run_dir", "claim_run_dir", "foreign_entries"]

MARKER = ".g2rpo-run.json"

# What a run writes at the top of output.dir (trainer, checkpoint manager, export).
_RUN_FILES = re.compile(r"^(config\.yaml|config-resumed-iter-\d+\.yaml|metrics\.jsonl|checkpoints|export(-iter-\d+)?)$")
# What checkpoints/ holds: checkpoint directories, complete or not, and those set aside as damaged.
_CHECKPOINT_ENTRY = re.compile(r"^iter-\d{6,}(\.damaged(-\d+)?)?$")


def _is_marked(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text(encoding="utf-8")).get("tool") == "g2rpo"
    except (OSError, ValueError, AttributeError):
        return False


def foreign_entries(out: str | Path) -> list[str]:
    """The names in ``out`` that are not a g2rpo run's (empty when the trainer may write there)."""
    out = Path(out)
    if not out.is_dir() or _is_marked(out):
        return []
    names = sorted(os.listdir(out))
    checkpoints = out / "checkpoints"
    owned: set[str] = {n for n in names if n.startswith(MARKER)}  # the marker, or its temp file mid-write
    if checkpoints.is_dir():
        entries = list(checkpoints.iterdir())
        if all(_CHECKPOINT_ENTRY.match(e.name) and e.is_dir() for e in entries):
            owned.add("checkpoints")
            if any(is_complete(e) for e in entries):  # a run from before the marker: adopt its files
                owned.update(n for n in names if _RUN_FILES.match(n))
    return [n for n in names if n not in owned]


def check_run_dir(out: str | Path, field: str = "output.dir") -> None:
    """Refuse an ``out`` that cannot be written, or that holds files not of a g2rpo run, naming them and the fix."""
    out = Path(out)
    check_writable(out, field)
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise G2RPOError(
            problem(
                field,
                str(out),
                f"holds files that are not a g2rpo run's ({shown}) and g2rpo never writes over or beside them: "
                f"choose another output.dir, a new or empty folder (e.g. {out / 'run'})",
            )
        )


def claim_run_dir(out: str | Path, config_hash: str, field: str = "output.dir") -> None:
    """Check ``out`` (:func:`check_run_dir`), create it, and write the marker if it has none — before
    anything else is written there. Rank 0 only; the other ranks call :func:`check_run_dir`."""
    out = Path(out)
    check_run_dir(out, field)
    if _is_marked(out):
        return
    out.mkdir(parents=True, exist_ok=True)
    marker = {
        "tool": "g2rpo",
        "version": __version__,
        "config_hash": config_hash,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    temp = out / f"{MARKER}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    os.replace(temp, out / MARKER)  # another rank listing the folder sees the whole marker or none
