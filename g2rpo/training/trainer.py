"""The G²RPO trainer: one written-out loop, on one process or many, with or without DeepSpeed.

One iteration (:meth:`Trainer.step`), on each rank, for the P prompts this rank holds::

    rollout    = strategy.rollout(policy, cond, draws)           # sample (no grad)
    images     = decode_latents(vae, rollout.final_latents)        # decode, micro-batched
    rewards    = [R, *rollout.reward_shape] from the reward models # reward
    advantages = strategy.advantages(rollout, rewards, weights)    # advantages
    for term in strategy.loss_terms(policy, rollout, advantages):  # loss
        driver.backward(term.loss, boundary=term.step_optimizer)   # optimiser (DeepSpeed or torch)
        if term.step_optimizer: driver.step(); ema.update()

The strategy decides what a loss term is and when the optimiser steps (one step per iteration by
default, or one per trained step k); the trainer owns ``backward`` and ``step``. Two drivers run the
same loop, :class:`~g2rpo.training.drivers.DeepSpeedDriver` and
:class:`~g2rpo.training.drivers.TorchDriver`; they, LoRA and the EMA live in
:mod:`g2rpo.training.drivers`. What set-up loads (policy, prompts, rewards, driver) is
:mod:`g2rpo.training.loading`; the end of a run's export, :mod:`g2rpo.training.export`.

Random draws come only from :class:`g2rpo.seeding.Draws` keyed by (run seed, iteration, global
batch slot, k, branch): the slot is the prompt's position in the iteration's global batch (unique
even when a small prompt set repeats a prompt within an iteration), so the draws do not depend on
the number of ranks or on a resume.

Outputs under ``output.dir`` (a :class:`~g2rpo.training.run_dir.RunDir`, resolved once), which
holds nothing else (the marker ``.g2rpo-run.json`` is written first; a folder holding other files
is refused): ``config.yaml`` (every default written out), ``metrics.jsonl`` (a record per iteration
and the events: resumed, restarted, prompts — duplicates dropped at set-up, also said on stderr —,
validation, early_stop, preempted; :mod:`g2rpo.training.metrics`), ``checkpoints/``
(:mod:`g2rpo.training.checkpoint`) and ``export/`` (:mod:`g2rpo.training.export`).

With ``train.validation`` the trainer holds a :class:`~g2rpo.training.validation.Validator`
(the held-out set, its history, the best checkpoint and early stop) and validates at iteration 0,
every ``every`` iterations and at the end (:meth:`Trainer.validate`: ``{"event": "validation",
...}``), checkpoints each validated iteration, may stop early (``{"event": "early_stop", ...}``),
and exports the best validated checkpoint instead of the last.

What set-up loads, the trainer holds as four frozen bundles of :mod:`g2rpo.training.loading` —
``policy`` (transformer, VAE, velocity adapter), ``prompt_set`` (prompts, counts, conditioning),
``reward_set`` (heads, names, weights, batch sizes) and ``learner`` (strategy, driver, EMA) — and hands
the first three to the validator. :meth:`Trainer.run` returns a :class:`RunSummary`.

Callbacks (:class:`~g2rpo.training.callbacks.TrainerCallback`, passed as
``Trainer(config, callbacks=[...])``) see each iteration's record and each checkpoint, on every
rank. The resume tests kill a real run at the fail points of :mod:`g2rpo.training.failpoints`.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from g2rpo.artifacts.cache import check_cache_writable
from g2rpo.artifacts.storage import check_writable
from g2rpo.config import to_yaml
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.models.flux import avoid_cudnn_attention, decode_latents
from g2rpo.progress import progress_bar
from g2rpo.rewards.scoring import score_rewards
from g2rpo.seeding import Draws
from g2rpo.strategies.base import summarize_step
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.checkpoint import CheckpointManager, TrainerState
from g2rpo.training.distributed import (
    DistContext,
    global_prompt_indices,
    init_distributed,
    lockstep_rounds,
    prompts_per_rank,
)
from g2rpo.training.export import export_run
from g2rpo.training.failpoints import FailAfterSave, fail_point
from g2rpo.training.loading import (
    Learner,
    Policy,
    PromptSet,
    RewardSet,
    build_learner,
    check_conditioning_fits,
    load_policy,
    load_prompts,
    load_rewards,
    model_root,
    report_duplicates,
)
from g2rpo.training.memory import is_out_of_memory, out_of_memory_message
from g2rpo.training.metrics import IterationRecord, MetricsLog
from g2rpo.training.preemption import Preempted, StopOnSignal
from g2rpo.training.preflight import run_problems
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.run_dir import RunDir, WriterClaim
from g2rpo.training.validation import Selection, ValidationRecord, ValidationSummary, Validator

__all__ = ["RunSummary", "Trainer", "train_from_config"]

PHASES = ("sampling", "decoding", "reward", "training")


@dataclass(frozen=True)
class RunSummary:
    """What :meth:`Trainer.run` returns; ``g2rpo train`` prints it and ``--summary-json`` writes it
    (:meth:`to_json`, keys in field order)."""

    iterations: int  # iterations trained when the run ended (train.iterations, or fewer after an early stop)
    resumed_at: int  # the iteration this process started from (0: a fresh run)
    first_reward: float | None  # reward_mean_global of this process's first iteration (None: it trained none)
    last_reward: float | None  # ... and of its last
    output_dir: str
    export: str | None  # the export folder (None with output.export false)
    world_size: int
    backend: str  # the driver's: torch or deepspeed
    prompts: dict[str, int]  # read, unique, duplicates (dropped)
    validation: ValidationSummary | None  # None without train.validation

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        """Back from :meth:`to_json` (a ``--summary-json`` file the trainer wrote)."""
        validation = data["validation"]
        return cls(**{**data, "validation": None if validation is None else ValidationSummary.from_json(validation)})


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """``setup()`` once, then ``step()`` per iteration (returns an :class:`IterationRecord`), or ``run()``."""

    # Made by setup(): the process group, the run's files, and the bundles of g2rpo.training.loading.
    ctx: DistContext
    metrics: MetricsLog
    checkpoints: CheckpointManager
    per_rank: int  # prompts per rank per iteration
    policy: Policy
    prompt_set: PromptSet
    reward_set: RewardSet
    validator: Validator  # built on every run (a benchmark validates a run that does not); used with train.validation
    learner: Learner

    def __init__(
        self, config: RunConfig, callbacks: Sequence[TrainerCallback] = (), run_dir: RunDir | None = None
    ) -> None:
        self.config = config
        self.callbacks = list(callbacks)
        self.hash = resume_hash(config)
        # output.dir, resolved once (the train step passes the one it resolved); everything below asks it for paths.
        self.run_dir = run_dir if run_dir is not None else RunDir.of(config)
        self.iteration = 0
        self._is_setup = False
        self.claims: list[WriterClaim] = []  # this process's writer claims on output.dir (rank 0), released at the end
        self._training_cost = {"seconds": 0.0, "forwards": 0}  # this process, since it started
        self._optimizer_seconds = 0.0
        self.stop: StopOnSignal | None = None  # the signal guard while run() trains (g2rpo.training.preemption)

    @property
    def out(self) -> Path:
        """``output.dir``."""
        return self.run_dir.root

    # ------------------------------------------------------------------ setup

    def setup(self) -> Trainer:
        """Load everything a run needs; a setup that fails gives back the writer claim it took."""
        try:
            return self._setup()
        except BaseException:
            self.release_claims()
            raise

    def _setup(self) -> Trainer:
        cfg, run_dir = self.config, self.run_dir
        # Before any work, on every rank: the folders the run writes can be written, and output.dir holds
        # nothing but a run's files (g2rpo.training.run_dir).
        run_dir.check()
        if cfg.model.create_tiny and "://" not in cfg.model.path and not Path(cfg.model.path).exists():
            check_writable(cfg.model.path, "model.path")
        if cfg.rewards.cache_dir:
            check_writable(cfg.rewards.cache_dir, "rewards.cache_dir")
        # s3:// models and reward weights are fetched into a cache: one that cannot be written is named
        # with the setting that moves it now, not as an OSError at the download.
        if cfg.model.path.startswith("s3://"):
            check_cache_writable(None)
        if any(spec.fetches for spec in cfg.rewards.models):
            check_cache_writable(cfg.rewards.cache_dir, "rewards.cache_dir")
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        # output.node_local: each node's first rank makes, claims and tidies its node's own output.dir.
        self.ctx = replace(init_distributed(cfg.train.device), node_local=cfg.output.node_local)
        avoid_cudnn_attention(self.ctx.device)  # its backward fails at FLUX.1-dev's shapes on an H200 (see there)
        self.metrics = MetricsLog(run_dir.metrics, self.ctx.is_main)
        problems = run_problems(cfg, self.ctx.world_size)
        if problems:
            raise ConfigError(problems, source="run config")
        self.per_rank = prompts_per_rank(cfg.train.prompts_per_iteration, self.ctx.world_size)
        multi_step = cfg.algorithm.settings.multi_step_setting(cfg.algorithm)
        if self.ctx.distributed and multi_step is not None:  # see _optimise
            raise G2RPOError(
                problem(
                    f"algorithm.{multi_step[0]}",
                    multi_step[1],
                    "with several ranks the trainer steps once per iteration (ranks may yield different numbers of "
                    "terms when groups are dropped): set optimizer_step per_iteration and the strategy's "
                    "trajectories_per_step null, or train on one process",
                )
            )
        # A folder that exists is claimed and marked as the run's before anything is written there; a new
        # one when the run first writes (its config.yaml, or a callback's restore), so a refused setup leaves none.
        if run_dir.root.exists():
            self.claim_output_dir()
        self.checkpoints = CheckpointManager(
            run_dir.checkpoints,
            config_hash=self.hash,
            keep_last=cfg.train.keep_last,
            keep_iterations=cfg.train.keep_iterations,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            barrier=self.ctx.barrier,
            node_local=self.ctx.node_local,
            leader=self.ctx.is_folder_leader,
            node_rank=self.ctx.node_rank,
        )
        for callback in self.callbacks:
            hook = getattr(callback, "before_resume", None)  # duck-typed callbacks may lack it
            if hook is not None:
                hook(self)
        self.ctx.barrier()  # what a callback restored is on disk before any rank looks
        resume_from = self.checkpoints.resume_point(cfg.train.resume, run_dir, to_yaml(cfg), self.metrics.event)
        root = model_root(cfg, self.ctx)  # an s3:// model is fetched here, once per node
        self.policy = load_policy(cfg, self.ctx, root)
        self.prompt_set = load_prompts(cfg, root)
        check_conditioning_fits(cfg, self.prompt_set, self.policy.transformer)
        self.reward_set = load_rewards(cfg, self.ctx.device)
        self.validator = Validator(
            cfg.train.validation,
            cfg.algorithm,
            self.policy,
            self.prompt_set,
            self.reward_set,
            decode_micro_batch=cfg.train.decode_micro_batch,
            ctx=self.ctx,
            checkpoints=self.checkpoints,
            log_event=self.metrics.event,
        )
        self.learner = build_learner(cfg, self.policy.velocity, self.ctx)
        if resume_from is not None:
            learner = self.learner
            state = self.checkpoints.load(resume_from, learner.driver, learner.ema, learner.stateful_strategy)
            self.iteration = state.iteration
            if cfg.train.validation.enabled:
                self.validator.resume(resume_from)
            self.metrics.event({"event": "resumed", "from": str(resume_from), "iteration": state.iteration})
            if self.ctx.is_main:  # the resumed run's config, next to the original (never overwritten)
                run_dir.resumed_config_yaml(state.iteration).write_text(to_yaml(cfg), encoding="utf-8")
        else:
            self.claim_output_dir()  # a new folder: made now, with its claim and marker first (each node's own too)
            if self.ctx.is_main:
                run_dir.config_yaml.write_text(to_yaml(cfg), encoding="utf-8")
                if run_dir.metrics.exists():  # a run killed before its first checkpoint
                    self.metrics.event({"event": "restarted", "iteration": 0})
        duplicates = report_duplicates(cfg, self.prompt_set, self.ctx)
        if duplicates is not None:
            self.metrics.event(duplicates)
        clamped = [f"algorithm.{line}" for line in cfg.algorithm.settings.clamped(cfg.algorithm)]
        if clamped:  # settings the step grid cannot honour: clamped as the reference code does, and said
            self.metrics.event({"event": "clamped", "settings": clamped})
            if self.ctx.is_main:
                for line in clamped:
                    print(f"g2rpo train: {line}", file=sys.stderr, flush=True)
        self.ctx.barrier()
        self._is_setup = True
        return self

    def claim_output_dir(self) -> None:
        """Take this process's writer claim on ``output.dir`` (rank 0, or each node's first rank with node-local
        folders; once per setup): the folder is made, claimed and marked before anything else is written there
        (:meth:`~g2rpo.training.run_dir.RunDir.claim`)."""
        if self.ctx.is_folder_leader and not self.claims:
            self.claims.append(self.run_dir.claim(self.hash))

    # ------------------------------------------------------------------ one iteration

    def step(self) -> IterationRecord:
        """Train one iteration; returns its record (also appended to metrics.jsonl by rank 0)."""
        if not self._is_setup:
            self.setup()
        cfg, ctx = self.config, self.ctx
        strategy, driver = self.learner.strategy, self.learner.driver
        prompts, reward_set = self.prompt_set.prompts, self.reward_set
        if self._baseline_due():
            self.validate()  # the baseline: the weights before any update
        batch = global_prompt_indices(cfg.train.seed, self.iteration, cfg.train.prompts_per_iteration, len(prompts))
        slots = list(range(ctx.rank * self.per_rank, (ctx.rank + 1) * self.per_rank))
        indices = [batch[s] for s in slots]
        draws = Draws(cfg.train.seed, self.iteration, tuple(slots))
        cond = self.prompt_set.conditioning_of(indices).to(ctx.device)
        seconds = dict.fromkeys(PHASES, 0.0)

        with _timed(seconds, "sampling", ctx.device), torch.no_grad():
            rollout = strategy.rollout(driver.policy, cond, draws, self.policy.latent_shape, device=ctx.device)
        with _timed(seconds, "decoding", ctx.device):
            images = decode_latents(
                self.policy.vae,
                rollout.final_latents,
                cfg.model.height,
                cfg.model.width,
                micro_batch=cfg.train.decode_micro_batch,
            )  # [N, 3, H, W] in [0, 1]
        with _timed(seconds, "reward", ctx.device):
            texts = [prompts[indices[int(p)]] for p in rollout.final_prompt]
            rewards = self._score(images, texts).reshape(rollout.reward_layout(len(reward_set.models)))  # [R, *shape]
            advantages = strategy.advantages(rollout, rewards, reward_set.weights)
        fail_point("iteration", self.iteration, signalled=lambda: self.stop is not None and self.stop.received)
        self._optimizer_seconds = 0.0  # the optimiser steps' share of "training" (timed in _optimizer_step)
        with _timed(seconds, "training", ctx.device):
            terms, grad_norm = self._optimise(rollout, advantages)
        stats = summarize_step(rollout, rewards, advantages, terms, reward_set.weights)
        self._training_cost["seconds"] += sum(seconds.values())
        self._training_cost["forwards"] += stats.sampling_forwards + stats.training_forwards
        record = IterationRecord(
            iteration=self.iteration,
            stats=stats,
            grad_norm=grad_norm,
            learning_rate=driver.learning_rate,
            seconds=seconds,
            reward_names=reward_set.names,
            reward_mean_global=ctx.mean(stats.reward_mean_all),
            prompt_indices=indices,
            extra={
                "world_size": ctx.world_size,
                "rank": ctx.rank,
                "decoded_images": int(images.shape[0]),
                "optimizer_seconds": self._optimizer_seconds,
            },
        )
        self.iteration += 1
        self.metrics.append(record.as_json())  # rank 0 writes
        for callback in self.callbacks:
            callback.on_iteration_end(self, record)
        validated = cfg.train.validation.enabled and self.iteration % cfg.train.validation.every == 0
        if validated:
            self.validate()
        # A validated iteration is checkpointed so that it can be exported if it turns out the best.
        if validated or self.iteration % cfg.train.checkpoint_every == 0 or self.iteration in cfg.train.keep_iterations:
            self.save_checkpoint()
        return record

    def _optimise(self, rollout: Any, advantages: Any) -> tuple[list[Any], float | None]:
        """Backward every loss term; step where the strategy says (see the module docstring).

        One process: the strategy's ``step_optimizer`` flags close the steps. Several ranks advance in
        lock-step rounds and step once, together, at the end (:func:`~g2rpo.training.distributed.lockstep_rounds`:
        a rank whose groups were dropped yields fewer terms, yet every rank must issue the same collectives).
        """
        terms, grad_norm = [], None
        driver = self.learner.driver
        stream = self.learner.strategy.loss_terms(driver.policy, rollout, advantages)
        if not self.ctx.distributed:
            for term in stream:
                driver.backward(term.loss, boundary=term.step_optimizer)
                terms.append(term.detached())
                if term.step_optimizer:
                    grad_norm = self._optimizer_step()
            return terms, grad_norm
        for loss, term, last_round in lockstep_rounds(stream, lambda: driver.zero_loss(rollout)):
            driver.backward(loss, boundary=last_round)
            if term is not None:
                terms.append(term.detached())
        return terms, self._optimizer_step()

    def _optimizer_step(self) -> float | None:
        seconds = {"optimizer": 0.0}
        with _timed(seconds, "optimizer", self.ctx.device):
            norm = self.learner.driver.step()
            if self.learner.ema is not None:
                self.learner.ema.update(self.learner.trainable())
        self._optimizer_seconds += seconds["optimizer"]
        return norm

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Rewards ``[R, N]``. A NaN/inf score is kept: the strategy drops its group and counts it."""
        return score_rewards(self.reward_set.models, images, prompts, self.reward_set.batch)  # [R, N]

    # ------------------------------------------------------------------ validation

    def _baseline_due(self) -> bool:
        """Whether the next step validates the weights before any update first."""
        return self.config.train.validation.enabled and self.iteration == 0 and not self.validator.history

    def validate(self) -> ValidationRecord:
        """Validate the current weights (collective; :meth:`Validator.validate`), then call the callbacks'
        ``on_validation``."""
        record, selection = self.validator.validate(self.iteration)
        for callback in self.callbacks:
            hook = getattr(callback, "on_validation", None)  # duck-typed callbacks may lack it
            if hook is not None:
                hook(self, record, selection)
        return record

    @property
    def stop_reason(self) -> str | None:
        """Why the run stops early (``train.validation``), or None to go on."""
        return self.validator.stop_reason

    # ------------------------------------------------------------------ run, checkpoints, export

    def run(self) -> RunSummary:
        """Train until ``train.iterations``, export, and return a summary; the writer claim ends with it."""
        try:
            return self._run()
        finally:
            self.release_claims()

    def release_claims(self) -> None:
        """Give up this process's writer claims on ``output.dir`` (:mod:`g2rpo.training.run_dir`)."""
        for claim in self.claims:
            claim.release()
        self.claims = []

    def _run(self) -> RunSummary:
        if not self._is_setup:
            self.setup()
        cfg = self.config
        start = self.iteration
        first: IterationRecord | None = None
        last: IterationRecord | None = None
        bar = None
        if self.ctx.is_main and self._baseline_due():
            # seconds before the first iteration on a CPU (the demo's 16 prompts × 2 seeds, progress bar off):
            # said, not silent, as a clamped setting is
            rows = f"{len(self.validator.prompt_indices)} prompt(s) × {len(cfg.train.validation.seeds)} seed(s)"
            print(
                f"g2rpo train: validating iteration 0, the weights before any update: {rows} …",
                file=sys.stderr,
                flush=True,
            )
        if cfg.train.progress and self.ctx.is_main:
            bar = progress_bar(total=cfg.train.iterations, initial=start, desc="g2rpo train", unit="it")
        with StopOnSignal(cfg.train.stop_grace_s, announce=self.ctx.is_main) as stop:
            self.stop = stop
            while self.iteration < cfg.train.iterations and self.stop_reason is None:
                try:
                    last = self.step()
                except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
                    # On the CPU torch reports an exhausted allocator as a RuntimeError ("can't allocate memory").
                    if isinstance(exc, RuntimeError) and not is_out_of_memory(exc):
                        raise
                    raise G2RPOError(out_of_memory_message(cfg, self.iteration, self.ctx.device, exc)) from exc
                first = first or last
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{last.reward_mean_global:.4f}", loss=f"{last.stats.loss:.4g}")
                signum = stop.requested(self.ctx)
                if signum is not None:  # preempted: keep this iteration, then leave (g2rpo.training.preemption)
                    if bar is not None:
                        bar.close()
                    raise self._preempted(signum, stop)
            # Training is done: a signal from here on lets the final checkpoint and export finish (within the
            # grace period) rather than killing the process mid-export.
            stop.finishing()
            if bar is not None:
                bar.close()
            validating, history = cfg.train.validation.enabled, self.validator.history
            if validating and (not history or history[-1].iteration != self.iteration):
                self.validate()  # the end of a run whose length is not a multiple of validation.every
            saved = self.checkpoints.has_complete(self.iteration)
            self.ctx.barrier()  # every rank has looked at the disk before anyone writes
            if not saved:
                self.save_checkpoint()
            selection = self.validator.selection() if validating else None
            export_dir = self.export(selection) if cfg.output.export else None
        return RunSummary(
            iterations=self.iteration,
            resumed_at=start,
            first_reward=None if first is None else first.reward_mean_global,
            last_reward=None if last is None else last.reward_mean_global,
            output_dir=str(self.out),
            export=None if export_dir is None else str(export_dir),
            world_size=self.ctx.world_size,
            backend=self.learner.driver.backend,
            prompts=dict(self.prompt_set.counts),
            validation=self._validation_summary(selection),
        )

    def _preempted(self, signum: int, stop: StopOnSignal) -> Preempted:
        """Checkpoint the iteration just finished (unless it already is) and say so: the stop's exception."""
        path = self.checkpoints.path(self.iteration)
        saved = self.checkpoints.has_complete(self.iteration)
        self.ctx.barrier()  # every rank has looked at the disk before anyone writes
        if not saved:
            self.save_checkpoint()
        stop.done()
        self.metrics.event({"event": "preempted", "iteration": self.iteration, "signal": signal.Signals(signum).name})
        stopped = Preempted(signum, self.iteration, str(path))
        if self.ctx.is_main:
            print(f"g2rpo train: {stopped}", file=sys.stderr, flush=True)
        return stopped

    def _validation_summary(self, selection: Selection | None) -> ValidationSummary | None:
        if not self.config.train.validation.enabled:
            return None
        training_forwards = round(self.ctx.mean(float(self._training_cost["forwards"])) * self.ctx.world_size)
        return self.validator.summary(selection, training_forwards, self._training_cost["seconds"])

    def save_checkpoint(self) -> Path:
        state = TrainerState(
            iteration=self.iteration,
            data_cursor=self.iteration * self.config.train.prompts_per_iteration,
            config_hash=self.hash,
            world_size=self.ctx.world_size,
            backend=self.learner.driver.backend,
            zero_stage=self.config.deepspeed.zero_stage if self.config.deepspeed.enabled else None,
        )
        json_files = self.validator.checkpoint_files() if self.config.train.validation.enabled else None
        stateful = self.learner.stateful_strategy
        path = self.checkpoints.save(
            state,
            FailAfterSave(self.learner.driver, self.iteration),
            self.learner.ema,
            json_files,
            strategy_state=None if stateful is None else stateful.state_dict(),
        )
        for callback in self.callbacks:
            callback.on_checkpoint(self, path, self.iteration)
        return path

    def export(self, selection: Selection | None = None) -> Path:
        """Export the trained transformer (or LoRA adapters) to ``output.dir/export`` (rank 0 writes;
        :func:`~g2rpo.training.export.export_run`).

        With a ``selection`` (validation on, ``select_best``) the weights of its checkpoint are
        loaded first (collective), so the export is the best validated iteration, not the last.
        """
        return export_run(
            self.config,
            self.run_dir,
            iteration=self.iteration,
            selection=selection,
            checkpoints=self.checkpoints,
            driver=self.learner.driver,
            ema=self.learner.ema,
            transformer=self.policy.transformer,
            trainable=self.learner.trainable,
            ctx=self.ctx,
            config_hash=self.hash,
        )


# --------------------------------------------------------------------------- helpers


@contextmanager
def _timed(seconds: dict[str, float], phase: str, device: torch.device) -> Iterator[None]:
    """Add the phase's wall seconds to ``seconds[phase]``. On CUDA the device is synchronised at both
    ends: kernels run asynchronously, so without it a phase would be charged for the previous one's
    queued work and not for its own."""
    _synchronize(device)
    start = time.perf_counter()
    try:
        yield
    finally:
        _synchronize(device)
        seconds[phase] += time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_from_config(
    config: RunConfig, callbacks: Sequence[TrainerCallback] = (), run_dir: RunDir | None = None
) -> RunSummary:
    """Run a whole training job from a validated config; returns the summary of :meth:`Trainer.run`.

    ``run_dir``: ``output.dir`` as the caller resolved it (:meth:`RunDir.of`). Under torchrun every rank
    calls this; the process group is left together at the end.
    """
    trainer = Trainer(config, callbacks, run_dir)
    try:
        return trainer.run()
    finally:
        trainer.release_claims()
        if sys.exc_info()[0] is None:  # the run ended, so its setup made the process group
            trainer.ctx.shutdown()
