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
same loop: :class:`DeepSpeedDriver` (``engine.backward`` / ``engine.step``; ZeRO 0–3, bf16 with fp32
master weights; gradient accumulation boundaries set from the strategy's terms, loss not rescaled
since the strategy already divides by |M|) and :class:`TorchDriver` (plain ``torch.optim.AdamW`` +
``clip_grad_norm_``, one process, fp32).

Random draws come only from :class:`g2rpo.seeding.Draws` keyed by (run seed, iteration, global
batch slot, k, branch): the slot is the prompt's position in the iteration's global batch (unique
even when a small prompt set repeats a prompt within an iteration), so the draws do not depend on
the number of ranks or on a resume.

Outputs under ``output.dir``: ``config.yaml`` (every default written out), ``metrics.jsonl`` (one
record per iteration: the step stats, rewards per model and stride, grad norm, lr, seconds per
phase), ``checkpoints/`` (see :mod:`g2rpo.training.checkpoint`) and ``export/``. ``metrics.jsonl`` is
appended to; after a resume the iterations after the checkpoint are written again, and a record
``{"event": "resumed", ...}`` marks where (readers keep the last record of each iteration).

Test hook: ``G2RPO_FAULT_KILL_AT=iteration:N`` (SIGKILL at the start of training phase of
iteration N) or ``checkpoint:N`` (SIGKILL after the weights of checkpoint N are written, before its
manifest) lets tests kill a real run at a known point.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from g2rpo.config import to_yaml
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.seeding import Draws, derive_seed
from g2rpo.strategies.base import StepStats, summarize_step
from g2rpo.training.checkpoint import CheckpointManager, TrainerState, export_model, is_complete, manifest_metadata
from g2rpo.training.distributed import DistContext, init_distributed, prompts_per_rank
from g2rpo.training.run_config import RunConfig, resume_hash, run_problems

__all__ = ["Trainer", "IterationRecord", "TorchDriver", "DeepSpeedDriver", "EMA", "apply_lora", "train_from_config"]

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


# --------------------------------------------------------------------------- drivers


class TorchDriver:
    """Plain single-process optimisation: ``loss.backward()``, clip, ``AdamW.step()``."""

    backend = "torch"

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], config: RunConfig) -> None:
        train = config.train
        self.module = module
        self.params = params
        self.max_grad_norm = train.max_grad_norm
        self.optimizer = torch.optim.AdamW(
            params,
            lr=train.learning_rate,
            betas=tuple(train.adam_betas),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )

    @property
    def policy(self) -> torch.nn.Module:
        return self.module

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def trainable_state(self) -> dict[str, torch.Tensor]:
        names = {id(p): n for n, p in self.module.named_parameters()}
        return {names[id(p)]: p.detach() for p in self.params}

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir(exist_ok=True)
        torch.save(self.trainable_state(), directory / "torch" / "model.pt")
        torch.save(self.optimizer.state_dict(), directory / "torch" / "optimizer.pt")

    def load(self, directory: Path) -> None:
        weights = torch.load(directory / "torch" / "model.pt", weights_only=True)
        current = self.trainable_state()
        if set(weights) != set(current):
            raise G2RPOError(
                f"checkpoint {directory} holds other trainable tensors than this model "
                f"({len(weights)} vs {len(current)}): resume with the config it was made with"
            )
        with torch.no_grad():
            for name, tensor in current.items():
                tensor.copy_(weights[name])
        self.optimizer.load_state_dict(torch.load(directory / "torch" / "optimizer.pt", weights_only=True))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module holds the full weights


