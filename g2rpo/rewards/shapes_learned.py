"""Learned reward models for the shapes task: the testbed's analogues of the paper's CLIP and HPS-v2.1.

The exact shapes rewards (:mod:`g2rpo.rewards.shapes`) score an image the same whichever denoising
schedule made it, so on them a multi-granularity advantage is a rescaled single-stride one. The
paper trains on *learned* rewards (HPS-v2.1 + CLIP), whose scores move with a sample's artifacts.
This module trains two such models here, small enough to ship (a few MB each), and the training
then uses them while the exact rewards stay untouched ground truth (the gap between the two is
reward hacking, measured exactly). Measured since: on this testbed the strides rank a group's
branches alike on these learned rewards too (benchmarks/README.md, "do the strides disagree?").

- **shapes_clip** — image–text alignment, a tiny open_clip CLIP trained from scratch with CLIP's
  symmetric contrastive loss on renders (:func:`g2rpo.tasks.shapes.render`) of the pretraining
  scenes only (all but :func:`g2rpo.tasks.shapes.unseen_scenes`), each
  render augmented (shift, blur, colour jitter, noise), as CLIP was trained on real images and
  never on generations. Loaded by the ``clip`` head (:meth:`g2rpo.rewards.clip_score.CLIPScore.from_local_dir`).
- **shapes_pref** — a preference scorer: shapes_clip fine-tuned with a Bradley–Terry loss on pairs
  of the base model's own samples for the same prompt (pretraining prompts only, drawn at several
  step counts, so the pairs span the artifacts of coarse and fine schedules), the better of a pair
  being the one with the higher exact in-domain utility u = (shapes_colour + shapes_shape) / 2 —
  as HPS-v2 is CLIP fine-tuned on human rankings of generated images. Loaded by the ``hps_v21``
  head (:meth:`g2rpo.rewards.hps.HPSv21.from_checkpoint`, a folder with safetensors).

Architecture (both): open_clip's ``CLIP`` with a ViT image tower (64 px, 8 px patches, width 64,
3 layers) and a text transformer (open_clip's tokenizer, context 32, width 32, 2 layers), joint
embedding 32, mean/std of OpenAI CLIP; the score is the cosine of the two embeddings. Saved as an
open_clip ``local-dir`` folder: ``open_clip_config.json``, ``open_clip_model.safetensors`` (float16:
the tokenizer's 49,408-row embedding is most of the size), ``g2rpo_reward.json`` (settings, losses,
held-out accuracy) and the artifact manifest written last.

Held-out accuracy (:func:`reward_accuracy`), recorded in the marker and docs/models.md: on the
unseen scenes only — CLIP's retrieval of each render's prompt among all 360 and per attribute;
both models' Spearman correlation with u on the base model's samples of unseen prompts, and the
preference model's accuracy on their pairs.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from g2rpo.artifacts.manifest import has_manifest, mismatches, read_manifest, write_dir_manifest
from g2rpo.artifacts.storage import FileStore
from g2rpo.errors import G2RPOError, problem
from g2rpo.progress import progress_bar
from g2rpo.rewards.shapes import scene_scores
from g2rpo.tasks.shapes import BACKGROUNDS, IMAGE_SIZE, Scene, all_scenes, render, unseen_scenes

__all__ = [
    "REWARD_MARKER",
    "SHIPPED_SHAPES_CLIP",
    "SHIPPED_SHAPES_PREF",
    "RewardPretraining",
    "augment",
    "open_clip_config",
    "pretrain_shapes_rewards",
    "reward_accuracy",
    "spearman",
    "utility",
]

REWARD_MARKER = "g2rpo_reward.json"
# The shipped folders record the module's first name, g2rpo.models.shapes_rewards (moved here unchanged).
PRODUCER = "g2rpo.rewards.shapes_learned.pretrain_shapes_rewards"
MODELS = Path(__file__).resolve().parents[1] / "models"  # package data, beside the shapes Flux models
SHIPPED_SHAPES_CLIP = MODELS / "shapes_clip"
SHIPPED_SHAPES_PREF = MODELS / "shapes_pref"
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class RewardPretraining:
    """How the two learned rewards are made (the defaults made the shipped ones)."""

    seed: int = 0
    unseen: int = 96  # scenes left out of everything (the held-out and validation prompts)
    clip_steps: int = 2500
    clip_batch: int = 64
    clip_lr: float = 1e-3
    sample_steps: tuple[int, ...] = (2, 3, 4, 6, 8, 16)  # the base model's step counts for preference data
    samples_per_steps: int = 2  # samples per (prompt, step count)
    pref_steps: int = 1200
    pref_pairs: int = 48  # pairs per optimizer step
    pref_lr: float = 2e-4
    pref_margin: float = 0.02  # |Δu| below which a pair is a tie and left out


def open_clip_config() -> dict[str, Any]:
    """The ``open_clip_config.json`` of both models."""
    return {
        "model_cfg": {
            "embed_dim": 32,
            "vision_cfg": {"image_size": IMAGE_SIZE, "layers": 3, "width": 64, "head_width": 32, "patch_size": 8},
            "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
        },
        "preprocess_cfg": {
            "size": IMAGE_SIZE,
            "mean": list(OPENAI_MEAN),
            "std": list(OPENAI_STD),
            "interpolation": "bicubic",
            "resize_mode": "shortest",
        },
    }


def utility(scores: dict[str, torch.Tensor]) -> torch.Tensor:
    """u = (shapes_colour + shapes_shape) / 2, the exact in-domain utility the preferences follow."""
    return (scores["shapes_colour"] + scores["shapes_shape"]) / 2


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two ``[N]`` vectors (average ranks for ties)."""

    def ranks(x: torch.Tensor) -> torch.Tensor:
        order = x.double().argsort()
        r = torch.empty_like(order, dtype=torch.float64)
        r[order] = torch.arange(x.numel(), dtype=torch.float64)
        for value in x.unique():  # ties: the mean of their ranks
            tied = x == value
            if int(tied.sum()) > 1:
                r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float((ra.square().sum() * rb.square().sum()).sqrt())
    return float((ra * rb).sum()) / denominator if denominator > 0 else 0.0


