"""A tiny Flux pipeline pretrained on the shapes task (:mod:`g2rpo.tasks.shapes`) on the CPU.

The pipeline is :func:`g2rpo.models.tiny.build_tiny_flux_pipeline`'s — real diffusers classes,
VAE included — with the task's words as single T5 tokens and a wider transformer. Pretraining,
all seeded so that the same settings give the same weights:

1. **VAE**: an autoencoder on the 360 rendered scenes (pixels in [−1, 1]): squared
   reconstruction error of a sample of the posterior, the shape's pixels weighted
   ``vae_shape_weight`` times a background pixel's, plus ``kl_weight`` × KL to N(0, I). Then the
   latent statistics set ``shift_factor`` (mean) and ``scaling_factor`` (1 / std), so the
   transformer sees unit-variance latents, as FLUX.1-dev's VAE is set up.

   Why the weight: a shape covers 1–9 % of a 64×64 scene, so with a plain mean the background
   dominates the loss and this small VAE learns the shapes' brightness but not their hue — red
   (1, 0, 0) came back as (0.40, 0.39, 0.27) and green as gray, so no policy could draw them.
   :func:`colour_reconstruction` measures it; the marker records it and the tests bound it.
2. **Transformer**: flow matching on the scenes' packed latents x₀ (posterior means) with the text
   encoders frozen (random, seeded — their outputs still tell prompts apart): x_σ = (1 − σ)·x₀ +
   σ·ε, target v = ε − x₀ (σ = 1 is noise, as in :mod:`g2rpo.core`), σ ~ U(0, 1), mean squared
   error, AdamW. With ``colour_noise`` = p, each training example's caption names another of the
   four colours (uniformly among the other three) with probability p: the model then learns to
   draw the asked colour on about 1 − p of its samples, for every colour alike. That is the room
   the RL testbed needs (docs/models.md): a model that always draws the asked colour gives GRPO's
   groups no colour signal, one that never does gives none either.

:func:`pretrain_shapes` runs both and ``save_pretrained``-s the pipeline (safetensors) with a
``g2rpo_tiny.json`` marker recording the settings and the losses, then seals the folder with the
artifact manifest (every file's size and sha256, written last); ``g2rpo model pretrain-shapes``
is the command.

**The shipped models.** Two pretrained models are part of the package (a few MB each), so every
machine starts from the same base model: pretraining again need not give the same weights (another
thread count sums in another order, and even at one thread two runs of these settings differed;
training amplifies the last bits — docs/models.md). :data:`SHIPPED_SHAPES_MODEL` (the default
:class:`ShapesPretraining`, all 360 scenes) is the exact-reward ablation's and the tests';
:data:`SHIPPED_UNSEEN_MODEL` (:data:`UNSEEN_PRETRAINING`: the 96 scenes that the prepare split holds
out first never drawn nor named) is what ``make demo``, ``g2rpo pipeline run-local`` and the
learned-reward ablation train, so their held-out prompts are unseen. A manifest is checked (sha256)
before use; ``pretrain-shapes`` with the same settings regenerates either.

:func:`sample_shapes` draws images with the ODE sampler on Flux's grid, which the tests use to
compare a pretrained model with a random one on the exact rewards.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from g2rpo import core
from g2rpo.artifacts.manifest import MANIFEST_NAME, has_manifest, mismatches, read_manifest, write_dir_manifest
from g2rpo.artifacts.storage import FileStore
from g2rpo.errors import G2RPOError, problem
from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, decode_latents, pack_latents
from g2rpo.models.loading import load_pipeline
from g2rpo.models.tiny import TINY_MARKER, build_tiny_flux_pipeline, check_model_overwrite
from g2rpo.progress import progress_bar
from g2rpo.tasks.shapes import (
    BACKGROUNDS,
    COLOURS,
    IMAGE_SIZE,
    POSITIONS,
    SHAPES,
    SIZES,
    Scene,
    all_scenes,
    render,
    scene_centre,
    shape_mask,
    unseen_scenes,
)
from g2rpo.textfile import RECORD_MAX_BYTES, read_json_file

__all__ = [
    "SHAPES_WORDS",
    "SHIPPED_SHAPES_MODEL",
    "SHIPPED_UNSEEN_MODEL",
    "UNSEEN_PRETRAINING",
    "ShapesPretraining",
    "check_shapes_model",
    "colour_reconstruction",
    "ensure_shapes_model",
    "pretrain_shapes",
    "pretraining_scenes",
    "noisy_captions",
    "recoloured_scenes",
    "sample_shapes",
    "scene_masks",
    "shapes_pipeline",
    "shapes_sampler",
]

SHAPES_WORDS = tuple(
    dict.fromkeys(
        [*SHAPES, *COLOURS, *SIZES, *BACKGROUNDS, *(w for p in POSITIONS for w in p.split()), "background", "at"]
    )
)
GUIDANCE = 3.5  # the tiny transformer embeds a guidance scale, as FLUX.1-dev
SHIPPED_SHAPES_MODEL = Path(__file__).resolve().parent / "shapes_flux"  # package data, made by pretrain_shapes()
# package data, made by pretrain_shapes(UNSEEN_PRETRAINING): the demo's base model
SHIPPED_UNSEEN_MODEL = SHIPPED_SHAPES_MODEL.with_name("shapes_flux_unseen")
PRODUCER = "g2rpo.models.shapes.pretrain_shapes"


@dataclass(frozen=True)
class ShapesPretraining:
    """What :func:`pretrain_shapes` does; the defaults are ``shapes_flux``'s (:data:`SHIPPED_SHAPES_MODEL`)."""

    seed: int = 0
    heads: int = 4  # transformer width = 16 · heads
    vae_steps: int = 1500
    vae_batch: int = 8
    vae_lr: float = 2e-3
    vae_shape_weight: float = 10.0  # a shape pixel's weight in the reconstruction loss (background: 1)
    kl_weight: float = 1e-6
    flow_steps: int = 10000
    flow_batch: int = 32
    flow_lr: float = 2e-3
    colour_noise: float = 0.3  # probability that a flow-matching caption names another colour
    # Scenes never drawn nor named in pretraining: those the prepare split (seed 0) holds out first
    # (tasks.shapes.unseen_scenes). 96 = the 64 held-out + the ablation's 32 validation scenes.
    unseen: int = 0