class DeepSpeedDriver:
    """A DeepSpeed engine around the policy (ZeRO 0–3), driven through ``backward`` / ``step``."""

    backend = "deepspeed"

    def __init__(
        self, module: torch.nn.Module, params: list[torch.nn.Parameter], config: RunConfig, ctx: DistContext
    ) -> None:
        import deepspeed

        from g2rpo.training.deepspeed_config import build_deepspeed_config, validate_deepspeed_config

        train = config.train
        self.ds_config = build_deepspeed_config(
            config.deepspeed,
            precision=train.precision,
            max_grad_norm=train.max_grad_norm,
            world_size=ctx.world_size,
            accumulation_steps=1,  # boundaries come from the strategy's terms (set_gradient_accumulation_boundary)
        )
        validate_deepspeed_config(self.ds_config, ctx.world_size)
        optimizer = torch.optim.AdamW(
            params,
            lr=train.learning_rate,
            betas=tuple(train.adam_betas),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )
        if not ctx.distributed:
            # deepspeed.initialize wants a process group even for one rank.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        deepspeed.init_distributed(dist_backend="nccl" if ctx.device.type == "cuda" else "gloo", verbose=False)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=self.ds_config, dist_init_required=False
        )
        self.module = self.engine.module
        self.zero_stage = config.deepspeed.zero_stage

    @property
    def policy(self) -> Any:
        return self.engine  # engine(x, sigma, cond) runs the module's forward with ZeRO's hooks

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss, scale_wrt_gas=False)  # the strategy already scaled each term
        if not boundary:
            self.engine.step()  # a micro-step: DeepSpeed only counts it

    def zero_loss(self, rollout: Any) -> torch.Tensor:
        """A loss of exactly 0 made by one real forward of one row (padding for lock-step ranks).

        A real forward (not 0·Σθ) so that ZeRO-3 gathers and every stage's gradient hooks fire in
        the same order as for a loss term: ZeRO-2 packs gradients into reduction buckets in the
        order they arrive, and ranks must agree on it.
        """
        row = rollout.final_latents[:1]
        cond = rollout.cond[rollout.final_prompt[:1].to(torch.long)]
        sigma = torch.full((1,), 0.5, device=row.device)
        return self.engine(row, sigma, cond).sum() * 0.0

    def step(self) -> float | None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    @property
    def learning_rate(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag="state", save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(
            str(directory / "deepspeed"), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise G2RPOError(f"DeepSpeed found no checkpoint in {directory / 'deepspeed'}: the checkpoint is damaged")

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3: the consolidated 16-bit weights (rank 0; collective call). Else None."""
        if self.zero_stage != 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()


# --------------------------------------------------------------------------- LoRA, EMA


def apply_lora(transformer: torch.nn.Module, lora: Any, seed: int | None = None) -> None:
    """Add peft LoRA adapters to ``transformer`` (base weights frozen). A target that matches no
    module is an error listing close module names. peft draws the adapters' initial A from the
    global torch RNG; with ``seed`` that draw is made from ``torch.manual_seed(seed)`` in a forked
    RNG (the caller's RNG state is left as it was), so the same seed gives the same adapters."""
    import difflib

    from peft import LoraConfig

    names = [n for n, _ in transformer.named_modules() if n]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        suffixes = sorted({".".join(n.split(".")[-k:]) for n in names for k in (1, 2)})
        hints = {t: difflib.get_close_matches(t, suffixes, n=4) for t in missing}
        detail = "; ".join(f"{t!r} (close: {', '.join(h) or 'none'})" for t, h in hints.items())
        raise G2RPOError(
            problem(
                "train.lora.target_modules",
                list(lora.target_modules),
                f"no module of the transformer matches {detail}; use names of its Linear layers, e.g. to_q, to_k, to_v, to_out.0",
            )
        )
    # peft adapts Linear, Embedding and Conv layers only; a target that names another module (a
    # norm, a whole block) would fail inside peft with a traceback.
    supported = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    modules = dict(transformer.named_modules())
    unsupported = {
        t: sorted(
            {
                type(m).__name__
                for n, m in modules.items()
                if (n == t or n.endswith("." + t)) and not isinstance(m, supported)
            }
        )
        for t in lora.target_modules
    }
    unsupported = {t: kinds for t, kinds in unsupported.items() if kinds}
    if unsupported:
        detail = "; ".join(f"{t!r} matches {' and '.join(kinds)} modules" for t, kinds in unsupported.items())
        raise G2RPOError(
            problem(
                "train.lora.target_modules",
                list(lora.target_modules),
                f"LoRA adapts Linear layers only: {detail}; name Linear layers, e.g. to_q, to_k, to_v, to_out.0 "
                "(or the Linear inside a module, e.g. norm1.linear)",
            )
        )
    transformer.requires_grad_(False)
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        init_lora_weights="gaussian",
    )
    if seed is None:
        transformer.add_adapter(config)
        return
    with torch.random.fork_rng(devices=[]):  # the transformer is on the CPU here
        torch.manual_seed(seed)
        transformer.add_adapter(config)


class EMA:
    """Exponential moving average of named trainable tensors, kept in float32:
    ``θ_ema ← d·θ_ema + (1 − d)·θ`` after each optimiser step."""

    def __init__(self, named: dict[str, torch.Tensor], decay: float) -> None:
        self.decay = decay
        self.shadow = {n: t.detach().float().clone() for n, t in named.items()}

    @torch.no_grad()
    def update(self, named: dict[str, torch.Tensor]) -> None:
        for n, t in named.items():
            self.shadow[n].mul_(self.decay).add_(t.detach().float(), alpha=1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.shadow):
            raise G2RPOError("the checkpoint's EMA tensors do not match this model's trainable parameters")
        self.shadow = {n: t.float().clone() for n, t in state.items()}


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """``setup()`` once, then ``step()`` per iteration (returns an :class:`IterationRecord`), or ``run()``."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.hash = resume_hash(config)
        self.iteration = 0
        self._is_setup = False

    # ------------------------------------------------------------------ setup

    def setup(self) -> Trainer:
        cfg = self.config
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        self.ctx = init_distributed(cfg.train.device)
        problems = run_problems(cfg, self.ctx.world_size)
        if problems:
            raise ConfigError(problems, source="run config")
        self.per_rank = prompts_per_rank(cfg.train.prompts_per_iteration, self.ctx.world_size)
        if self.ctx.distributed and cfg.algorithm.optimizer_step != "per_iteration":  # see _optimise
            raise G2RPOError(
                problem(
                    "algorithm.optimizer_step",
                    cfg.algorithm.optimizer_step,
                    "with several ranks the trainer steps once per iteration (ranks may yield different numbers of "
                    "terms when groups are dropped): use per_iteration, or train on one process",
                )
            )
        self.out = Path(cfg.output.dir)
        self.checkpoints = CheckpointManager(
            self.out / "checkpoints",
            config_hash=self.hash,
            keep_last=cfg.train.keep_last,
            keep_iterations=cfg.train.keep_iterations,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            barrier=self.ctx.barrier,
        )
        resume_from = self._resume_point()
        self._load_models()
        self._load_data()
        self._check_conditioning_fits()
        self._load_rewards()
        from g2rpo.strategies import build_strategy

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
            state = self.checkpoints.load(resume_from, self.driver, self.ema)
            self.iteration = state.iteration
            self._log_event({"event": "resumed", "from": str(resume_from), "iteration": state.iteration})
            if self.ctx.is_main:  # the resumed run's config, next to the original (never overwritten)
                (self.out / f"config-resumed-iter-{state.iteration:06d}.yaml").write_text(to_yaml(cfg))
        elif self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.yaml").write_text(to_yaml(cfg))
            if (self.out / "metrics.jsonl").exists():  # a run killed before its first checkpoint
                self._log_event({"event": "restarted", "iteration": 0})
        self.ctx.barrier()
        self._is_setup = True
        return self

    def _resume_point(self) -> Path | None:
        """The checkpoint to resume from, or None for a fresh run (which needs an unused dir)."""
        resume = self.config.train.resume
        if resume not in ("auto", "never"):
            path = Path(resume)
            self.checkpoints.read_state(path)  # complete? same config hash? (raises otherwise)
            return path
        latest = self.checkpoints.latest_verified(self._log_event) if resume == "auto" else self.checkpoints.latest()
        if resume == "auto" and latest is not None:
            self.checkpoints.read_state(latest)
            return latest
        used = [p for p in ("metrics.jsonl", "export") if (self.out / p).exists()]
        if latest is not None:
            used.append(f"checkpoints/{latest.name}")
        if used and resume == "never":
            raise G2RPOError(
                problem(
                    "output.dir",
                    str(self.out),
                    f"already holds a run ({', '.join(used)}) and train.resume=never: choose a new output.dir, or "
                    "resume with train.resume=auto",
                )
            )
        if "export" in used:
            raise G2RPOError(
                problem(
                    "output.dir",
                    str(self.out),
                    "holds a finished run's export/ and no checkpoint: choose a new output.dir",
                )
            )
        if (self.out / "config.yaml").exists() and self.ctx.is_main:
            previous = (self.out / "config.yaml").read_text()
            if previous != to_yaml(self.config) and (self.out / "metrics.jsonl").exists():
                raise G2RPOError(
                    problem(
                        "output.dir",
                        str(self.out),
                        "holds metrics of a run with another config and no checkpoint to resume: choose a new output.dir",
                    )
                )
        return None

    def _load_models(self) -> None:
        from g2rpo.models.flux import FluxVelocity, vae_scale_factor_of
        from g2rpo.models.loading import load_transformer, load_vae

        cfg = self.config
        path = Path(cfg.model.path)
        if cfg.model.create_tiny and not path.exists():
            from g2rpo.models.tiny import save_tiny_flux

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
        from g2rpo.data import EmbeddingCache, dedupe_prompts, read_prompt_location

        data = self.config.data
        if data.embeddings:
            cache = EmbeddingCache(data.embeddings)
            if data.prompts:
                wanted, _ = dedupe_prompts(read_prompt_location(data.prompts))
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
            self._conditioning_of = cache.get
            return
        from g2rpo.models.flux import FluxConditioning
        from g2rpo.models.loading import load_text_encoder

        self.prompts, _ = dedupe_prompts(read_prompt_location(data.prompts))
        dtype = "bfloat16" if self.config.train.precision == "bf16" else "float32"
        encoder = load_text_encoder(self.config.model.path, dtype=dtype, max_sequence_length=data.max_sequence_length)
        parts = [encoder.encode(self.prompts[i : i + 16]) for i in range(0, len(self.prompts), 16)]
        del encoder  # training holds only the transformer and the VAE
        table = FluxConditioning.cat(parts)
        self._conditioning_of = lambda indices: table[torch.as_tensor(list(indices), dtype=torch.long)]

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
        from g2rpo.rewards.registry import build_reward

        self.reward_models = [
            build_reward(spec, device=self.ctx.device, cache_dir=self.config.rewards.cache_dir) for spec in specs
        ]
        self.reward_batch = [self.config.rewards.batch_size_of(spec) for spec in specs]

    def _trainable(self) -> dict[str, torch.Tensor]:
        module = self.driver.module if hasattr(self, "driver") else self.velocity
        return {n: p for n, p in module.named_parameters() if p.requires_grad}

    # ------------------------------------------------------------------ one iteration

    def step(self) -> IterationRecord:
        """Train one iteration; returns its record (also appended to metrics.jsonl by rank 0)."""
        if not self._is_setup:
            self.setup()
        cfg, ctx = self.config, self.ctx
        from g2rpo.models.flux import decode_latents
        from g2rpo.training.distributed import global_prompt_indices

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
        _fault_point("iteration", self.iteration)
        with _timed(seconds, "training"):
            terms, grad_norm = self._optimise(rollout, advantages)
        stats = summarize_step(rollout, rewards, advantages, terms)
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
        if self.iteration % cfg.train.checkpoint_every == 0 or self.iteration in cfg.train.keep_iterations:
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
        rows = []
        for model, size in zip(self.reward_models, self.reward_batch):
            parts = [model.score(images[i : i + size], prompts[i : i + size]) for i in range(0, images.shape[0], size)]
            rows.append(torch.cat(parts).float().cpu())
        return torch.stack(rows)  # [R, N]

    def _global_mean(self, value: float) -> float:
        if not self.ctx.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t.item() / self.ctx.world_size)

    # ------------------------------------------------------------------ run, checkpoints, export

    def run(self) -> dict[str, Any]:
        """Train until ``train.iterations``, export, and return a summary."""
        if not self._is_setup:
            self.setup()
        cfg = self.config
        start = self.iteration
        first: IterationRecord | None = None
        last: IterationRecord | None = None
        bar = None
        if cfg.train.progress and self.ctx.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.train.iterations, initial=start, desc="g2rpo train", unit="it")
        while self.iteration < cfg.train.iterations:
            last = self.step()
            first = first or last
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{last.reward_mean_global:.4f}", loss=f"{last.stats.loss:.4g}")
        if bar is not None:
            bar.close()
        saved = is_complete(self.checkpoints.path(self.iteration))
        self.ctx.barrier()  # every rank has looked at the disk before anyone writes
        if not saved:
            self.save_checkpoint()
        export_dir = self.export() if cfg.output.export else None
        return {
            "iterations": self.iteration,
            "resumed_at": start,
            "first_reward": None if first is None else first.reward_mean_global,
            "last_reward": None if last is None else last.reward_mean_global,
            "output_dir": str(self.out),
            "export": None if export_dir is None else str(export_dir),
            "world_size": self.ctx.world_size,
            "backend": self.driver.backend,
        }

    def save_checkpoint(self) -> Path:
        state = TrainerState(
            iteration=self.iteration,
            data_cursor=self.iteration * self.config.train.prompts_per_iteration,
            config_hash=self.hash,
            world_size=self.ctx.world_size,
            backend=self.driver.backend,
            zero_stage=self.config.deepspeed.zero_stage if self.config.deepspeed.enabled else None,
        )
        return self.checkpoints.save(state, _FaultingDriver(self.driver, self.iteration), self.ema)

    def export(self) -> Path | None:
        """Export the trained transformer (or LoRA adapters) to ``output.dir/export`` (rank 0)."""
        cfg = self.config
        directory = self.out / "export"
        if is_complete(directory) and (manifest_metadata(directory) or {}).get("iterations") != self.iteration:
            # A longer run resumed after an earlier export: keep that one, write beside it.
            directory = self.out / f"export-iter-{self.iteration:06d}"
        already = is_complete(directory)  # e.g. a re-run of a finished job
        # Every rank decides on the same state of the disk, before rank 0 writes anything.
        self.ctx.barrier()
        if already:
            return directory
        gathered = self.driver.full_state_dict()  # collective under ZeRO-3
        if self.ctx.is_main:
            from g2rpo.models.loading import base_model_record

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
                extra={"base_model_record": record, "iterations": self.iteration, "ema": cfg.output.export_ema},
            )
        self.ctx.barrier()
        return directory

    # ------------------------------------------------------------------ logs

    def _append_metrics(self, record: dict[str, Any]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(_finite(record), sort_keys=True) + "\n")

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


def _fault_point(kind: str, iteration: int) -> None:
    """Tests: SIGKILL this process at a named point (G2RPO_FAULT_KILL_AT=kind:N)."""
    target = os.environ.get("G2RPO_FAULT_KILL_AT")
    if target and target == f"{kind}:{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)


class _FaultingDriver:
    """Passes save/load through; the checkpoint fault point fires after the weights are written."""

    def __init__(self, driver: Any, iteration: int) -> None:
        self._driver, self._iteration = driver, iteration

    def save(self, directory: Path) -> None:
        self._driver.save(directory)
        _fault_point("checkpoint", self._iteration)

    def load(self, directory: Path) -> None:
        self._driver.load(directory)


def _license_of(record: dict[str, Any]) -> dict[str, Any]:
    """The licence block of an export, from the models layer's record of the base model."""
    from g2rpo.training.checkpoint import FLUX_DEV_LICENSE

    if record.get("kind") == "tiny":
        return {"name": record.get("licence"), "url": record.get("licence_url"), "note": record.get("note")}
    return FLUX_DEV_LICENSE


def train_from_config(config: RunConfig) -> dict[str, Any]:
    """Run a whole training job from a validated config; returns the summary of :meth:`Trainer.run`.

    Under torchrun every rank calls this; the process group is left together at the end.
    """
    trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        if getattr(trainer, "ctx", None) is not None and sys.exc_info()[0] is None:
            trainer.ctx.shutdown()
