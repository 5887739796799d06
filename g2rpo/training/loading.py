"""What a run builds at set-up, before its first iteration: the policy (the transformer, the VAE and
the velocity adapter over them), the prompts and their conditioning, the reward heads, and the learner
(the strategy, the driver that owns the optimiser, the EMA). :meth:`g2rpo.training.trainer.Trainer.setup`
calls these in order; each returns a small frozen bundle that the trainer and its
:class:`~g2rpo.training.validation.Validator` hold, and decides nothing the config does not say.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo.data import EmbeddingCache, dedupe_prompts, read_prompt_location
from g2rpo.errors import G2RPOError, problem
from g2rpo.models.flux import FluxConditioning, FluxVelocity, vae_scale_factor_of
from g2rpo.models.loading import load_text_encoder, load_transformer, load_vae, resolve_model_location
from g2rpo.models.tiny import save_tiny_flux
from g2rpo.rewards.base import RewardModel
from g2rpo.rewards.registry import build_reward
from g2rpo.seeding import derive_seed
from g2rpo.strategies.base import StatefulStrategy, Strategy
from g2rpo.strategies.registry import build_strategy
from g2rpo.training.distributed import DistContext
from g2rpo.training.drivers import EMA, DeepSpeedDriver, TorchDriver, apply_lora, trainable_tensors
from g2rpo.training.run_config import RunConfig, deepspeed_rank_problem

__all__ = [
    "Learner",
    "Policy",
    "PromptSet",
    "RewardSet",
    "build_driver",
    "build_learner",
    "check_conditioning_fits",
    "load_policy",
    "load_prompts",
    "load_rewards",
    "report_duplicates",
]


@dataclass(frozen=True)
class Policy:
    """The model a run trains: the transformer, the VAE that decodes its latents, and the velocity adapter."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    velocity: FluxVelocity

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return tuple(self.velocity.latent_shape)


@dataclass(frozen=True)
class PromptSet:
    """The unique training prompts, how many were read and dropped, and the conditioning of any global prompt index."""

    prompts: list[str]
    counts: dict[str, int]  # read, unique, duplicates (dropped)
    conditioning_of: Callable[[Iterable[int]], FluxConditioning]


@dataclass(frozen=True)
class RewardSet:
    """The reward heads in config order, with their names, weights and scoring batch sizes."""

    names: list[str]
    weights: list[float]
    models: list[RewardModel]
    batch: list[int]


@dataclass(frozen=True)
class Learner:
    """What updates the policy: the credit-assignment strategy, the driver that owns the optimiser (DeepSpeed
    or torch), and the EMA of the trainable tensors (None without ``train.ema``)."""

    strategy: Strategy
    driver: TorchDriver | DeepSpeedDriver
    ema: EMA | None

    def trainable(self) -> dict[str, torch.Tensor]:
        """The driver's trainable tensors by name (what the EMA averages and the export writes)."""
        return trainable_tensors(self.driver.module)

    @property
    def stateful_strategy(self) -> StatefulStrategy | None:
        """The strategy, when it carries state across iterations (checkpointed as strategy.pt)."""
        return self.strategy if isinstance(self.strategy, StatefulStrategy) else None


def model_root(cfg: RunConfig, ctx: DistContext) -> Path:
    """The local folder of ``model.path``: a folder (or ``file://``) as given; an ``s3://`` model fetched
    once into the verified cache (``g2rpo.artifacts.cache``: every file's sha256 checked). Each node's first
    rank downloads while the others wait, then finds it cached, so a node fetches the model once."""
    location = cfg.model.path
    if not location.startswith("s3://"):
        return resolve_model_location(location)
    if cfg.model.create_tiny:
        raise G2RPOError(problem("model.path", location, "model.create_tiny writes a local folder: give a path"))
    root = resolve_model_location(location) if ctx.local_rank == 0 else None
    ctx.barrier()
    return root if root is not None else resolve_model_location(location)


def load_policy(cfg: RunConfig, ctx: DistContext, root: Path | None = None) -> Policy:
    """Load (or, with ``model.create_tiny``, first write) the model from ``root`` (default
    :func:`model_root`); LoRA applied, on ``ctx.device``."""
    path = root if root is not None else model_root(cfg, ctx)
    if cfg.model.create_tiny and not path.exists():
        if ctx.is_main:
            save_tiny_flux(path)
        ctx.barrier()
    # Loaded in fp32: DeepSpeed's bf16 mode casts the module and keeps fp32 master weights of what it trains.
    # A LoRA run trains only the adapters (DeepSpeed keeps their fp32 masters): its frozen base is loaded in bf16 when
    # the run trains in bf16, since DeepSpeed would cast it so anyway. At FLUX.1-dev's size that is 24 GB
    # read and moved to the device instead of 48 GB, and no fp32 copy of the base on the device.
    frozen_bf16 = cfg.train.lora.enabled and cfg.train.precision == "bf16"
    transformer = load_transformer(path, dtype="bfloat16" if frozen_bf16 else "float32")
    vae = load_vae(path, dtype="bfloat16" if cfg.train.precision == "bf16" else "float32")
    vae.to(ctx.device).eval().requires_grad_(False)
    if cfg.train.lora.enabled:
        # Seeded from the run seed alone: every rank and every run of this seed starts from the
        # same adapters (a resume then loads the trained ones over them).
        apply_lora(transformer, cfg.train.lora, seed=derive_seed(cfg.train.seed, "lora-init"))
    velocity = FluxVelocity(
        transformer,
        height=cfg.model.height,
        width=cfg.model.width,
        vae_scale_factor=vae_scale_factor_of(vae),
        guidance=cfg.model.guidance,
        # The strategy truncates σ itself when algorithm.truncate_timestep is set; the adapter then
        # passes it as given.
        timestep_mode="raw" if cfg.algorithm.truncate_timestep else "pipeline",
        gradient_checkpointing=cfg.train.gradient_checkpointing,
    ).to(ctx.device)
    return Policy(transformer=transformer, vae=vae, velocity=velocity)