# SHIPPED_UNSEEN_MODEL's settings: the 64 held-out + 32 validation scenes of the prepare split (seed 0) left out.
UNSEEN_PRETRAINING = ShapesPretraining(unseen=96)

# Settings added after a model was shipped: a marker without the key was made with this value.
_SETTINGS_BEFORE_RECORDED = {"unseen": 0}


def pretraining_scenes(settings: ShapesPretraining) -> list[Scene]:
    """The scenes pretraining draws and names, in :func:`all_scenes` order: all but ``settings.unseen``."""
    left_out = unseen_scenes(settings.unseen)
    return [s for s in all_scenes() if s not in left_out]


def shapes_pipeline(seed: int = 0, heads: int = 4) -> Any:
    """The untrained shapes pipeline (random weights seeded by ``seed``)."""
    return build_tiny_flux_pipeline(seed, extra_words=SHAPES_WORDS, num_attention_heads=heads)


def _steps(count: int, desc: str, progress: bool) -> Any:
    """``range(count)``, with a progress bar on stderr when ``progress``."""
    return progress_bar(range(count), desc=desc, unit="step", enabled=progress, leave=False)


def scene_masks(scenes: Sequence[Scene], image_size: int = IMAGE_SIZE) -> torch.Tensor:
    """Bool ``[N, S, S]``: the pixels each scene's shape covers."""
    return torch.stack([shape_mask(s.shape, s.size, scene_centre(s.position, image_size), image_size) for s in scenes])


