"""The metrics g2rpo exports: names, types, labels, and the registries that hold them.

Names follow Prometheus' conventions: the ``g2rpo_`` prefix, base units (``_seconds``, ``_bytes``,
timestamps as ``_timestamp_seconds``), ``_total`` on counters, ``_info`` on info metrics. Labels are
low-cardinality only (``run_id``, ``pipeline``, ``reward``, ``stride``, ``phase``, ``metric``, ``model``,
``version``, ``outcome``, ``reason``, ...): never a prompt, a URI or a file path.

Every family lives in its own :class:`~prometheus_client.CollectorRegistry` (one per training
exporter, one per push), never in the client's global one, so two runs in one process (the tests)
do not share series and a push carries exactly its step's metrics.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from g2rpo import __version__

__all__ = [
    "PHASE_BUCKETS",
    "TrainingMetrics",
    "build_info",
    "normal_interval",
]

# Seconds of one phase of one iteration: tiny CPU runs take well under a second, Flux.1-dev
# iterations minutes.
PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, math.inf)
_RUN = ("run_id", "pipeline")


def build_info(registry: CollectorRegistry) -> Info:
    """``g2rpo_build_info{version}``: which g2rpo produced the series."""
    info = Info("g2rpo_build", "The g2rpo package version that exported these series", registry=registry)
    info.info({"version": __version__})
    return info


class TrainingMetrics:
    """The training process's series, labelled with its ``run_id`` and ``pipeline``.

    :meth:`observe_iteration` takes one iteration's numbers as plain values (what the trainer's
    ``IterationRecord`` holds), :meth:`observe_checkpoint` a completed checkpoint,
    :meth:`observe_memory` the accelerator's memory.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        run_id: str,
        pipeline: str,
        strategy: str = "",
        model: str = "",
        target_iterations: int | None = None,
        process_metrics: bool = True,
    ) -> None:
        self.run = {"run_id": run_id, "pipeline": pipeline}
        r = registry
        build_info(r)
        run_info = Info("g2rpo_training_run", "The run's strategy and base model", list(_RUN), registry=r)
        run_info.labels(**self.run).info({"strategy": strategy, "model": model})
        if process_metrics:  # process_resident_memory_bytes, process_cpu_seconds_total, ... (host side)
            ProcessCollector(registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, [*_RUN, *labels], registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(_RUN), registry=r)

        self.iteration = gauge("g2rpo_training_iteration", "Iterations completed (the next iteration's index)")
        self.target_iterations = gauge("g2rpo_training_target_iterations", "train.iterations: where the run stops")
        self.last_iteration_time = gauge(
            "g2rpo_training_last_iteration_timestamp_seconds", "Unix time the last iteration completed"
        )
        self.reward_mean = gauge(
            "g2rpo_training_reward_mean",
            "Mean finite reward of this iteration, per reward model and stride",
            "reward",
            "stride",
        )
        self.reward_std = gauge(
            "g2rpo_training_reward_std",
            "Standard deviation of this iteration's finite rewards, per reward model and stride",
            "reward",
            "stride",
        )
        self.reward_global_mean = gauge(
            "g2rpo_training_reward_global_mean", "Mean finite reward of this iteration over all rewards and ranks"
        )
        self.advantage_mean = gauge("g2rpo_training_advantage_mean", "Mean advantage of this iteration")
        self.advantage_std = gauge("g2rpo_training_advantage_std", "Standard deviation of the advantages")
        self.advantage_abs_max = gauge("g2rpo_training_advantage_abs_max", "Largest |advantage|")
        self.loss = gauge("g2rpo_training_loss", "Sum of the iteration's loss terms (NaN/inf: the run diverged)")
        self.clip_fraction = gauge(
            "g2rpo_training_clip_fraction", "Fraction of importance ratios outside the clip range (NaN: no loss term)"
        )
        self.ratio_mean = gauge("g2rpo_training_importance_ratio_mean", "Mean importance ratio of the update")
        self.ratio_max = gauge("g2rpo_training_importance_ratio_max", "Largest importance ratio of the update")
        self.grad_norm = gauge("g2rpo_training_grad_norm", "Global gradient norm before clipping (last optimiser step)")
        self.learning_rate = gauge("g2rpo_training_learning_rate", "Optimiser learning rate")
        self.iterations = counter("g2rpo_training_iterations_total", "Iterations completed by this process")
        self.groups = counter("g2rpo_training_groups_total", "Groups (prompts × strides) sampled on this rank")
        self.dropped_groups = counter(
            "g2rpo_training_dropped_groups_total", "Groups dropped for a NaN/inf reward on this rank"
        )
        self.sampling_forwards = counter(
            "g2rpo_training_sampling_forwards_total", "Transformer forwards while sampling (no grad) on this rank"
        )
        self.training_forwards = counter(
            "g2rpo_training_forwards_total", "Transformer forwards with grad while training on this rank"
        )
        self.training_backwards = counter("g2rpo_training_backwards_total", "Backward passes on this rank")
        self.reference_forwards = counter(
            "g2rpo_training_reference_forwards_total",
            "Forwards of the frozen reference policy in the loss (no grad; Flow-GRPO's KL) on this rank",
        )
        self.optimizer_steps = counter("g2rpo_training_optimizer_steps_total", "Optimiser steps")
        self.phase_seconds = Histogram(
            "g2rpo_training_phase_seconds",
            "Seconds per iteration spent in each phase (sampling, decoding, reward, training) on this rank",
            [*_RUN, "phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.memory = gauge(
            "g2rpo_training_accelerator_memory_bytes",
            "Accelerator memory of this process: allocated, reserved, peak_allocated",
            "device",
            "kind",
        )
        self.checkpoints = counter("g2rpo_training_checkpoints_total", "Complete checkpoints written by this process")
        self.last_checkpoint_time = gauge(
            "g2rpo_training_last_checkpoint_timestamp_seconds", "Unix time the last complete checkpoint was written"
        )
        self.last_checkpoint_iteration = gauge(
            "g2rpo_training_last_checkpoint_iteration", "Iteration of the last complete checkpoint"
        )
        self.validation_mean = gauge(
            "g2rpo_training_validation_mean",
            "Last validation's mean score per metric (fixed prompts and seeds, ODE sampler; train.validation)",
            "metric",
        )
        self.validation_ci = gauge(
            "g2rpo_training_validation_ci",
            "Bounds of the last validation's 95 % interval of the mean per metric (bound: low, high)",
            "metric",
            "bound",
        )
        self.validation_objective = gauge(
            "g2rpo_training_validation_objective", "Last validation's objective: the trained rewards' weighted sum"
        )
        self.validation_iteration = gauge("g2rpo_training_validation_iteration", "Iteration of the last validation")
        self.validation_breached = gauge(
            "g2rpo_training_validation_breached_metrics",
            "Out-of-domain metrics of the last validation beyond their tolerance of the first validation",
        )
        self.validation_selected = gauge(
            "g2rpo_training_validation_selected_iteration",
            "The validated iteration the export would take now (-1: none yet)",
        )
        self.validation_forwards = counter(
            "g2rpo_training_validation_forwards_total", "Transformer forwards of the validation passes (every rank)"
        )
        self.validation_seconds = counter(
            "g2rpo_training_validation_seconds_total", "Wall seconds of the validation passes on rank 0"
        )
        self.early_stopped = gauge(
            "g2rpo_training_early_stopped", "1 once the run stopped early (train.validation), else 0"
        )
        if target_iterations is not None:
            self.target_iterations.labels(**self.run).set(target_iterations)

    def observe_iteration(
        self,
        *,
        iteration: int,
        stats: Mapping[str, Any],
        reward_names: Sequence[str],
        reward_global_mean: float,
        grad_norm: float | None,
        learning_rate: float,
        seconds: Mapping[str, float],
        strides: Sequence[int] | None = None,
        now: float | None = None,
    ) -> None:
        """One iteration's numbers; ``stats`` is the strategy's step stats as a dict (``StepStats.as_dict()``)."""
        run = self.run
        self.iteration.labels(**run).set(iteration + 1)
        self.last_iteration_time.labels(**run).set(time.time() if now is None else now)
        for name, row, std_row in zip(reward_names, stats["reward_mean"], stats["reward_std"]):
            labels = [str(s) for s in strides] if strides is not None and len(strides) == len(row) else None
            for j, (value, std) in enumerate(zip(row, std_row)):
                stride = labels[j] if labels else str(j + 1)
                self.reward_mean.labels(**run, reward=name, stride=stride).set(value)
                self.reward_std.labels(**run, reward=name, stride=stride).set(std)
        self.reward_global_mean.labels(**run).set(reward_global_mean)
        self.advantage_mean.labels(**run).set(stats["advantage_mean"])
        self.advantage_std.labels(**run).set(stats["advantage_std"])
        self.advantage_abs_max.labels(**run).set(stats["advantage_abs_max"])
        self.loss.labels(**run).set(stats["loss"])
        self.clip_fraction.labels(**run).set(stats["clip_fraction"])
        self.ratio_mean.labels(**run).set(stats["ratio_mean"])
        self.ratio_max.labels(**run).set(stats["ratio_max"])
        self.grad_norm.labels(**run).set(math.nan if grad_norm is None else grad_norm)
        self.learning_rate.labels(**run).set(learning_rate)
        self.iterations.labels(**run).inc()
        self.groups.labels(**run).inc(stats["total_groups"])
        self.dropped_groups.labels(**run).inc(stats["dropped_groups"])
        self.sampling_forwards.labels(**run).inc(stats["sampling_forwards"])
        self.training_forwards.labels(**run).inc(stats["training_forwards"])
        self.training_backwards.labels(**run).inc(stats["training_backwards"])
        self.reference_forwards.labels(**run).inc(stats.get("reference_forwards", 0))
        self.optimizer_steps.labels(**run).inc(stats["optimizer_steps"])
        for phase, value in seconds.items():
            self.phase_seconds.labels(**run, phase=phase).observe(value)

    def observe_validation(
        self,
        *,
        iteration: int,
        metrics: Mapping[str, tuple[float, float, float]],
        objective: float,
        breached: int,
        forwards: int,
        seconds: float,
        selected_iteration: int | None,
        stopped: bool,
    ) -> None:
        """One validation pass; ``metrics`` maps a metric to its (mean, CI low, CI high)."""
        run = self.run
        for name, (mean, low, high) in metrics.items():
            self.validation_mean.labels(**run, metric=name).set(mean)
            self.validation_ci.labels(**run, metric=name, bound="low").set(low)
            self.validation_ci.labels(**run, metric=name, bound="high").set(high)
        self.validation_objective.labels(**run).set(objective)
        self.validation_iteration.labels(**run).set(iteration)
        self.validation_breached.labels(**run).set(breached)
        self.validation_selected.labels(**run).set(-1 if selected_iteration is None else selected_iteration)
        self.validation_forwards.labels(**run).inc(forwards)
        self.validation_seconds.labels(**run).inc(seconds)
        self.early_stopped.labels(**run).set(1 if stopped else 0)

    def observe_checkpoint(self, iteration: int, now: float | None = None) -> None:
        self.checkpoints.labels(**self.run).inc()
        self.last_checkpoint_time.labels(**self.run).set(time.time() if now is None else now)
        self.last_checkpoint_iteration.labels(**self.run).set(iteration)

    def observe_memory(self, device: str, allocated: int, reserved: int, peak_allocated: int) -> None:
        for kind, value in (("allocated", allocated), ("reserved", reserved), ("peak_allocated", peak_allocated)):
            self.memory.labels(**self.run, device=device, kind=kind).set(value)


def normal_interval(mean: float, std: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % normal-approximation interval of a mean of ``n`` values (NaN bounds for n < 2)."""
    if n < 2 or not math.isfinite(std):
        return math.nan, math.nan
    half = z * std / math.sqrt(n)
    return mean - half, mean + half
