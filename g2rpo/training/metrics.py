"""A run's ``metrics.jsonl``: what one line is, the writer, and the reader.

The trainer (rank 0) appends one JSON object per line: an **iteration record** per iteration
(``{"iteration": i, ...}``, :meth:`IterationRecord.as_json`, NaN/inf written as null) and **event
records** (``{"event": "resumed" | "restarted" | "prompts" | ..., "time": ...}``). The file is only
appended to, so after a resume the iterations after the checkpoint appear twice; the later record
of an iteration is the one the resumed run trained, and the one to read
(:func:`read_iteration_records`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g2rpo.strategies.base import StepStats

__all__ = ["IterationRecord", "MetricsLog", "read_iteration_records"]


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
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(_finite(record), sort_keys=True) + "\n")

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


def read_iteration_records(path: str | Path) -> list[dict[str, Any]]:
    """The iteration records of ``metrics.jsonl`` in iteration order, the last record of each
    iteration, events left out."""
    by_iteration: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "iteration" in record and "event" not in record:
            by_iteration[record["iteration"]] = record
    return [by_iteration[i] for i in sorted(by_iteration)]