def augment(images: torch.Tensor, backgrounds: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Renders ``[B, 3, S, S]`` in [0, 1] shifted (≤ 3 px, background filled in), blurred (σ ≤ 1.5 px),
    colour-jittered (gain 0.85–1.15, offset ±0.08 per channel) and noised (std ≤ 0.08).

    ``backgrounds`` ``[B, 3]`` is each render's background colour (the fill of the shift).
    """
    b, _, s, _ = images.shape
    shift = torch.randint(-3, 4, (b, 2), generator=gen)
    pad = 3
    canvas = backgrounds[:, :, None, None].expand(b, 3, s + 2 * pad, s + 2 * pad).clone()  # [B, 3, S+6, S+6]
    canvas[:, :, pad : pad + s, pad : pad + s] = images
    out = torch.stack(
        [canvas[i, :, pad - dy : pad - dy + s, pad - dx : pad - dx + s] for i, (dx, dy) in enumerate(shift.tolist())]
    )  # [B, 3, S, S]
    sigma = torch.rand(b, generator=gen) * 1.5  # [B]
    taps = torch.arange(-3, 4, dtype=torch.float32)  # [7]
    kernel = torch.exp(-(taps[None] ** 2) / (2 * sigma[:, None].clamp_min(1e-3) ** 2))  # [B, 7]
    kernel = kernel / kernel.sum(1, keepdim=True)
    rows = kernel[:, None, None, :].repeat_interleave(3, 0)  # [3B, 1, 1, 7]: one kernel per image and channel
    x = out.reshape(1, 3 * b, s, s)
    x = F.conv2d(F.pad(x, (3, 3, 0, 0), mode="replicate"), rows, groups=3 * b)
    x = F.conv2d(F.pad(x, (0, 0, 3, 3), mode="replicate"), rows.transpose(2, 3), groups=3 * b)
    out = x.reshape(b, 3, s, s)
    gain = 0.85 + 0.3 * torch.rand(b, 1, 1, 1, generator=gen)
    offset = (torch.rand(b, 3, 1, 1, generator=gen) - 0.5) * 0.16
    noise = torch.randn(out.shape, generator=gen) * torch.rand(b, 1, 1, 1, generator=gen) * 0.08
    return (out * gain + offset + noise).clamp(0, 1)


def _build(seed: int) -> tuple[torch.nn.Module, Any]:
    from g2rpo.rewards.openclip_loading import build_open_clip

    torch.manual_seed(seed)
    model, _, tokenizer = build_open_clip("shapes reward", "shapes-clip", open_clip_config())
    return model.train(), tokenizer


def _normalise(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(OPENAI_MEAN)[None, :, None, None]
    std = torch.tensor(OPENAI_STD)[None, :, None, None]
    return (images - mean) / std


def _scores(model: torch.nn.Module, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cosine of each image with its own text: ``[B]``."""
    image = model.encode_image(_normalise(images), normalize=True)  # [B, D]
    text = model.encode_text(tokens, normalize=True)  # [B, D]
    return (image * text).sum(-1)


def _train_clip(
    model: torch.nn.Module, tokenizer: Any, scenes: list[Scene], settings: RewardPretraining, progress: bool
) -> float:
    gen = torch.Generator().manual_seed(settings.seed)
    renders = torch.stack([render(s) for s in scenes])  # [N, 3, S, S]
    backgrounds = torch.tensor([BACKGROUNDS[s.background] for s in scenes])  # [N, 3]
    tokens = tokenizer([s.prompt for s in scenes])  # [N, 32]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.clip_lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, settings.clip_lr, total_steps=settings.clip_steps)
    batch = min(settings.clip_batch, len(scenes))
    loss = torch.tensor(float("nan"))
    for _ in progress_bar(range(settings.clip_steps), desc="shapes_clip", enabled=progress, leave=False):
        idx = torch.randperm(len(scenes), generator=gen)[:batch]
        x = augment(renders[idx], backgrounds[idx], gen)
        image = model.encode_image(_normalise(x), normalize=True)  # [b, D]
        text = model.encode_text(tokens[idx], normalize=True)  # [b, D]
        logits = model.logit_scale.exp().clamp(max=100) * image @ text.T  # [b, b]
        target = torch.arange(batch)
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return float(loss.detach())


Sampler = Callable[[list[str], int, int], torch.Tensor]  # (prompts, seed, steps) -> images [B, 3, S, S] in [0, 1]


@torch.no_grad()
def base_samples(
    sample: Sampler, scenes: Sequence[Scene], settings: RewardPretraining, *, seed: int, progress: bool = False
) -> tuple[torch.Tensor, list[str], torch.Tensor]:
    """The base model's samples of ``scenes`` at each of ``settings.sample_steps`` (``sample``, e.g.
    :func:`g2rpo.models.shapes.shapes_sampler`): ``(images [N, 3, S, S], prompts [N], utility [N])``,
    N = scenes × step counts × samples_per_steps."""

    prompts = [s.prompt for s in scenes for _ in range(settings.samples_per_steps)]
    images: list[torch.Tensor] = []
    for i, steps in enumerate(progress_bar(settings.sample_steps, desc="base samples", enabled=progress, leave=False)):
        for start in range(0, len(prompts), 256):
            images.append(sample(prompts[start : start + 256], seed + 1000 * i + start, steps))
    all_images = torch.cat(images).clamp(0, 1)  # [N, 3, S, S]
    all_prompts = prompts * len(settings.sample_steps)
    exact = [scene_scores(img, p) for img, p in zip(all_images, all_prompts, strict=True)]
    u = utility({k: torch.tensor([e[k] for e in exact]) for k in ("shapes_colour", "shapes_shape")})
    return all_images, all_prompts, u


def _pairs(prompts: list[str], u: torch.Tensor, margin: float) -> torch.Tensor:
    """``[P, 2]`` index pairs (better, worse) of samples of the same prompt whose utilities differ by > margin."""
    by_prompt: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(p, []).append(i)
    pairs = [
        (i, j) if u[i] > u[j] else (j, i)
        for idx in by_prompt.values()
        for a, i in enumerate(idx)
        for j in idx[a + 1 :]
        if abs(float(u[i] - u[j])) > margin
    ]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def _train_preference(
    model: torch.nn.Module,
    tokenizer: Any,
    images: torch.Tensor,
    prompts: list[str],
    u: torch.Tensor,
    settings: RewardPretraining,
    progress: bool,
) -> tuple[float, int]:
    gen = torch.Generator().manual_seed(settings.seed + 1)
    pairs = _pairs(prompts, u, settings.pref_margin)
    if len(pairs) == 0:
        raise G2RPOError(problem("pref_margin", settings.pref_margin, "leaves no preference pairs; lower it"))
    tokens = tokenizer(prompts)  # [N, 32]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.pref_lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, settings.pref_lr, total_steps=settings.pref_steps)
    loss = torch.tensor(float("nan"))
    for _ in progress_bar(range(settings.pref_steps), desc="shapes_pref", enabled=progress, leave=False):
        chosen = pairs[torch.randint(len(pairs), (settings.pref_pairs,), generator=gen)]  # [b, 2]
        flat = chosen.reshape(-1)  # [2b]: better, worse, better, worse, ...
        s = _scores(model, images[flat], tokens[flat]).reshape(-1, 2)  # [b, 2]
        # Bradley–Terry on the cosines, with the model's (learned) logit scale as HPS's training has.
        margin = model.logit_scale.exp().clamp(max=100) * (s[:, 0] - s[:, 1])  # [b]
        loss = F.softplus(-margin).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return float(loss.detach()), len(pairs)


@torch.no_grad()
def reward_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    held_out: Sequence[Scene],
    images: torch.Tensor,
    prompts: list[str],
    u: torch.Tensor,
    margin: float,
) -> dict[str, Any]:
    """How well ``model`` ranks on the unseen scenes (see the module docstring)."""
    model = model.eval()
    scenes = all_scenes()
    text = model.encode_text(tokenizer([s.prompt for s in scenes]), normalize=True)  # [360, D]
    renders = torch.stack([render(s) for s in held_out])  # [H, 3, S, S]
    image = model.encode_image(_normalise(renders), normalize=True)  # [H, D]
    best = (image @ text.T).argmax(1)  # [H]
    retrieved = [scenes[int(i)] for i in best]
    attribute = {
        name: sum(getattr(r, name) == getattr(s, name) for r, s in zip(retrieved, held_out, strict=True))
        / len(held_out)
        for name in ("shape", "colour", "size", "position", "background")
    }
    scores = torch.cat(
        [_scores(model, images[i : i + 256], tokenizer(prompts[i : i + 256])) for i in range(0, len(prompts), 256)]
    )  # [N]
    pairs = _pairs(prompts, u, margin)
    right = float((scores[pairs[:, 0]] > scores[pairs[:, 1]]).float().mean()) if len(pairs) else float("nan")
    return {
        "unseen_scenes": len(held_out),
        "render_retrieval_top1": round(
            sum(r == s for r, s in zip(retrieved, held_out, strict=True)) / len(held_out), 4
        ),
        "render_attribute_accuracy": {k: round(v, 4) for k, v in attribute.items()},
        "samples": len(prompts),
        "spearman_with_utility": round(spearman(scores, u), 4),
        "pairs": len(pairs),
        "pair_accuracy": round(right, 4),
    }