def _train_vae(
    vae: Any,
    images: torch.Tensor,
    masks: torch.Tensor,
    settings: ShapesPretraining,
    gen: torch.Generator,
    progress: bool = False,
) -> float:
    opt = torch.optim.AdamW(vae.parameters(), lr=settings.vae_lr, weight_decay=0.0)
    weights = 1 + (settings.vae_shape_weight - 1) * masks[:, None].float()  # [N, 1, S, S]
    vae.train()
    loss = torch.tensor(float("nan"))
    for _ in _steps(settings.vae_steps, "shapes VAE", progress):
        idx = torch.randint(0, images.shape[0], (settings.vae_batch,), generator=gen)
        x, w = images[idx], weights[idx]
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        # Σ w·(x̂ − x)² / Σ w: a weighted mean, equal to the plain MSE when vae_shape_weight = 1
        reconstruction = (w * (recon - x) ** 2).sum() / (w.sum() * x.shape[1])
        loss = reconstruction + settings.kl_weight * posterior.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    vae.eval()
    return float(loss.detach())


def _train_flow(
    velocity: FluxVelocity,
    latents: torch.Tensor,
    cond: Any,
    settings: ShapesPretraining,
    gen: torch.Generator,
    recoloured: torch.Tensor,
    progress: bool = False,
) -> float:
    """``recoloured[i, j]``: the index of scene i drawn in the j-th of the other three colours."""
    opt = torch.optim.AdamW(velocity.transformer.parameters(), lr=settings.flow_lr, weight_decay=0.0)
    velocity.train()
    loss = torch.tensor(float("nan"))
    for _ in _steps(settings.flow_steps, "shapes flow matching", progress):
        idx = torch.randint(0, latents.shape[0], (settings.flow_batch,), generator=gen)
        x0 = latents[idx]
        noise = torch.randn(x0.shape, generator=gen)
        sigma = torch.rand(x0.shape[0], generator=gen)
        x = (1 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        captions = noisy_captions(idx, recoloured, settings.colour_noise, gen)
        loss = F.mse_loss(velocity(x, sigma, cond[captions]), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    velocity.eval()
    return float(loss.detach())


def pretrain_shapes(
    output: str | Path,
    settings: ShapesPretraining = ShapesPretraining(),
    *,
    overwrite: bool = False,
    log: Callable[[str], None] = lambda _: None,
    progress: bool = False,
) -> Path:
    """Pretrain the shapes pipeline (see the module docstring) and ``save_pretrained`` it to ``output``.

    Refuses a non-empty ``output`` unless ``overwrite``, which replaces the folder whole and only when it is a
    g2rpo model folder (its marker, nothing else beside the model's files; :func:`check_model_overwrite`). ``progress``
    shows a bar per stage on stderr. Returns the directory.
    """
    out = Path(output)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        raise G2RPOError(
            problem("output", str(out), "exists and is not an empty directory; choose another or pass --overwrite")
        )
    if overwrite:
        check_model_overwrite(out)  # before the minutes of training: a folder that is not a g2rpo model is refused
    started = time.monotonic()
    pipe = shapes_pipeline(settings.seed, settings.heads)
    gen = torch.Generator().manual_seed(settings.seed)
    scenes = pretraining_scenes(settings)
    images = torch.stack([render(s) for s in scenes]) * 2 - 1  # [N, 3, S, S] in [−1, 1]
    vae_loss = _train_vae(pipe.vae, images, scene_masks(scenes), settings, gen, progress)
    log(f"VAE: {settings.vae_steps} steps, final loss {vae_loss:.4g} ({time.monotonic() - started:.0f} s)")
    reconstruction = colour_reconstruction(pipe.vae)
    log("VAE colours back (mean RGB inside the shape): " + ", ".join(f"{c} {v}" for c, v in reconstruction.items()))
    with torch.no_grad():
        z = pipe.vae.encode(images).latent_dist.mean  # [N, c, h, w]
    shift, scale = float(z.mean()), float(1 / z.std())
    pipe.vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = pack_latents((z - shift) * scale)  # [N, L, C]
    encoder = FluxTextEncoder.from_pipeline(pipe)
    cond = encoder.encode([s.prompt for s in scenes])
    velocity = FluxVelocity(pipe.transformer, height=IMAGE_SIZE, width=IMAGE_SIZE, guidance=GUIDANCE)
    flow_loss = _train_flow(velocity, latents, cond, settings, gen, recoloured_scenes(scenes), progress)
    seconds = time.monotonic() - started
    log(f"flow matching: {settings.flow_steps} steps, final loss {flow_loss:.4g} ({seconds:.0f} s in all)")
    if out.exists():  # --overwrite of a g2rpo model folder (checked above): the old model goes whole
        check_model_overwrite(out)  # again: the folder may have changed during the training
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pipe.save_pretrained(out, safe_serialization=True)
    marker = {
        "producer": PRODUCER,
        "task": "shapes",
        "seed": settings.seed,
        "image_size": IMAGE_SIZE,
        "max_sequence_length": encoder.max_sequence_length,
        "settings": asdict(settings),
        "pretraining_scenes": len(scenes),
        "latent_shift": shift,
        "latent_scale": scale,
        "vae_loss": vae_loss,
        "colour_reconstruction": reconstruction,
        "flow_loss": flow_loss,
        "seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),  # the sums' order, hence the last bits, depend on it
        "transformer_parameters": sum(p.numel() for p in pipe.transformer.parameters()),
        "licence": "weights made by g2rpo (Apache-2.0) from procedurally drawn scenes; not derived from FLUX.1-dev",
    }
    (out / TINY_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    write_dir_manifest(out, producer=PRODUCER, metadata={"settings": asdict(settings)})
    return out


def noisy_captions(idx: torch.Tensor, recoloured: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """Long ``[B]``: the captions (scene indices) that images ``idx`` (``[B]``) are trained with —
    each one's own with probability 1 − p, else the same scene's in another colour drawn uniformly
    from ``recoloured`` (:func:`recoloured_scenes`). ``p = 0`` draws nothing from ``gen``."""
    if p <= 0:
        return idx
    swap = torch.rand(idx.shape[0], generator=gen) < p  # [B]
    other = recoloured[idx, torch.randint(0, recoloured.shape[1], idx.shape, generator=gen)]  # [B]
    return torch.where(swap, other, idx)


def recoloured_scenes(scenes: Sequence[Scene]) -> torch.Tensor:
    """Long ``[N, K − 1]`` (K colours): for each scene, the indices in ``scenes`` of the same scene in
    each other colour, in :data:`COLOURS` order. Where ``scenes`` lacks some recolourings (a model
    pretrained without its unseen scenes), the row repeats the ones it has, in order, so a caption
    never names a left-out scene; a scene with none keeps its own index (its caption is never swapped)."""
    where = {s: i for i, s in enumerate(scenes)}
    rows = []
    for i, s in enumerate(scenes):
        present = [where[r] for c in COLOURS if c != s.colour if (r := replace(s, colour=c)) in where] or [i]
        rows.append([present[j % len(present)] for j in range(len(COLOURS) - 1)])
    return torch.tensor(rows, dtype=torch.long)


@torch.no_grad()
def colour_reconstruction(vae: Any, image_size: int = IMAGE_SIZE) -> dict[str, list[float]]:
    """Per colour of the task, the mean RGB inside the shape of its scenes after encoding (posterior
    mean) and decoding with ``vae``: ``{"red": [r, g, b], …}`` in [0, 1]. A VAE that cannot give a
    colour back makes it impossible to draw, whatever the transformer learns."""
    scenes = all_scenes()
    images = torch.stack([render(s, image_size) for s in scenes]) * 2 - 1  # [N, 3, S, S]
    was_training = vae.training
    vae.eval()
    recon = (vae.decode(vae.encode(images).latent_dist.mean).sample / 2 + 0.5).clamp(0, 1)
    vae.train(was_training)
    masks = scene_masks(scenes, image_size)  # [N, S, S]
    out = {}
    for colour in COLOURS:
        inside = [recon[i][:, masks[i]].mean(1) for i, s in enumerate(scenes) if s.colour == colour]  # [3] each
        out[colour] = [round(float(v), 4) for v in torch.stack(inside).mean(0)]
    return out


def check_shapes_model(path: str | Path, settings: ShapesPretraining = ShapesPretraining()) -> Path:
    """``path`` if it holds a shapes model that :func:`pretrain_shapes` made with ``settings``; else a
    G2RPOError naming the folder, what differs and the fix (nothing is changed there)."""
    path = Path(path)
    marker_file = path / TINY_MARKER
    fix = f"delete {path} to pretrain it there again, or name another folder"
    if not (path / "model_index.json").is_file() or not marker_file.is_file():
        raise G2RPOError(
            problem("shapes model", str(path), f"exists but holds no pretrained shapes model (no {TINY_MARKER}); {fix}")
        )
    marker = read_json_file(
        marker_file, what=f"shapes model marker ({TINY_MARKER})", fix=fix, max_bytes=RECORD_MAX_BYTES
    )
    if marker.get("task") != "shapes":
        raise G2RPOError(
            problem(
                "shapes model",
                str(path),
                f"its {TINY_MARKER} is not a shapes model's (task {marker.get('task')!r}); {fix}",
            )
        )
    made, wanted = {**_SETTINGS_BEFORE_RECORDED, **marker.get("settings", {})}, asdict(settings)
    differ = [f"{k}={made.get(k)!r} (wanted {v!r})" for k, v in wanted.items() if made.get(k) != v]
    if differ:
        raise G2RPOError(
            problem("shapes model", str(path), f"was pretrained with other settings: {', '.join(differ)}; {fix}")
        )
    store = FileStore(path)
    if not has_manifest(store):
        raise G2RPOError(
            problem("shapes model", str(path), f"has no {MANIFEST_NAME}, so it may be incomplete or altered; {fix}")
        )
    bad = mismatches(store, read_manifest(store), deep=True)
    if bad:
        shipped = path in (SHIPPED_SHAPES_MODEL, SHIPPED_UNSEEN_MODEL)
        restore = f"restore it with `git checkout -- {path}`" if shipped else fix
        raise G2RPOError(
            problem("shapes model", str(path), f"differs from its manifest ({'; '.join(bad[:3])}); {restore}")
        )
    return path


def ensure_shapes_model(
    path: str | Path,
    settings: ShapesPretraining = ShapesPretraining(),
    *,
    log: Callable[[str], None] = lambda _: None,
    progress: bool = False,
) -> tuple[Path, bool]:
    """The shapes model at ``path``, pretrained there first when the folder does not exist.

    Returns ``(path, made)``. An existing folder is used only when its marker records ``settings``
    (:func:`check_shapes_model`). Pretraining writes into a hidden sibling folder renamed to ``path``
    when complete, so an interrupted run leaves no half-made model where the next run would look.
    """
    path = Path(path)
    if path.exists():
        return check_shapes_model(path, settings), False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        pretrain_shapes(partial, settings, overwrite=True, log=log, progress=progress)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path, True


@torch.no_grad()
def sample_shapes(pipe: Any, prompts: Sequence[str], seed: int = 0, num_steps: int = 16) -> torch.Tensor:
    """Images ``[B, 3, S, S]`` in [0, 1] for ``prompts``: Euler ODE on Flux's grid from seeded noise."""
    velocity = FluxVelocity(pipe.transformer, height=IMAGE_SIZE, width=IMAGE_SIZE, guidance=GUIDANCE).eval()
    cond = FluxTextEncoder.from_pipeline(pipe).encode(list(prompts))
    length, channels = velocity.latent_shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((len(prompts), length, channels), generator=gen)
    sigmas = core.flux_sigmas(num_steps, length)
    for i in range(num_steps):
        v = velocity(x, sigmas[i].expand(x.shape[0]), cond)
        x = core.ode_step(x, v, sigmas[i], sigmas[i + 1])
    return decode_latents(pipe.vae, x, IMAGE_SIZE, IMAGE_SIZE, micro_batch=64)


def shapes_sampler(model_dir: str | Path) -> Callable[[list[str], int, int], torch.Tensor]:
    """``sample(prompts, seed, num_steps) -> images [B, 3, S, S]``: :func:`sample_shapes` of the shapes
    model in ``model_dir``, loaded once (what :mod:`g2rpo.rewards.shapes_learned` ranks)."""
    pipe = load_pipeline(model_dir, dtype="float32")
    return lambda prompts, seed, num_steps: sample_shapes(pipe, prompts, seed=seed, num_steps=num_steps)
