"""A run's ``metrics.jsonl``: what one line is, the writer, and the reader.

The trainer (rank 0) appends one JSON object per line: an **iteration record** per iteration
(``{"iteration": i, ...}``, :meth:`IterationRecord.as_json`, NaN/inf written
as null) and **event records** (``{"event": "resumed" | "restarted" | "prompts" | ...}``). The file is only
appended to, so after a resume the iterations after the checkpoint appear twice; the later record
of an iteration is the one the resumed run trained, and the one to read.

A kill (SIGKILL, OOM, a node lost) can cut the line being written. That damage is expected, and
read around rather than refused: the last line without its newline is a record still being written
(or cut) and is skipped; :func:`append_record` first ends such a cut line and records
``{"event": "torn_line", "line": N}`` after it, so the next run's records start on a line of their
own and the reader skips line N knowingly. Any other line that is not a JSON object is damage the
trainer cannot make, and is refused naming the file, the line and what was wrong.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g2rpo.errors import G2RPOError
from g2rpo.strategies.base import StepStats
from g2rpo.textfile import read_regular_file

__all__ = [
    "IterationRecord",
    "MetricsLog",
    "TORN_LINE",
    "append_record",
    "read_metrics_records",
    "read_iteration_records",
]

TORN_LINE = "torn_line"  # the event that follows a line a kill cut short


@dataclass
class IterationRecord:
    """What :meth:`~g2rpo.training.trainer.Trainer.step` returns: the strategy's step stats plus the trainer's numbers."""

    iteration: int
    stats: StepStats
    grad_norm: float | None
    learning_rate: float
    seconds: dict[str, float]
    reward_names: list[str]
    reward_mean_global: float  # mean finite reward over all ranks
    prompt_indices: list[int]
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = {"iteration": self.iteration, **self.stats.as_dict()}
        out.update(
            grad_norm=self.grad_norm,
            lr=self.learning_rate,
            seconds=self.seconds,
            reward_names=self.reward_names,
            reward_mean_global=self.reward_mean_global,
            prompt_indices=self.prompt_indices,
            **self.extra,
        )
        return out


class MetricsLog:
    """Appends records to ``metrics.jsonl``; only the main rank writes (the others' calls do nothing)."""

    def __init__(self, path: Path, is_main: bool) -> None:
        self.path, self.is_main = path, is_main

    def append(self, record: dict[str, Any]) -> None:
        """One record as one line, sorted keys, NaN/inf as null."""
        if not self.is_main:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_record(self.path, _finite(record))

    def event(self, event: dict[str, Any]) -> None:
        """An event record (``{"event": ...}``), stamped with the time."""
        self.append({"time": time.time(), **event})


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def append_record(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path``; a last line left without its newline (a writer
    killed mid-line) is ended first and followed by a ``torn_line`` event naming it, so nothing already
    in the file is changed and every new record stands on its own line."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size and os.pread(handle.fileno(), 1, size - 1) != b"\n":
            handle.seek(0)
            torn = handle.read().count(b"\n") + 1
            marker = {"event": TORN_LINE, "line": torn, "time": time.time()}
            line = "\n" + json.dumps(marker, sort_keys=True) + "\n" + line
        handle.write(line.encode("utf-8"))


def read_metrics_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of ``metrics.jsonl`` in file order, the cut lines of killed writers left out (see the
    module docstring); a G2RPOError naming the line for any other damage."""
    path = Path(path)
    data = read_regular_file(path, what="metrics file", fix=_FIX)
    lines = data.split(b"\n")
    last_complete = len(lines) - 1  # the piece after the final newline is a record still being written
    parsed: list[dict[str, Any] | None] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            parsed.append(None)
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
            problem = None if isinstance(record, dict) else f"holds a JSON {type(record).__name__}, not an object"
        except UnicodeDecodeError as exc:
            record, problem = None, f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8"
        except json.JSONDecodeError as exc:
            record, problem = None, f"not valid JSON ({exc.msg} at column {exc.colno})"
        nul = raw.find(b"\0")
        if nul >= 0:
            record, problem = None, f"holds a NUL byte at column {nul + 1}"
        parsed.append(record if problem is None else None)
        if problem is not None and number <= last_complete:
            problems.append((number, problem))
    torn = {r["line"] for r in parsed if r is not None and r.get("event") == TORN_LINE}
    problems = [(n, p) for n, p in problems if n not in torn]
    if problems:
        number, first = problems[0]
        more = f" (and {len(problems) - 1} more line(s))" if len(problems) > 1 else ""
        raise G2RPOError(f"metrics file {str(path)!r}: line {number} {first}{more}: {_FIX}")
    return [r for r in parsed if r is not None]


def read_iteration_records(path: str | Path) -> list[dict[str, Any]]:
    """The iteration records of ``metrics.jsonl`` in iteration order, the last record of each
    iteration, events left out."""
    by_iteration: dict[int, dict[str, Any]] = {}
    for record in read_metrics_records(path):
        if "iteration" in record and "event" not in record:
            by_iteration[record["iteration"]] = record
    return [by_iteration[i] for i in sorted(by_iteration)]


_FIX = (
    "the trainer writes one JSON object per line and never such a line (a line cut by a kill is followed by a "
    "torn_line event), so the file was changed after it was written: restore it from a copy, or delete that line"
)
