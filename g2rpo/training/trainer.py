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
:mod:`g2rpo.training.drivers`.

Random draws come only from :class:`g2rpo.seeding.Draws` keyed by (run seed, iteration, global
batch slot, k, branch): the slot is the prompt's position in the iteration's global batch (unique
even when a small prompt set repeats a prompt within an iteration), so the draws do not depend on
the number of ranks or on a resume.

Outputs under ``output.dir``, which holds nothing else (:mod:`g2rpo.training.run_dir`: the marker
``.g2rpo-run.json`` is written first, and a folder holding other files is refused): ``config.yaml``
(every default written out), ``metrics.jsonl`` (one record per iteration: the step stats, rewards
per model and stride, grad norm, lr, seconds per phase), ``checkpoints/`` (see
:mod:`g2rpo.training.checkpoint`) and ``export/``. ``metrics.jsonl`` is appended to; after a resume
the iterations after the checkpoint are written again, and a record ``{"event": "resumed", ...}``
marks where (:func:`g2rpo.training.metrics.read_iteration_records` keeps the last record of each
iteration). Duplicate prompts, dropped at set-up, are reported on stderr and as
``{"event": "prompts", "read", "unique", "duplicates", ...}``.

With ``train.validation`` the trainer holds a :class:`~g2rpo.training.validation.Validator`
(the held-out set, its history, the best checkpoint and early stop) and validates at iteration 0,
every ``every`` iterations and at the end (:meth:`Trainer.validate`: ``{"event": "validation",
...}``), checkpoints each validated iteration, may stop early (``{"event": "early_stop", ...}``),
and exports the best validated checkpoint instead of the last.

Callbacks (:class:`TrainerCallback`, passed as ``Trainer(config, callbacks=[...])``) see each
iteration's record and each checkpoint, on every rank. The resume tests kill a real run at the
fail points of :mod:`g2rpo.training.failpoints`.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from g2rpo.artifacts.storage import check_writable
from g2rpo.config import to_yaml
from g2rpo.data import EmbeddingCache, dedupe_prompts, read_prompt_location
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.models.flux import FluxConditioning, FluxVelocity, decode_latents, vae_scale_factor_of
from g2rpo.models.loading import base_model_record, load_text_encoder, load_transformer, load_vae
from g2rpo.models.tiny import save_tiny_flux
from g2rpo.progress import progress_bar
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.scoring import score_rewards
from g2rpo.seeding import Draws, derive_seed
from g2rpo.strategies import build_strategy
from g2rpo.strategies.base import StatefulStrategy, StepStats, summarize_step
from g2rpo.training.checkpoint import (
    FLUX_DEV_LICENSE,
    CheckpointManager,
    TrainerState,
    export_model,
    is_complete,
    manifest_metadata,
)
from g2rpo.training.distributed import global_prompt_indices, init_distributed, prompts_per_rank
from g2rpo.training.drivers import EMA, DeepSpeedDriver, TorchDriver, apply_lora
from g2rpo.training.failpoints import FailAfterSave, fail_point
from g2rpo.training.memory import is_out_of_memory, out_of_memory_message
from g2rpo.training.metrics import append_record
from g2rpo.training.preemption import Preempted, StopOnSignal
from g2rpo.training.run_config import RunConfig, resume_hash, run_problems
from g2rpo.training.run_dir import WriterClaim, check_run_dir, claim_run_dir
from g2rpo.training.validation import VALIDATION_FILE, Selection, ValidationRecord, Validator

# VALIDATION_FILE is re-exported: its home is g2rpo.training.validation.
__all__ = ["Trainer", "IterationRecord", "TrainerCallback", "train_from_config", "VALIDATION_FILE"]

PHASES = ("sampling", "decoding", "reward", "training")


@dataclass
class IterationRecord:
    """What :meth:`Trainer.step` returns: the strategy's step stats plus the trainer's numbers."""

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