def load_prompts(cfg: RunConfig, root: Path | None = None) -> PromptSet:
    """Prompt texts and their conditioning for every global prompt index (CPU, read lazily
    from the embedding cache, or encoded once here with the text encoders of ``root`` (default
    ``model.path``) and the text encoders freed)."""
    data = cfg.data
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
        prompts = list(cache.prompts)
        counts = {"read": len(prompts) + dropped, "unique": len(prompts), "duplicates": dropped}
        return PromptSet(prompts, counts, cache.get)
    prompts, dropped = dedupe_prompts(read_prompt_location(data.prompts))
    counts = {"read": len(prompts) + dropped, "unique": len(prompts), "duplicates": dropped}
    dtype = "bfloat16" if cfg.train.precision == "bf16" else "float32"
    encoder = load_text_encoder(root or cfg.model.path, dtype=dtype, max_sequence_length=data.max_sequence_length)
    parts = [encoder.encode(prompts[i : i + 16]) for i in range(0, len(prompts), 16)]
    del encoder  # training holds only the transformer and the VAE
    table = FluxConditioning.cat(parts)
    return PromptSet(prompts, counts, lambda indices: table[torch.as_tensor(list(indices), dtype=torch.long)])


def report_duplicates(cfg: RunConfig, prompts: PromptSet, ctx: DistContext) -> dict[str, object] | None:
    """Say that duplicate prompts were dropped, if any: one line on stderr (rank 0), and the ``prompts``
    event for ``metrics.jsonl`` returned (None for a prompt set without duplicates; the summary has the counts)."""
    counts = prompts.counts
    if not counts["duplicates"]:
        return None
    source = cfg.data.prompts or cfg.data.embeddings
    if ctx.is_main:
        print(
            f"g2rpo train: {counts['duplicates']} duplicate prompt(s) in {source} dropped; training on "
            f"{counts['unique']} unique prompt(s) of {counts['read']}",
            file=sys.stderr,
            flush=True,
        )
    return {"event": "prompts", "source": source, **counts}


def check_conditioning_fits(cfg: RunConfig, prompts: PromptSet, transformer: torch.nn.Module) -> None:
    """The text embeddings' widths must be the transformer's (an embedding cache built with
    another model's text encoders would fail deep inside the first forward)."""
    cond = prompts.conditioning_of([0])
    config = transformer.config
    widths = {
        "T5 sequence width": (cond.prompt_embeds.shape[-1], config.joint_attention_dim),
        "CLIP pooled width": (cond.pooled_prompt_embeds.shape[-1], config.pooled_projection_dim),
    }
    wrong = {name: pair for name, pair in widths.items() if pair[0] != pair[1]}
    if wrong:
        data = cfg.data
        field, value = ("data.embeddings", data.embeddings) if data.embeddings else ("model.path", cfg.model.path)
        detail = "; ".join(f"{name} {have}, the transformer takes {want}" for name, (have, want) in wrong.items())
        raise G2RPOError(
            problem(
                field,
                value,
                f"the text embeddings do not fit {cfg.model.path}'s transformer ({detail}): build the "
                "cache with this model (`g2rpo data prep --model MODEL`), or train the model the cache was built for",
            )
        )


def load_rewards(cfg: RunConfig, device: torch.device) -> RewardSet:
    specs = cfg.rewards.models
    return RewardSet(
        names=[spec.name for spec in specs],
        weights=[spec.weight for spec in specs],
        models=[build_reward(spec, device=device, cache_dir=cfg.rewards.cache_dir) for spec in specs],
        batch=[cfg.rewards.batch_size_of(spec) for spec in specs],
    )


def build_driver(cfg: RunConfig, velocity: FluxVelocity, ctx: DistContext) -> TorchDriver | DeepSpeedDriver:
    """The optimiser's owner over the trainable parameters: DeepSpeed's engine, or plain torch on one process."""
    params = [p for p in velocity.parameters() if p.requires_grad]
    if cfg.deepspeed.enabled:
        return DeepSpeedDriver(velocity, params, cfg, ctx)
    if ranks := deepspeed_rank_problem(cfg.deepspeed.enabled, ctx.world_size):
        raise G2RPOError(ranks)
    return TorchDriver(velocity, params, cfg)


def build_learner(cfg: RunConfig, velocity: FluxVelocity, ctx: DistContext) -> Learner:
    """The strategy of ``algorithm``, the driver over ``velocity``'s trainable parameters, and the EMA of them."""
    strategy = build_strategy(cfg.algorithm)
    driver = build_driver(cfg, velocity, ctx)
    ema = (
        EMA(trainable_tensors(driver.module), cfg.train.ema.decay, cfg.train.ema.warmup)
        if cfg.train.ema.enabled
        else None
    )
    return Learner(strategy=strategy, driver=driver, ema=ema)
