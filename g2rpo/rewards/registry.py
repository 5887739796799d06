"""Building reward heads from config: :func:`build_reward`.

What each registered name is, needs and reads lives in :mod:`g2rpo.rewards.specs` (no torch, so a
config validates without it); :data:`BUILDERS` holds, under the same names, the function that builds
each head. A builder imports its head's module when it runs: the heads load open_clip, transformers
and their weights, which a run that does not use them never pays for. :func:`build_reward` turns a
:class:`~g2rpo.rewards.config.RewardModelConfig` (or just a name, for weight-free heads) into a
:class:`~g2rpo.rewards.base.RewardModel`; an unknown name is a :class:`~g2rpo.errors.G2RPOError`
listing the valid ones.

Weights locations: a local path, or ``s3://bucket/prefix`` naming an artifact published with a
manifest (:func:`g2rpo.artifacts.cache.fetch_to_cache` downloads it once, verifying every sha256, and
returns the cached folder). When a head wants a file and the location is a folder (always the
case for ``s3://``), the file is looked up in it by its published name (``HPS_v2.1_compressed.pt``,
``ImageReward.pt``, ...), and an ImageReward folder may also carry ``med_config.json`` and
``tokenizer/``.

Scoring many images (batched, several heads at once) is :func:`g2rpo.rewards.scoring.score_rewards`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from g2rpo.artifacts.cache import fetch_to_cache, verify_local
from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel
from g2rpo.rewards.shapes import ShapesReward
from g2rpo.rewards.specs import AUTO_DTYPE, get_spec

__all__ = ["BUILDERS", "build_reward", "resolve_location"]


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_location(field: str, location: str, cache_dir: str | None = None) -> Path:
    """A local path for a weights location (``s3://`` artifacts are fetched into the cache), verified
    against its folder's manifest (:func:`_verified`)."""
    return _verified(field, _resolve(field, location, cache_dir))


def _verified(field: str, path: Path) -> Path:
    """``path`` once the folder it is (or lies in) matches its ``manifest.json``, as base models are
    checked: every folder g2rpo writes or downloads carries one (the learned shapes rewards, a
    published reward artifact), so one flipped bit in the weights is refused naming the file instead
    of scoring. A folder without a manifest (a Hugging Face download) is used as it is. The check is
    cached by file identity (:func:`g2rpo.artifacts.cache.verify_local`)."""
    if path.is_dir():
        verify_local(path, what=f"{field} folder")
    elif path.parent.is_dir():
        verify_local(path.parent, only=(path.name,), what=f"{field} folder")
    return path


def _resolve(field: str, location: str, cache_dir: str | None) -> Path:
    if location.startswith("s3://"):
        return Path(fetch_to_cache(location, cache_dir=cache_dir, setting="rewards.cache_dir"))
    if location.startswith("file://"):
        location = location[len("file://") :]
    path = Path(location).expanduser()
    if not path.exists():
        raise G2RPOError(
            problem(field, location, "does not exist; give a local path or an s3://bucket/prefix artifact")
        )
    return path


def _file_in(field: str, path: Path, name: str) -> Path:
    """``path`` itself if it is a file, else ``path/name``."""
    if path.is_dir():
        candidate = path / name
        if not candidate.is_file():
            raise G2RPOError(problem(field, str(path), f"is a folder without {name}; point at the file or add it"))
        return candidate
    return path


def _optional(
    cfg, key: str, folder: Path | None, default_name: str | None, cache_dir: str | None = None
) -> Path | None:
    """The path an optional key names, else ``folder/default_name`` when that exists, else None.

    An ``s3://`` (or ``file://``) value is resolved like ``weights``; when it names an artifact
    folder holding ``default_name`` (e.g. ``med_config.json``), that file is used.
    """
    value = getattr(cfg, key, None)
    if value is not None:
        if not value.startswith(("s3://", "file://")):
            return Path(value).expanduser()
        path = resolve_location(f"{cfg.name}.{key}", value, cache_dir)
        if path.is_dir() and default_name and (path / default_name).is_file():
            return path / default_name
        return path
    if folder is not None and folder.is_dir() and default_name and (folder / default_name).exists():
        return folder / default_name
    return None


# --------------------------------------------------------------------------- builders


def _build_hps(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.hps import HPSv21

    loc = resolve_location("hps_v21.weights", cfg.weights, cache_dir)
    converted = loc / "open_clip_model.safetensors"  # a local-dir folder (e.g. g2rpo/models/shapes_pref)
    if loc.is_dir() and converted.is_file() and not (loc / "HPS_v2.1_compressed.pt").is_file():
        checkpoint = converted
    else:
        checkpoint = _file_in("hps_v21.weights", loc, "HPS_v2.1_compressed.pt")
    oc_config = _optional(cfg, "arch_config", loc, "open_clip_config.json", cache_dir)
    return HPSv21.from_checkpoint(
        checkpoint,
        arch=getattr(cfg, "arch", None) or "ViT-H-14",
        open_clip_config=oc_config,
        device=device,
        dtype=dtype,
    )


def _build_clip(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.clip_score import CLIPScore

    loc = resolve_location("clip.weights", cfg.weights, cache_dir)
    if loc.is_dir():
        return CLIPScore.from_local_dir(loc, device=device, dtype=dtype)
    arch = getattr(cfg, "arch", None)
    oc_config = _optional(cfg, "arch_config", None, "open_clip_config.json", cache_dir)
    if arch is None and oc_config is None:
        raise G2RPOError(
            problem(
                "clip.arch", None, "a bare state-dict file needs its open_clip architecture: set arch (e.g. ViT-H-14)"
            )
        )
    return CLIPScore.from_checkpoint(loc, arch=arch or "custom", open_clip_config=oc_config, device=device, dtype=dtype)


def _build_pickscore(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.pickscore import PickScore

    loc = resolve_location("pickscore.weights", cfg.weights, cache_dir)
    processor = getattr(cfg, "tokenizer", None)
    if processor is not None:
        processor = resolve_location("pickscore.tokenizer", processor, cache_dir)
    elif (loc / "processor").is_dir():
        processor = loc / "processor"
    return PickScore.from_pretrained_dir(loc, processor_dir=processor, device=device, dtype=dtype)


def _build_image_reward(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.image_reward import ImageReward

    loc = resolve_location("image_reward.weights", cfg.weights, cache_dir)
    checkpoint = _file_in("image_reward.weights", loc, "ImageReward.pt")
    folder = loc if loc.is_dir() else loc.parent
    med = _optional(cfg, "arch_config", folder, "med_config.json", cache_dir)
    tokenizer = _optional(cfg, "tokenizer", folder, "tokenizer", cache_dir)
    vision = _optional(cfg, "vision_config", folder, "vision_config.json", cache_dir)
    if med is None:
        raise G2RPOError(
            problem(
                "image_reward.arch_config", None, "set it to BLIP's med_config.json (or put one next to the weights)"
            )
        )
    if tokenizer is None:
        raise G2RPOError(
            problem(
                "image_reward.tokenizer",
                None,
                "set it to a folder with bert-base-uncased's vocab.txt (or add tokenizer/ next to the weights)",
            )
        )
    return ImageReward.from_checkpoint(
        checkpoint, med_config=med, vision_config=vision, tokenizer_dir=tokenizer, device=device, dtype=dtype
    )


def _build_unified_reward(metric: str) -> Callable[..., RewardModel]:
    def build(cfg, device, dtype, cache_dir):
        from g2rpo.rewards.unified_reward import UnifiedReward

        loc = resolve_location(f"{metric}.weights", cfg.weights, cache_dir)
        processor = getattr(cfg, "tokenizer", None)
        if processor is not None:
            processor = resolve_location(f"{metric}.tokenizer", processor, cache_dir)
        return UnifiedReward.from_pretrained_dir(
            loc,
            processor_dir=processor,
            metric=metric,
            max_new_tokens=getattr(cfg, "max_new_tokens", None),
            device=device,
            dtype=dtype,
        )

    return build


def _build_aesthetic(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.aesthetic import Aesthetic

    loc = resolve_location("aesthetic.weights", cfg.weights, cache_dir)
    mlp = _file_in("aesthetic.weights", loc, "sac+logos+ava1-l14-linearMSE.pth")
    backbone = getattr(cfg, "backbone", None)
    if backbone is None:
        raise G2RPOError(problem("aesthetic.backbone", None, "set it to an open_clip ViT-L/14 (OpenAI) folder"))
    backbone_path = resolve_location("aesthetic.backbone", backbone, cache_dir)
    if backbone_path.is_dir():
        return Aesthetic.from_files(mlp, clip_dir=backbone_path, device=device, dtype=dtype)
    arch = getattr(cfg, "arch", None) or "ViT-L-14-quickgelu"
    return Aesthetic.from_files(mlp, clip_checkpoint=backbone_path, arch=arch, device=device, dtype=dtype)


def _build_jpeg(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.jpeg import JPEGCompressibility

    return JPEGCompressibility()


def _build_sharpness(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.quality import Sharpness

    return Sharpness()


def _build_shapes(name: str) -> Callable[..., RewardModel]:
    return lambda cfg, device, dtype, cache_dir: ShapesReward(name)


def _build_total_variation(cfg, device, dtype, cache_dir):
    from g2rpo.rewards.quality import TotalVariation

    return TotalVariation()


# Under the names of g2rpo.rewards.specs.REWARDS (tests/rewards/test_rewards_registry.py holds the two equal).
BUILDERS: dict[str, Callable[..., RewardModel]] = {
    "hps_v21": _build_hps,
    "clip": _build_clip,
    "pickscore": _build_pickscore,
    "image_reward": _build_image_reward,
    **{
        metric: _build_unified_reward(metric)
        for metric in (
            "unified_reward_score",
            "unified_reward_alignment",
            "unified_reward_coherence",
            "unified_reward_style",
        )
    },
    "aesthetic": _build_aesthetic,
    "jpeg_compressibility": _build_jpeg,
    "sharpness": _build_sharpness,
    "total_variation": _build_total_variation,
    **{
        name: _build_shapes(name)
        for name in (
            "shapes_colour",
            "shapes_shape",
            "shapes_position",
            "shapes_background",
            "shapes_texture",
            "shapes_colour_match",
        )
    },
}


def build_reward(
    spec_or_name,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    cache_dir: str | None = None,
) -> RewardModel:
    """Build a reward head from a config entry (anything with ``.name`` and the optional keys of
    :class:`~g2rpo.rewards.config.RewardModelConfig`) or from a bare name (weight-free heads)."""
    if isinstance(spec_or_name, str):
        cfg = SimpleNamespace(name=spec_or_name, weights=None)
    else:
        cfg = spec_or_name
    spec = get_spec(cfg.name)
    for key in spec.required:
        if getattr(cfg, key, None) is None:
            raise G2RPOError(problem(f"{cfg.name}.{key}", None, f"'{cfg.name}' needs {spec.needs}"))
    device = _device(cfg.name, device)
    if dtype is None:
        dtype = getattr(cfg, "dtype", None) or spec.dtype
    if isinstance(dtype, str):
        if dtype == AUTO_DTYPE and spec.dtype == AUTO_DTYPE:
            return BUILDERS[spec.name](cfg, device, dtype, cache_dir)
        if dtype not in _DTYPES:
            valid = [*_DTYPES, AUTO_DTYPE] if spec.dtype == AUTO_DTYPE else list(_DTYPES)
            raise G2RPOError(problem(f"{cfg.name}.dtype", dtype, f"use one of {', '.join(valid)}"))
        dtype = _DTYPES[dtype]
    return BUILDERS[spec.name](cfg, device, dtype, cache_dir)


def _device(name: str, device: str | torch.device) -> torch.device:
    """``device`` as a torch.device, or a G2RPOError when torch cannot parse it or CUDA is absent."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise G2RPOError(
            problem(f"{name}.device", device, "use a torch device string such as cpu, cuda or cuda:1")
        ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise G2RPOError(problem(f"{name}.device", str(device), "CUDA is not available on this machine: use cpu"))
    return parsed
