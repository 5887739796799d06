"""The evaluation's per-prompt scores: the one schema the evaluation writes and the registry reads.

An evaluation scores every (prompt, seed) of a fixed prompt set with several metrics; paired
comparisons between two models (the promotion gates, the report's champion-vs-challenger
differences) are computed from these items, so both sides import the schema from here and the
evaluation never imports the registry.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from g2rpo.errors import G2RPOError, problem

__all__ = [
    "SCHEMA_VERSION",
    "Record",
    "MetricSummary",
    "ScoreItem",
    "EvalScores",
    "bootstrap_mean_ci",
    "paired_differences",
    "summarize",
]

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
    definitions: dict[str, str] = Field(
        default_factory=dict,
        description="metric name -> the official definition its scores follow (`g2rpo rewards list`)",
    )

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

    def keyed_item(self, prompt_id: str, seed: int) -> dict[str, float]:
        """``metric -> score`` of one (prompt_id, seed) item."""
        for item in self.items:
            if item.prompt_id == prompt_id and item.seed == seed:
                return dict(item.scores)
        raise G2RPOError(problem("prompt_id, seed", (prompt_id, seed), "is not an item of this evaluation"))

    def keyed(self, metric: str) -> dict[tuple[str, int], float]:
        """``(prompt_id, seed) -> score`` for one metric (items lacking it are left out)."""
        return {(i.prompt_id, i.seed): i.scores[metric] for i in self.items if metric in i.scores}


# --------------------------------------------------------------------------- statistics
# Here, below both the evaluation and the registry, so that an evaluation report and the promotion
# gates compute the same numbers with the same code.


def bootstrap_mean_ci(values: np.ndarray, resamples: int, seed: int, confidence: float) -> tuple[float, float]:
    """Percentile bootstrap CI of ``mean(values)``.

    ``idx ~ Uniform{0..N-1}^[B, N]`` from ``numpy.random.default_rng(seed)``;
    ``means_b = mean(values[idx_b])``; CI = percentiles ``100·(1−c)/2`` and ``100·(1+c)/2``.
    """
    values = np.asarray(values, dtype=np.float64)  # [N]
    if values.ndim != 1 or values.size == 0:
        raise G2RPOError(problem("values", values.shape, "need a non-empty 1-D array of scores"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(resamples, values.size))  # [B, N]
    means = values[idx].mean(axis=1)  # [B]
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return float(low), float(high)


def paired_differences(challenger: EvalScores, champion: EvalScores, metric: str) -> np.ndarray:
    """``challenger − champion`` per ``(prompt_id, seed)`` for one metric, in a fixed order.  # [N]

    Refuses comparisons on different prompt sets or seeds: a paired difference needs the same items.
    """
    # A prompt set is its content: the same file read from another path (a later run's copy) is the same
    # set; the names are compared only when a digest is missing.
    if challenger.prompt_set_sha256 and champion.prompt_set_sha256:
        same_set = challenger.prompt_set_sha256 == champion.prompt_set_sha256
    else:
        same_set = challenger.prompt_set == champion.prompt_set
    if not same_set:
        raise G2RPOError(
            problem(
                "prompt_set",
                challenger.prompt_set,
                f"the champion was evaluated on {champion.prompt_set!r}; evaluate both on the same prompt set",
            )
        )
    if sorted(challenger.seeds) != sorted(champion.seeds):
        raise G2RPOError(
            problem("seeds", challenger.seeds, f"the champion used seeds {champion.seeds}; use the same seeds")
        )
    a, b = challenger.keyed(metric), champion.keyed(metric)
    if not b:
        raise G2RPOError(
            problem(
                metric,
                champion.prompt_set,
                "the champion's eval has no scores for this metric; re-evaluate the "
                "champion with it, or remove the metric's gate",
            )
        )
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))[:3]
        raise G2RPOError(
            problem(metric, only, "challenger and champion scored different (prompt, seed) items; re-evaluate both")
        )
    keys = sorted(a)
    return np.array([a[k] - b[k] for k in keys], dtype=np.float64)  # [N]


def summarize(
    scores: EvalScores, resamples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> dict[str, MetricSummary]:
    """Per metric: mean, seeded bootstrap CI of the mean, and n."""
    out = {}
    for metric in scores.metric_names():
        values = np.array(list(scores.keyed(metric).values()), dtype=np.float64)  # [N]
        low, high = bootstrap_mean_ci(values, resamples, seed, confidence)
        out[metric] = MetricSummary(mean=float(values.mean()), ci_low=low, ci_high=high, n=int(values.size))
    return out
