"""The evaluation's per-prompt scores: the one schema the evaluation writes and the registry reads.

An evaluation scores every (prompt, seed) of a fixed prompt set with several metrics; paired
comparisons between two models (the promotion gates, the report's champion-vs-challenger
differences) are computed from these items, so both sides import the schema from here and the
evaluation never imports the registry.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from g2rpo.errors import problem

__all__ = ["SCHEMA_VERSION", "Record", "MetricSummary", "ScoreItem", "EvalScores"]

SCHEMA_VERSION = 1


class Record(BaseModel):
    """A stored record: unknown fields refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricSummary(Record):
    mean: float = Field(allow_inf_nan=False, description="mean score over all (prompt, seed) items")
    ci_low: float = Field(allow_inf_nan=False, description="lower end of the bootstrap CI of the mean")
    ci_high: float = Field(allow_inf_nan=False, description="upper end of the bootstrap CI of the mean")
    n: int = Field(ge=1, description="number of (prompt, seed) items")


class ScoreItem(Record):
    prompt_id: str = Field(description="stable id of the prompt within the prompt set")
    seed: int = Field(description="sampling seed of the image")
    scores: dict[str, float] = Field(description="metric name -> score (native scale)")


class EvalScores(Record):
    """Per-prompt scores of one evaluation: what paired comparisons are computed from."""

    schema_version: int = Field(SCHEMA_VERSION, description="format version")
    prompt_set: str = Field(description="name (or URI) of the prompt set")
    prompt_set_sha256: str | None = Field(None, description="digest of the prompt set file, when known")
    seeds: list[int] = Field(description="sampling seeds used for every prompt")
    items: list[ScoreItem] = Field(description="one entry per (prompt, seed)")

    @model_validator(mode="after")
    def _one_finite_score_per_item(self):
        # Refused rather than repaired: a duplicate would be silently dropped by the pairing, a
        # stray seed would pair with nothing, and a NaN would poison every mean and CI.
        if not self.items:
            raise ValueError(problem("items", [], "an eval needs at least one (prompt, seed) item"))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(problem("seeds", self.seeds, "list each seed once"))
        seen: set[tuple[str, int]] = set()
        for k, item in enumerate(self.items):
            where = f"items[{k}]"
            if (item.prompt_id, item.seed) in seen:
                raise ValueError(problem(where, (item.prompt_id, item.seed), "a (prompt_id, seed) may appear once"))
            seen.add((item.prompt_id, item.seed))
            if item.seed not in self.seeds:
                raise ValueError(problem(f"{where}.seed", item.seed, f"is not in seeds {self.seeds}; add it or fix it"))
            for metric, value in item.scores.items():
                if not math.isfinite(value):
                    raise ValueError(
                        problem(f"{where}.scores.{metric}", value, "scores must be finite; re-run that evaluation")
                    )
        return self

    def metric_names(self) -> list[str]:
        names: set[str] = set()
        for item in self.items:
            names.update(item.scores)
        return sorted(names)

    def keyed(self, metric: str) -> dict[tuple[str, int], float]:
        """``(prompt_id, seed) -> score`` for one metric (items lacking it are left out)."""
        return {(i.prompt_id, i.seed): i.scores[metric] for i in self.items if metric in i.scores}
