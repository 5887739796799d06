"""Reading a run's ``metrics.jsonl``.

The trainer (rank 0) appends one JSON object per line: an **iteration record** per iteration
(``{"iteration": i, ...}``, :meth:`g2rpo.training.trainer.IterationRecord.as_json`, NaN/inf written
as null) and **event records** (``{"event": "resumed" | "restarted" | "prompts" | ...}``). The file is only
appended to, so after a resume the iterations after the checkpoint appear twice; the later record
of an iteration is the one the resumed run trained, and the one to read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_iteration_records"]


def read_iteration_records(path: str | Path) -> list[dict[str, Any]]:
    """The iteration records of ``metrics.jsonl`` in iteration order, the last record of each
    iteration, events left out."""
    by_iteration: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "iteration" in record and "event" not in record:
            by_iteration[record["iteration"]] = record
    return [by_iteration[i] for i in sorted(by_iteration)]