class TrainerCallback:
    """What a callback may hook into; subclass it and override the methods you need.

    Called on every rank, in the order given, from inside the loop: a callback that should act
    once per run checks ``trainer.ctx.is_main``; one that does a collective must do it on every
    rank. An exception in a callback is not caught: it propagates out of ``step()`` / ``run()`` and
    stops the run like any other error (a resume continues from the last complete checkpoint).
    """

    def before_resume(self, trainer: Trainer) -> None:
        """During setup, after the start-up checks (``output.dir``, the process group, the config) and
        before the trainer looks for a checkpoint to resume from and loads the models. A callback that
        writes into ``output.dir`` here calls ``trainer.claim_output_dir()`` first (rank 0); the ranks
        meet at a barrier after it (the S3 mirror restores its newest checkpoint here)."""

    def on_iteration_end(self, trainer: Trainer, record: IterationRecord) -> None:
        """After each iteration, once its record is in ``metrics.jsonl`` and before its checkpoint.

        ``record`` is this rank's (its prompts, its seconds); ``record.as_json()`` is what rank 0
        wrote to ``metrics.jsonl``.
        """

    def on_checkpoint(self, trainer: Trainer, path: Path, iteration: int) -> None:
        """After the checkpoint of ``iteration`` is complete (manifest written) at ``path``."""

    def on_validation(self, trainer: Trainer, record: ValidationRecord, selection: Selection | None) -> None:
        """After each validation pass (``train.validation``), once its event is in ``metrics.jsonl`` and
        the early stop is decided (``trainer.stop_reason``); ``selection`` is the checkpoint the export
        would take now (None after the baseline)."""


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """``setup()`` once, then ``step()`` per iteration (returns an :class:`IterationRecord`), or ``run()``."""

    def __init__(self, config: RunConfig, callbacks: Sequence[TrainerCallback] = ()) -> None:
        self.config = config
        self.callbacks = list(callbacks)
        self.hash = resume_hash(config)
        self.iteration = 0
        self._is_setup = False
        self.claims: list[WriterClaim] = []  # this process's writer claims on output.dir (rank 0), released at the end
        self._training_cost = {"seconds": 0.0, "forwards": 0}  # this process, since it started

    # ------------------------------------------------------------------ setup

    def setup(self) -> Trainer:
        """Load everything a run needs; a setup that fails gives back the writer claim it took."""
        try:
            return self._setup()
        except BaseException:
            self.release_claims()
            raise

    def _setup(self) -> Trainer:
        cfg = self.config
        self.out = Path(cfg.output.dir)
        # Before any work, on every rank: the folders the run writes can be written, and output.dir holds
        # nothing but a run's files (g2rpo.training.run_dir).
        check_run_dir(self.out)
        if cfg.model.create_tiny and not Path(cfg.model.path).exists():
            check_writable(cfg.model.path, "model.path")
        if cfg.rewards.cache_dir:
            check_writable(cfg.rewards.cache_dir, "rewards.cache_dir")
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        self.ctx = init_distributed(cfg.train.device)
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
        if self.out.exists():
            self.claim_output_dir()
        self.checkpoints = CheckpointManager(
            self.out / "checkpoints",
            config_hash=self.hash,
            keep_last=cfg.train.keep_last,
            keep_iterations=cfg.train.keep_iterations,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            barrier=self.ctx.barrier,
        )
        for callback in self.callbacks:
            hook = getattr(callback, "before_resume", None)  # duck-typed callbacks may lack it
            if hook is not None:
                hook(self)
        self.ctx.barrier()  # what a callback restored is on disk before any rank looks
        resume_from = self.checkpoints.resume_point(cfg.train.resume, self.out, to_yaml(cfg), self._log_event)
        self._load_models()
        self._load_data()
        self._check_conditioning_fits()
        self._load_rewards()
        # Built on every run (a benchmark validates a run that does not); the loop uses it with train.validation.
        self.validator = self._build_validator()
        self.strategy = build_strategy(cfg.algorithm)
        params = [p for p in self.velocity.parameters() if p.requires_grad]
        if cfg.deepspeed.enabled:
            self.driver: TorchDriver | DeepSpeedDriver = DeepSpeedDriver(self.velocity, params, cfg, self.ctx)
        else:
            if self.ctx.distributed:
                raise G2RPOError(
                    problem(
                        "deepspeed.enabled",
                        False,
                        "several processes need DeepSpeed for data parallelism: set it to true",
                    )
                )
            self.driver = TorchDriver(self.velocity, params, cfg)
        self.ema = EMA(self._trainable(), cfg.train.ema.decay) if cfg.train.ema.enabled else None
        if resume_from is not None:
            state = self.checkpoints.load(resume_from, self.driver, self.ema, self._stateful_strategy())
            self.iteration = state.iteration
            if cfg.train.validation.enabled:
                self.validator.resume(resume_from)
            self._log_event({"event": "resumed", "from": str(resume_from), "iteration": state.iteration})
            if self.ctx.is_main:  # the resumed run's config, next to the original (never overwritten)
                (self.out / f"config-resumed-iter-{state.iteration:06d}.yaml").write_text(
                    to_yaml(cfg), encoding="utf-8"
                )
        elif self.ctx.is_main:
            self.claim_output_dir()  # a new folder: made now, with its claim and marker first
            (self.out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
            if (self.out / "metrics.jsonl").exists():  # a run killed before its first checkpoint
                self._log_event({"event": "restarted", "iteration": 0})
        self._report_prompts()
        self.ctx.barrier()
        self._is_setup = True
        return self

    def claim_output_dir(self) -> None:
        """Take this process's writer claim on ``output.dir`` (rank 0, once per setup): the folder is made,
        claimed and marked before anything else is written there (:func:`~g2rpo.training.run_dir.claim_run_dir`)."""
        if self.ctx.is_main and not self.claims:
            self.claims.append(claim_run_dir(self.out, self.hash))

    def _load_models(self) -> None:
        cfg = self.config
        path = Path(cfg.model.path)
        if cfg.model.create_tiny and not path.exists():
            if self.ctx.is_main:
                save_tiny_flux(path)
            self.ctx.barrier()
        # Loaded in fp32: DeepSpeed's bf16 mode casts the module and keeps fp32 master weights.
        transformer = load_transformer(path, dtype="float32")
        self.vae = load_vae(path, dtype="bfloat16" if cfg.train.precision == "bf16" else "float32")
        self.vae.to(self.ctx.device).eval().requires_grad_(False)
        if cfg.train.lora.enabled:
            # Seeded from the run seed alone: every rank and every run of this seed starts from the
            # same adapters (a resume then loads the trained ones over them).
            apply_lora(transformer, cfg.train.lora, seed=derive_seed(cfg.train.seed, "lora-init"))
        self.velocity = FluxVelocity(
            transformer,
            height=cfg.model.height,
            width=cfg.model.width,
            vae_scale_factor=vae_scale_factor_of(self.vae),
            guidance=cfg.model.guidance,
            # The strategy truncates σ itself when algorithm.truncate_timestep is set; the adapter then
            # passes it as given.
            timestep_mode="raw" if cfg.algorithm.truncate_timestep else "pipeline",
            gradient_checkpointing=cfg.train.gradient_checkpointing,
        ).to(self.ctx.device)
        self.transformer = transformer
        self.latent_shape = tuple(self.velocity.latent_shape)

    def _load_data(self) -> None:
        """Prompt texts and their conditioning for every global prompt index (CPU, read lazily
        from the embedding cache, or encoded once here and the text encoders freed)."""
        data = self.config.data
        if data.embeddings:
            cache = EmbeddingCache(data.embeddings)
            dropped = 0  # a cache holds unique prompts (`g2rpo data prep` reported its duplicates)
            if data.prompts:
                wanted, dropped = dedupe_prompts(read_prompt_location(data.prompts))
                if wanted != cache.prompts:
                    raise G2RPOError(
                        problem(
                            "data.embeddings",
                            data.embeddings,
                            f"holds other prompts than {data.prompts}: rebuild it with `g2rpo data prep`, or leave "
                            "data.prompts empty to train on the cache's prompts",
                        )
                    )
            self.prompts = list(cache.prompts)
            self.prompt_counts = {
                "read": len(self.prompts) + dropped,
                "unique": len(self.prompts),
                "duplicates": dropped,
            }
            self._conditioning_of = cache.get
            return
        self.prompts, dropped = dedupe_prompts(read_prompt_location(data.prompts))
        self.prompt_counts = {"read": len(self.prompts) + dropped, "unique": len(self.prompts), "duplicates": dropped}
        dtype = "bfloat16" if self.config.train.precision == "bf16" else "float32"
        encoder = load_text_encoder(self.config.model.path, dtype=dtype, max_sequence_length=data.max_sequence_length)
        parts = [encoder.encode(self.prompts[i : i + 16]) for i in range(0, len(self.prompts), 16)]
        del encoder  # training holds only the transformer and the VAE
        table = FluxConditioning.cat(parts)
        self._conditioning_of = lambda indices: table[torch.as_tensor(list(indices), dtype=torch.long)]

    def _report_prompts(self) -> None:
        """Say that duplicate prompts were dropped, if any: one line on stderr and a ``prompts`` event
        in metrics.jsonl (a prompt set without duplicates adds nothing; the summary has the counts)."""
        counts = self.prompt_counts
        if not counts["duplicates"]:
            return
        source = self.config.data.prompts or self.config.data.embeddings
        if self.ctx.is_main:
            print(
                f"g2rpo train: {counts['duplicates']} duplicate prompt(s) in {source} dropped; training on "
                f"{counts['unique']} unique prompt(s) of {counts['read']}",
                file=sys.stderr,
                flush=True,
            )
        self._log_event({"event": "prompts", "source": source, **counts})

    def _check_conditioning_fits(self) -> None:
        """The text embeddings' widths must be the transformer's (an embedding cache built with
        another model's text encoders would fail deep inside the first forward)."""
        cond = self._conditioning_of([0])
        config = self.transformer.config
        widths = {
            "T5 sequence width": (cond.prompt_embeds.shape[-1], config.joint_attention_dim),
            "CLIP pooled width": (cond.pooled_prompt_embeds.shape[-1], config.pooled_projection_dim),
        }
        wrong = {name: pair for name, pair in widths.items() if pair[0] != pair[1]}
        if wrong:
            data = self.config.data
            field, value = (
                ("data.embeddings", data.embeddings) if data.embeddings else ("model.path", self.config.model.path)
            )
            detail = "; ".join(f"{name} {have}, the transformer takes {want}" for name, (have, want) in wrong.items())
            raise G2RPOError(
                problem(
                    field,
                    value,
                    f"the text embeddings do not fit {self.config.model.path}'s transformer ({detail}): build the "
                    "cache with this model (`g2rpo data prep --model MODEL`), or train the model the cache was built for",
                )
            )

    def _load_rewards(self) -> None:
        specs = self.config.rewards.models
        self.reward_names = [spec.name for spec in specs]
        self.reward_weights = [spec.weight for spec in specs]
        self.reward_models = [
            build_reward(spec, device=self.ctx.device, cache_dir=self.config.rewards.cache_dir) for spec in specs
        ]
        self.reward_batch = [self.config.rewards.batch_size_of(spec) for spec in specs]

    def _build_validator(self) -> Validator:
        cfg = self.config
        return Validator(
            cfg.train.validation,
            cfg.algorithm,
            velocity=self.velocity,
            vae=self.vae,
            prompts=self.prompts,
            conditioning_of=self._conditioning_of,
            reward_names=self.reward_names,
            reward_weights=self.reward_weights,
            reward_models=self.reward_models,
            reward_batch=self.reward_batch,
            decode_micro_batch=cfg.train.decode_micro_batch,
            ctx=self.ctx,
            checkpoints=self.checkpoints,
            log_event=self._log_event,
        )

    def _stateful_strategy(self) -> StatefulStrategy | None:
        """The strategy, when it carries state across iterations (checkpointed as strategy.pt)."""
        return self.strategy if isinstance(self.strategy, StatefulStrategy) else None

    def _trainable(self) -> dict[str, torch.Tensor]:
        module = self.driver.module if hasattr(self, "driver") else self.velocity
        return {n: p for n, p in module.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ one iteration

    def step(self) -> IterationRecord:
        """Train one iteration; returns its record (also appended to metrics.jsonl by rank 0)."""
        if not self._is_setup:
            self.setup()
        cfg, ctx = self.config, self.ctx
        if cfg.train.validation.enabled and self.iteration == 0 and not self.validator.history:
            self.validate()  # the baseline: the weights before any update
        batch = global_prompt_indices(
            cfg.train.seed, self.iteration, cfg.train.prompts_per_iteration, len(self.prompts)
        )
        slots = list(range(ctx.rank * self.per_rank, (ctx.rank + 1) * self.per_rank))
        indices = [batch[s] for s in slots]
        draws = Draws(cfg.train.seed, self.iteration, tuple(slots))
        cond = self._conditioning_of(indices).to(ctx.device)
        seconds = dict.fromkeys(PHASES, 0.0)

        with _timed(seconds, "sampling"), torch.no_grad():
            rollout = self.strategy.rollout(self.driver.policy, cond, draws, self.latent_shape, device=ctx.device)
        with _timed(seconds, "decoding"):
            images = decode_latents(
                self.vae,
                rollout.final_latents,
                cfg.model.height,
                cfg.model.width,
                micro_batch=cfg.train.decode_micro_batch,
            )  # [N, 3, H, W] in [0, 1]
        with _timed(seconds, "reward"):
            texts = [self.prompts[indices[int(p)]] for p in rollout.final_prompt]
            rewards = self._score(images, texts).reshape(rollout.reward_layout(len(self.reward_models)))  # [R, *shape]
            advantages = self.strategy.advantages(rollout, rewards, self.reward_weights)
        fail_point("iteration", self.iteration)
        with _timed(seconds, "training"):
            terms, grad_norm = self._optimise(rollout, advantages)
        stats = summarize_step(rollout, rewards, advantages, terms, self.reward_weights)
        self._training_cost["seconds"] += sum(seconds.values())
        self._training_cost["forwards"] += stats.sampling_forwards + stats.training_forwards
        record = IterationRecord(
            iteration=self.iteration,
            stats=stats,
            grad_norm=grad_norm,
            learning_rate=self.driver.learning_rate,
            seconds=seconds,
            reward_names=self.reward_names,
            reward_mean_global=self._global_mean(stats.reward_mean_all),
            prompt_indices=indices,
            extra={"world_size": ctx.world_size, "rank": ctx.rank, "decoded_images": int(images.shape[0])},
        )
        self.iteration += 1
        if ctx.is_main:
            self._append_metrics(record.as_json())
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

        One process: the strategy's ``step_optimizer`` flags close the steps. Several ranks must
        issue the same collectives in the same order — ZeRO-2/3 reduce gradients inside every
        backward, ZeRO-3 also gathers weights inside every forward — but a rank whose groups were
        dropped (NaN reward) yields fewer terms. So the ranks advance in lock-step rounds: each
        takes its next term, or, when it has none left, a zero loss made by a real one-row forward
        (same modules, same gather/reduce order as a term); one all-reduce tells whether any rank
        still had a term; if so every rank back-propagates what it holds, else the zero losses
        close the accumulation and all ranks step together. Cost: one extra one-row forward and
        backward per iteration, and a scalar all-reduce per term.
        """
        terms, grad_norm = [], None
        stream = self.strategy.loss_terms(self.driver.policy, rollout, advantages)
        if not self.ctx.distributed:
            for term in stream:
                self.driver.backward(term.loss, boundary=term.step_optimizer)
                terms.append(term.detached())
                if term.step_optimizer:
                    grad_norm = self._optimizer_step()
            return terms, grad_norm
        while True:
            term = next(stream, None)
            loss = term.loss if term is not None else self.driver.zero_loss(rollout)
            flag = torch.tensor([0 if term is None else 1], dtype=torch.long)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            last_round = int(flag.item()) == 0
            self.driver.backward(loss, boundary=last_round)
            if term is not None:
                terms.append(term.detached())
            if last_round:
                break
        return terms, self._optimizer_step()

    def _optimizer_step(self) -> float | None:
        norm = self.driver.step()
        if self.ema is not None:
            self.ema.update(self._trainable())
        return norm

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Rewards ``[R, N]``. A NaN/inf score is kept: the strategy drops its group and counts it."""
        return score_rewards(self.reward_models, images, prompts, self.reward_batch)  # [R, N]

    # ------------------------------------------------------------------ validation

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
        return self.validator.stop_reason if hasattr(self, "validator") else None

    def _global_mean(self, value: float) -> float:
        if not self.ctx.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t.item() / self.ctx.world_size)

    # ------------------------------------------------------------------ run, checkpoints, export

    def run(self) -> dict[str, Any]:
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

    def _run(self) -> dict[str, Any]:
        if not self._is_setup:
            self.setup()
        cfg = self.config
        start = self.iteration
        first: IterationRecord | None = None
        last: IterationRecord | None = None
        bar = None
        if cfg.train.progress and self.ctx.is_main:
            bar = progress_bar(total=cfg.train.iterations, initial=start, desc="g2rpo train", unit="it")
        with StopOnSignal(cfg.train.stop_grace_s, announce=self.ctx.is_main) as stop:
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
        if bar is not None:
            bar.close()
        validating, history = cfg.train.validation.enabled, self.validator.history
        if validating and (not history or history[-1].iteration != self.iteration):
            self.validate()  # the end of a run whose length is not a multiple of validation.every
        saved = is_complete(self.checkpoints.path(self.iteration))
        self.ctx.barrier()  # every rank has looked at the disk before anyone writes
        if not saved:
            self.save_checkpoint()
        selection = self.validator.selection() if validating else None
        export_dir = self.export(selection) if cfg.output.export else None
        return {
            "iterations": self.iteration,
            "resumed_at": start,
            "first_reward": None if first is None else first.reward_mean_global,
            "last_reward": None if last is None else last.reward_mean_global,
            "output_dir": str(self.out),
            "export": None if export_dir is None else str(export_dir),
            "world_size": self.ctx.world_size,
            "backend": self.driver.backend,
            "prompts": dict(self.prompt_counts),  # read, unique, duplicates (dropped)
            "validation": self._validation_summary(selection),
        }

    def _preempted(self, signum: int, stop: StopOnSignal) -> Preempted:
        """Checkpoint the iteration just finished (unless it already is) and say so: the stop's exception."""
        path = self.checkpoints.path(self.iteration)
        saved = is_complete(path)
        self.ctx.barrier()  # every rank has looked at the disk before anyone writes
        if not saved:
            self.save_checkpoint()
        stop.done()
        self._log_event({"event": "preempted", "iteration": self.iteration, "signal": signal.Signals(signum).name})
        stopped = Preempted(signum, self.iteration, str(path))
        if self.ctx.is_main:
            print(f"g2rpo train: {stopped}", file=sys.stderr, flush=True)
        return stopped

    def _validation_summary(self, selection: Selection | None) -> dict[str, Any] | None:
        if not self.config.train.validation.enabled:
            return None
        training_forwards = round(self._global_mean(float(self._training_cost["forwards"])) * self.ctx.world_size)
        return self.validator.summary(selection, training_forwards, self._training_cost["seconds"])

    def save_checkpoint(self) -> Path:
        state = TrainerState(
            iteration=self.iteration,
            data_cursor=self.iteration * self.config.train.prompts_per_iteration,
            config_hash=self.hash,
            world_size=self.ctx.world_size,
            backend=self.driver.backend,
            zero_stage=self.config.deepspeed.zero_stage if self.config.deepspeed.enabled else None,
        )
        json_files = self.validator.checkpoint_files() if self.config.train.validation.enabled else None
        stateful = self._stateful_strategy()
        path = self.checkpoints.save(
            state,
            FailAfterSave(self.driver, self.iteration),
            self.ema,
            json_files,
            strategy_state=None if stateful is None else stateful.state_dict(),
        )
        for callback in self.callbacks:
            callback.on_checkpoint(self, path, self.iteration)
        return path

    def export(self, selection: Selection | None = None) -> Path | None:
        """Export the trained transformer (or LoRA adapters) to ``output.dir/export`` (rank 0).

        With a ``selection`` (validation on, ``select_best``) the weights of its checkpoint are
        loaded first (collective), so the export is the best validated iteration, not the last.
        """
        cfg = self.config
        if selection is not None and not cfg.train.validation.select_best:
            selection = None
        chosen = self.iteration if selection is None else selection.iteration
        directory = self.out / "export"
        if is_complete(directory) and (manifest_metadata(directory) or {}).get("iterations") != self.iteration:
            # A longer run resumed after an earlier export: keep that one, write beside it.
            directory = self.out / f"export-iter-{self.iteration:06d}"
        already = is_complete(directory)  # e.g. a re-run of a finished job
        # Every rank decides on the same state of the disk, before rank 0 writes anything.
        self.ctx.barrier()
        if already:
            return directory
        if chosen != self.iteration:
            self.checkpoints.load(self.checkpoints.path(chosen), self.driver, self.ema)
        gathered = self.driver.full_state_dict()  # collective under ZeRO-3
        if self.ctx.is_main:
            transformer = self.transformer
            state_dict = None
            if gathered is not None:
                prefix = "transformer."
                state_dict = {k[len(prefix) :]: v for k, v in gathered.items() if k.startswith(prefix)}
            if cfg.output.export_ema and self.ema is not None:
                # Training is over: the module's weights may take the EMA values for the export.
                with torch.no_grad():
                    for name, tensor in self._trainable().items():
                        tensor.copy_(self.ema.shadow[name].to(tensor.dtype))
            record = base_model_record(cfg.model.path)
            export_model(
                transformer,
                directory,
                base_model=cfg.model.base_model_name,
                config_hash=self.hash,
                lora=cfg.train.lora.enabled,
                state_dict=state_dict,
                license_info=_license_of(record),
                extra={
                    "base_model_record": record,
                    "iterations": self.iteration,
                    "ema": cfg.output.export_ema,
                    "selected_iteration": chosen,
                    "selection_reason": "the last iteration" if selection is None else selection.reason,
                },
            )
        self.ctx.barrier()
        return directory

    # ------------------------------------------------------------------ logs

    def _append_metrics(self, record: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        append_record(self.out / "metrics.jsonl", _finite(record))

    def _log_event(self, event: dict[str, Any]) -> None:
        if self.ctx.is_main:
            self._append_metrics({"time": time.time(), **event})


# --------------------------------------------------------------------------- helpers


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] += time.perf_counter() - start


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _license_of(record: dict[str, Any]) -> dict[str, Any]:
    """The licence block of an export, from the models layer's record of the base model."""
    if record.get("kind") == "tiny":
        return {"name": record.get("licence"), "url": record.get("licence_url"), "note": record.get("note")}
    return FLUX_DEV_LICENSE


def train_from_config(config: RunConfig, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """Run a whole training job from a validated config; returns the summary of :meth:`Trainer.run`.

    Under torchrun every rank calls this; the process group is left together at the end.
    """
    trainer = Trainer(config, callbacks)
    try:
        return trainer.run()
    finally:
        trainer.release_claims()
        if getattr(trainer, "ctx", None) is not None and sys.exc_info()[0] is None:
            trainer.ctx.shutdown()