def _save(model: torch.nn.Module, out: Path, marker: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    (out / "open_clip_config.json").write_text(json.dumps(open_clip_config(), indent=2) + "\n", encoding="utf-8")
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "open_clip_model.safetensors"))
    (out / REWARD_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    write_dir_manifest(out, producer=PRODUCER, metadata={"settings": marker["settings"]})
    return out


def pretrain_shapes_rewards(
    output: str | Path,
    sample: Sampler,
    settings: RewardPretraining = RewardPretraining(),
    *,
    base_model: str = "shapes_flux_unseen",
    overwrite: bool = False,
    log: Callable[[str], None] = lambda _: None,
    progress: bool = False,
) -> tuple[Path, Path]:
    """Train shapes_clip and shapes_pref (module docstring) into ``output/shapes_clip`` and
    ``output/shapes_pref``; ``sample`` draws the base model's images whose preferences are ranked (a
    shapes model pretrained without the same unseen scenes, named ``base_model`` in the markers).
    Returns the two folders."""
    out = Path(output)
    targets = (out / "shapes_clip", out / "shapes_pref")
    for target in targets:
        if target.exists():
            if not overwrite:
                raise G2RPOError(problem("output", str(target), "exists; choose another output or pass --overwrite"))
            if not (target / REWARD_MARKER).is_file():
                raise G2RPOError(
                    problem("output", str(target), f"is not a learned reward folder (no {REWARD_MARKER}); not replaced")
                )
    started = time.monotonic()
    unseen = unseen_scenes(settings.unseen, settings.seed)
    seen = [s for s in all_scenes() if s not in unseen]
    held_out = sorted(unseen, key=lambda s: s.prompt)
    model, tokenizer = _build(settings.seed)
    clip_loss = _train_clip(model, tokenizer, seen, settings, progress)
    log(f"shapes_clip: {settings.clip_steps} steps, final loss {clip_loss:.4g} ({time.monotonic() - started:.0f} s)")
    images, prompts, u = base_samples(sample, seen, settings, seed=settings.seed, progress=progress)
    test_images, test_prompts, test_u = base_samples(
        sample, held_out, settings, seed=settings.seed + 7, progress=progress
    )
    clip_accuracy = reward_accuracy(model, tokenizer, held_out, test_images, test_prompts, test_u, settings.pref_margin)
    clip_state = {k: v.clone() for k, v in model.state_dict().items()}
    log(f"shapes_clip on unseen scenes: {clip_accuracy}")
    model.train()
    pref_loss, pairs = _train_preference(model, tokenizer, images, prompts, u, settings, progress)
    pref_accuracy = reward_accuracy(model, tokenizer, held_out, test_images, test_prompts, test_u, settings.pref_margin)
    log(
        f"shapes_pref: {settings.pref_steps} steps on {pairs} pairs, final loss {pref_loss:.4g}; unseen: {pref_accuracy}"
    )
    seconds = round(time.monotonic() - started, 1)
    common = {
        "producer": PRODUCER,
        "task": "shapes",
        "settings": {**asdict(settings), "sample_steps": list(settings.sample_steps)},
        "trained_scenes": len(seen),
        "base_model": base_model,
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "licence": "weights made by g2rpo (Apache-2.0) from procedurally drawn scenes",
    }
    for target in targets:
        if target.exists():
            shutil.rmtree(target)
    pref_state = {k: v.clone() for k, v in model.state_dict().items()}  # state_dict() aliases the live tensors
    model.load_state_dict(clip_state)
    _save(
        model,
        targets[0],
        {**common, "model": "shapes_clip", "head": "clip", "final_loss": clip_loss, "unseen": clip_accuracy},
    )
    model.load_state_dict(pref_state)
    _save(
        model,
        targets[1],
        {
            **common,
            "model": "shapes_pref",
            "head": "hps_v21",
            "final_loss": pref_loss,
            "preference_pairs": pairs,
            "unseen": pref_accuracy,
        },
    )
    return targets


def check_reward_folder(path: str | Path) -> Path:
    """``path`` if it holds a learned shapes reward sealed by its manifest; else a G2RPOError naming it."""

    path = Path(path)
    if not (path / REWARD_MARKER).is_file():
        raise G2RPOError(problem("reward weights", str(path), f"holds no learned shapes reward (no {REWARD_MARKER})"))
    store = FileStore(path)
    bad = mismatches(store, read_manifest(store), deep=True) if has_manifest(store) else ["no manifest.json"]
    if bad:
        raise G2RPOError(
            problem("reward weights", str(path), f"differs from its manifest ({'; '.join(bad[:3])}); restore it")
        )
    return path
