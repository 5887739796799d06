"""Validation during training: held-out curves, the best checkpoint, and early stop on reward hacking.

Every ``train.validation.every`` iterations (and after the last one) the trainer samples a fixed
validation set — ``num_prompts`` prompts of the run's training split (the prepare step's
``train.jsonl``; the test split is never read by the trainer) at fixed ``seeds`` — with the
deterministic Euler ODE sampler of :mod:`g2rpo.evaluation.sampling`, and scores every image with
the run's reward models, trained and weight-0 alike. Iteration 0 (the weights before any update) is
validated too: it is the **baseline** the out-of-domain tolerance is measured from, and never a
candidate for export. Each validation is one :class:`ValidationRecord`: per metric ``m``::

    mean_m          = (1/N) Σ_i score_m,i                          # N = prompts × seeds
    CI95_m          = mean_m ± 1.96 · std_m / √N                   # normal approximation, as /metrics
    objective       = Σ_{m trained} w_m · mean_m                   # the rewards' training weights
    change_m        = mean_m − mean_m(baseline)                    # every reward is higher-is-better
    breached        = { m ∈ max_regression : change_m < −max_regression_m }

``max_regression`` is the promotion gates' out-of-domain rule (``g2rpo/artifacts/promotion.py``:
pass iff Δ ≥ −max_regression) applied against the run's own first validation instead of the
champion, with the same units: the values of the pipeline's gates file are the ones to copy here.

**Selection** (:func:`select_best`): among the validations after the baseline whose ``breached`` is
empty, the one with the highest objective (the earliest on a tie); the export is that iteration's
checkpoint. When every validation breaches, the last one is exported and the reason says so (the
promotion gates then refuse it, as they did before validation existed).

**Early stop** (:func:`early_stop_reason`): optional; stop when the last ``stop_after_breaches``
validations all breached, or when the best objective has not improved over the last
``patience`` validations.

These are pure functions of the list of records, which each checkpoint stores
(:data:`VALIDATION_FILE`): a resumed run recomputes the same best and the same stop decision.

:class:`Validator` is what the trainer holds during a run: the fixed set (prompt indices, seeds,
metrics, σ grid), the history, the best checkpoint (kept by retention) and the stop decision. The
trainer calls :meth:`Validator.validate` at iteration 0, every ``every`` iterations and at the end,
and hands the record to its callbacks. Nothing here departs from an anchor — DanceGRPO, MixGRPO and the G²RPO reference keep the last weights;
TRL and torchtune evaluate on a schedule but do not select.

The ``train.validation`` section and its checks against the rewards and the grid
(:class:`~g2rpo.training.run_config.ValidationSection`) live with the run config, which imports no torch.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from g2rpo import core
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.sampling import sample_rows
from g2rpo.models.flux import FluxVelocity
from g2rpo.rewards.scoring import score_rewards
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.textfile import JSON_MAX_BYTES, decode_record, read_regular_file
from g2rpo.training.checkpoint import CheckpointManager
from g2rpo.training.distributed import DistContext
from g2rpo.training.loading import Policy, PromptSet, RewardSet
from g2rpo.training.run_config import ValidationSection

__all__ = [
    "MetricSummary",
    "ValidationRecord",
    "read_validation_file",
    "Selection",
    "CurvePoint",
    "ValidationCost",
    "ValidationSummary",
    "summarize_metric",
    "objective",
    "breached_metrics",
    "select_best",
    "early_stop_reason",
    "validation_prompt_indices",
    "validation_chunks",
    "Validator",
    "VALIDATION_FILE",
]

Z_95 = 1.959964  # two-sided 95 % normal quantile
VALIDATION_FILE = "validation.json"  # in each checkpoint of a run with validation: identity + history


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class MetricSummary:
    """One metric of one validation: mean and its 95 % interval over N (prompt, seed) samples."""

    mean: float
    ci_low: float
    ci_high: float
    n: int


@dataclass(frozen=True)
class ValidationRecord:
    """One validation pass (what ``metrics.jsonl``'s ``validation`` event and ``validation.json`` hold)."""

    iteration: int  # iterations trained when validated (0 = the weights before any update)
    metrics: dict[str, MetricSummary]
    objective: float
    breached: list[str]  # out-of-domain metrics beyond max_regression of the baseline (empty for it)
    forwards: int  # transformer forwards, every rank together
    seconds: float  # wall seconds of the pass on rank 0
    changes: dict[str, float] = field(default_factory=dict)  # mean − baseline mean, per metric

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationRecord:
        metrics = {k: MetricSummary(**v) for k, v in data["metrics"].items()}
        return cls(**{**data, "metrics": metrics})


class _StoredMetric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: float
    ci_low: float
    ci_high: float
    n: int


class _StoredValidation(BaseModel):
    """A :class:`ValidationRecord` as :data:`VALIDATION_FILE` holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration: int
    metrics: dict[str, _StoredMetric]
    objective: float
    breached: list[str]
    forwards: int
    seconds: float
    changes: dict[str, float] = {}


class ValidationFile(BaseModel):
    """:data:`VALIDATION_FILE` as a checkpoint holds it (:meth:`Validator.checkpoint_files`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    identity: dict[str, Any]
    history: list[_StoredValidation]


def read_validation_file(path: Path, fix: str) -> tuple[dict[str, Any], list[ValidationRecord]]:
    """A checkpoint's :data:`VALIDATION_FILE`: the identity its history was recorded under, and the
    history; a damaged or mis-shaped one is a G2RPOError naming the file, the first bad field and ``fix``."""
    data = read_regular_file(path, what="validation history", max_bytes=JSON_MAX_BYTES, fix=fix)
    stored = decode_record(ValidationFile, data, f"validation history {str(path)!r}", fix=fix)
    return stored.identity, [ValidationRecord.from_json(r.model_dump()) for r in stored.history]


@dataclass(frozen=True)
class Selection:
    """The checkpoint to export and why."""

    iteration: int
    reason: str
    within_tolerance: bool


@dataclass(frozen=True)
class CurvePoint:
    """One validation in the run summary's curve: its objective, breaches and per-metric means."""

    iteration: int
    objective: float
    breached: list[str]
    means: dict[str, float]


@dataclass(frozen=True)
class ValidationCost:
    """Validation's forwards and seconds (every validation of the run) beside training's (this process's
    iterations: forwards of every rank, seconds of rank 0)."""

    validation_forwards: int
    validation_seconds: float
    training_forwards: int
    training_seconds: float


@dataclass(frozen=True)
class ValidationSummary:
    """The run summary's validation block (:meth:`Validator.summary`): the curve, the chosen iteration and
    why, the stop, the cost. Field order is the JSON's key order (``--summary-json``)."""

    curve: list[CurvePoint]
    selected_iteration: int | None
    selection_reason: str | None
    within_tolerance: bool | None
    early_stop: str | None
    exported_best: bool
    cost: ValidationCost

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationSummary:
        """Back from ``dataclasses.asdict`` of one (a summary JSON the trainer wrote)."""
        return cls(
            **{
                **data,
                "curve": [CurvePoint(**point) for point in data["curve"]],
                "cost": ValidationCost(**data["cost"]),
            }
        )


def summarize_metric(values: list[float]) -> MetricSummary:
    """Mean and normal 95 % interval of one metric's finite scores (sample std, ddof = 1; NaN bounds for
    fewer than 2). ``n`` counts the finite scores: a reward that returned NaN/inf for some images shows
    there, and one that returned nothing finite has a NaN mean."""
    values = [v for v in values if math.isfinite(v)]
    n = len(values)
    if n == 0:
        return MetricSummary(math.nan, math.nan, math.nan, 0)
    mean = math.fsum(values) / n
    if n < 2:
        return MetricSummary(mean, math.nan, math.nan, n)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z_95 * std / math.sqrt(n)
    return MetricSummary(mean, mean - half, mean + half, n)


def objective(means: dict[str, float], weights: dict[str, float]) -> float:
    """Σ_m w_m · mean_m over the trained rewards (w_m ≠ 0): what the run maximises, measured held out."""
    return math.fsum(w * means[name] for name, w in weights.items() if w != 0)


def breached_metrics(
    means: dict[str, float], baseline: dict[str, float], max_regression: dict[str, float]
) -> list[str]:
    """Out-of-domain metrics whose mean fell more than their tolerance below the baseline's.

    The gates' rule with the baseline as champion: pass iff ``mean − baseline ≥ −max_regression``; a
    NaN mean (no finite score) does not pass.
    """
    return [m for m, tol in max_regression.items() if not means[m] - baseline[m] >= -tol]


def select_best(history: list[ValidationRecord]) -> Selection | None:
    """The validation to export (see the module docstring); None before the first candidate."""
    candidates = history[1:]  # history[0] is the baseline
    if not candidates:
        return None
    # A NaN objective (a trained reward with no finite score) is never the best.
    within = [r for r in candidates if not r.breached and math.isfinite(r.objective)]
    if within:
        best = max(within, key=lambda r: (r.objective, -r.iteration))  # earliest of equal objectives
        reason = (
            f"highest validated objective {best.objective:.4f} among {len(within)} of {len(candidates)} validations "
            "within the out-of-domain tolerance"
        )
        if len(within) < len(candidates):
            late = [r.iteration for r in candidates if r.breached]
            reason += f" (beyond it: iterations {late})"
        return Selection(best.iteration, reason, True)
    last = candidates[-1]
    return Selection(
        last.iteration,
        f"every validation breached the out-of-domain tolerance ({', '.join(last.breached)} at the last): "
        "exporting the last checkpoint",
        False,
    )


def early_stop_reason(
    history: list[ValidationRecord], stop_after_breaches: int | None, patience: int | None
) -> str | None:
    """Why to stop after the last validation of ``history``, or None to go on.

    - breaches: the last ``stop_after_breaches`` candidates all breached the tolerance;
    - patience: the best objective among the candidates was reached more than ``patience``
      validations ago (the baseline counts as the first best, so a run that never improves on the
      untrained weights stops too).
    """
    candidates = history[1:]
    if stop_after_breaches is not None and len(candidates) >= stop_after_breaches:
        recent = candidates[-stop_after_breaches:]
        if all(r.breached for r in recent):
            names = sorted({m for r in recent for m in r.breached})
            return (
                f"{stop_after_breaches} validations in a row breached the out-of-domain tolerance "
                f"({', '.join(names)}; iterations {[r.iteration for r in recent]})"
            )
    if patience is not None and len(history) > patience:
        scored = [i for i in range(len(history)) if math.isfinite(history[i].objective)]
        best_at = max(scored, key=lambda i: (history[i].objective, -i)) if scored else 0
        if len(history) - 1 - best_at >= patience:
            return (
                f"the objective has not improved for {len(history) - 1 - best_at} validations (best "
                f"{history[best_at].objective:.4f} at iteration {history[best_at].iteration})"
            )
    return None


# --------------------------------------------------------------------------- the validation set


def validation_prompt_indices(num_prompts: int, available: int) -> list[int]:
    """``num_prompts`` indices evenly spaced over ``available`` training prompts: ``⌊i·U/P⌋``.

    Evenly spaced rather than the first P, so a prompt file sorted by class (as the shapes task's
    is) is covered across its classes. Fewer prompts than asked: every prompt once.
    """
    count = min(num_prompts, available)
    return [i * available // count for i in range(count)]


def validation_chunks(rows: int, micro_batch: int) -> list[range]:
    """Row ranges of ``micro_batch`` rows; chunk c is sampled by rank ``c mod W`` (the same chunks,
    hence the same batches and images, at every world size)."""
    return [range(start, min(start + micro_batch, rows)) for start in range(0, rows, micro_batch)]


# --------------------------------------------------------------------------- during a run


class Validator:
    """``train.validation`` during one run: the fixed set, its history, the best checkpoint and early stop.

    Built by the trainer at setup from the bundles it loaded (the policy, the prompt set, the rewards).
    :meth:`validate` is collective (every rank calls it); the trainer hands its record to the callbacks.
    The history travels in each checkpoint (:meth:`checkpoint_files`) and comes back with :meth:`resume`.
    """

    def __init__(
        self,
        settings: ValidationSection,
        algorithm: AlgorithmConfig,
        policy: Policy,
        prompt_set: PromptSet,
        rewards: RewardSet,
        *,
        decode_micro_batch: int,
        ctx: DistContext,
        checkpoints: CheckpointManager,
        log_event: Callable[[dict[str, Any]], None],
    ) -> None:
        self.settings = settings
        self.policy, self.prompt_set = policy, prompt_set
        self.ctx, self.checkpoints, self.log_event = ctx, checkpoints, log_event
        self.decode_micro_batch = decode_micro_batch
        self.truncate_timestep = algorithm.truncate_timestep
        # The fixed set: prompts of the training split, seeds, the scored rewards and the run's σ grid
        # (the rollout's; the ODE sampler has no noise).
        prompts = prompt_set.prompts
        self.prompt_indices = validation_prompt_indices(settings.num_prompts, len(prompts))
        if settings.num_prompts > len(prompts) and ctx.is_main:
            print(
                f"g2rpo train: train.validation.num_prompts = {settings.num_prompts} but the training split holds "
                f"{len(prompts)} prompts: validating on all {len(prompts)}",
                file=sys.stderr,
                flush=True,
            )
        self.metrics = list(settings.metrics or rewards.names)
        self.weights = {name: weight for name, weight in zip(rewards.names, rewards.weights) if weight != 0}
        picked = [list(rewards.names).index(name) for name in self.metrics]
        self.reward_models = [rewards.models[i] for i in picked]
        self.reward_batch = [rewards.batch[i] for i in picked]
        image_tokens = policy.velocity.latent_shape[0]
        if algorithm.grid == "flux":
            self.sigmas = core.flux_sigmas(algorithm.num_steps, image_tokens)  # [T+1]
        else:
            self.sigmas = core.static_shift_sigmas(algorithm.num_steps, algorithm.shift)  # [T+1]
        self.history: list[ValidationRecord] = []
        self.stop_reason: str | None = None  # early stop, decided after each validation

    def identity(self) -> dict[str, Any]:
        """What a validation history is only comparable under (stored with it; a resume must match)."""
        return {
            "prompt_indices": self.prompt_indices,
            "seeds": list(self.settings.seeds),
            "metrics": self.metrics,
            "max_regression": dict(self.settings.max_regression),
        }

    def checkpoint_files(self) -> dict[str, Any]:
        """The JSON files a checkpoint of this run carries: :data:`VALIDATION_FILE`."""
        return {VALIDATION_FILE: {"identity": self.identity(), "history": [r.as_json() for r in self.history]}}

    def resume(self, checkpoint: Path) -> None:
        """Continue the validation history (and so the best-so-far and the stop decision) of ``checkpoint``."""
        stored_path = checkpoint / VALIDATION_FILE
        if not stored_path.is_file():
            raise G2RPOError(
                problem(
                    "train.validation.enabled",
                    True,
                    f"checkpoint {checkpoint.name} was written without validation, so the run has no baseline at "
                    "iteration 0: resume with train.validation.enabled=false, or start a new output.dir",
                )
            )
        fix = "resume from another checkpoint (train.resume=PATH of an earlier one) or restore it from a copy"
        identity, history = read_validation_file(stored_path, fix)
        if identity != self.identity():
            raise G2RPOError(
                problem(
                    "train.validation",
                    self.identity(),
                    f"differs from the validation set and tolerance of the run's history ({identity}): "
                    "resume with the validation settings in the run's config.yaml, or start a new output.dir",
                )
            )
        self.history = history
        self._protect_best()
        self.stop_reason = early_stop_reason(self.history, self.settings.stop_after_breaches, self.settings.patience)

    @torch.no_grad()
    def validate(self, iteration: int) -> tuple[ValidationRecord, Selection | None]:
        """Sample and score the fixed set with the current weights (collective: every rank calls it);
        record it, update the best checkpoint and decide on an early stop. Returns the record and the
        checkpoint the export would take now.

        Rows are (prompt, seed) pairs in prompt-major order, cut into chunks of ``micro_batch``;
        rank r samples chunks r, r + W, … (:func:`validation_chunks`), and every rank gathers every
        chunk's scores, so the record is the one process's at any W. A rank with no chunk left in a
        round samples chunk 0 again and drops it: under ZeRO-3 every forward gathers weights from all
        ranks, so all of them must run the same forwards.
        """
        ctx, settings = self.ctx, self.settings
        start = time.perf_counter()
        rows = [(p, seed) for p in self.prompt_indices for seed in settings.seeds]
        chunks = validation_chunks(len(rows), settings.micro_batch)
        mine: dict[int, list[list[float]]] = {}
        velocity = self.policy.velocity
        with _timestep_mode(velocity, "truncate" if self.truncate_timestep else velocity.timestep_mode):
            for round_start in range(0, len(chunks), ctx.world_size):
                index = round_start + ctx.rank
                chunk = chunks[index] if index < len(chunks) else chunks[0]
                prompts = [rows[i][0] for i in chunk]
                images = sample_rows(
                    velocity,
                    self.policy.vae,
                    self.prompt_set.conditioning_of(prompts),
                    [rows[i][1] for i in chunk],
                    self.sigmas,
                    micro_batch=len(chunk),
                    decode_micro_batch=self.decode_micro_batch,
                )  # [n, 3, H, W]
                texts = [self.prompt_set.prompts[p] for p in prompts]
                scores = score_rewards(self.reward_models, images, texts, self.reward_batch)  # [R', n]
                if index < len(chunks):
                    mine[index] = scores.double().tolist()
        gathered = [mine]
        if ctx.distributed:
            gathered = [None] * ctx.world_size
            torch.distributed.all_gather_object(gathered, mine)
        by_chunk = {index: values for part in gathered for index, values in part.items()}
        summaries = {
            name: summarize_metric([v for c in range(len(chunks)) for v in by_chunk[c][r]])
            for r, name in enumerate(self.metrics)
        }
        means = {name: summary.mean for name, summary in summaries.items()}
        baseline = {n: m.mean for n, m in self.history[0].metrics.items()} if self.history else means
        record = ValidationRecord(
            iteration=iteration,
            metrics=summaries,
            objective=objective(means, self.weights),
            breached=breached_metrics(means, baseline, dict(settings.max_regression)),
            forwards=len(rows) * (self.sigmas.numel() - 1),
            seconds=time.perf_counter() - start,
            changes={name: means[name] - baseline[name] for name in means},
        )
        self.history.append(record)
        selection = self._protect_best()
        self.log_event(
            {
                "event": "validation",
                **record.as_json(),
                "selected_iteration": None if selection is None else selection.iteration,
            }
        )
        reason = early_stop_reason(self.history, settings.stop_after_breaches, settings.patience)
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
            self.log_event({"event": "early_stop", "iteration": iteration, "reason": reason})
            if ctx.is_main:
                print(f"g2rpo train: early stop at iteration {iteration}: {reason}", file=sys.stderr, flush=True)
        return record, selection

    def selection(self) -> Selection | None:
        """The validated checkpoint to export (None before the first candidate)."""
        return select_best(self.history)

    def _protect_best(self) -> Selection | None:
        """The checkpoint the export would take now; retention keeps it (locally; the S3 mirror asks)."""
        selection = select_best(self.history)
        self.checkpoints.protected = set() if selection is None else {selection.iteration}
        return selection

    def summary(
        self, selection: Selection | None, training_forwards: int, training_seconds: float
    ) -> ValidationSummary:
        """The run summary's validation block: the curve, the chosen iteration and why, the stop, the cost.

        Validation cost: every validation of the run (the history survives a resume). Training cost (the
        trainer's): the iterations this process ran, forwards of every rank, seconds of rank 0.
        """
        return ValidationSummary(
            curve=[
                CurvePoint(
                    iteration=r.iteration,
                    objective=r.objective,
                    breached=r.breached,
                    means={name: m.mean for name, m in r.metrics.items()},
                )
                for r in self.history
            ],
            selected_iteration=None if selection is None else selection.iteration,
            selection_reason=None if selection is None else selection.reason,
            within_tolerance=None if selection is None else selection.within_tolerance,
            early_stop=self.stop_reason,
            exported_best=bool(selection and self.settings.select_best),
            cost=ValidationCost(
                validation_forwards=sum(r.forwards for r in self.history),
                validation_seconds=sum(r.seconds for r in self.history),
                training_forwards=training_forwards,
                training_seconds=training_seconds,
            ),
        )


@contextmanager
def _timestep_mode(velocity: FluxVelocity, mode: str) -> Iterator[None]:
    """Feed the model σ as the run's sampler does: the strategy truncates σ itself when
    ``algorithm.truncate_timestep`` is set (the adapter then passes it raw), the ODE sampler does not."""
    previous = velocity.timestep_mode
    velocity.timestep_mode = mode
    try:
        yield
    finally:
        velocity.timestep_mode = previous
