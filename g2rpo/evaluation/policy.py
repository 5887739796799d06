"""The policy an evaluation samples from, loaded from a model URI in a fresh process.

A model URI (local path, ``file://`` or ``s3://`` of a published artifact) holds either

- a **Flux pipeline**: a diffusers ``FluxPipeline`` folder (``model_index.json``; the base model,
  e.g. ``g2rpo model init-tiny``). Everything comes from it.
- a **trainer export** (:func:`g2rpo.training.checkpoint.export_model`): ``base_model.json`` plus
  ``transformer/`` (diffusers layout, a full fine-tune) or ``lora/`` (peft adapters). The VAE and
  the text encoders, and for LoRA the base transformer, come from the **base model**: the
  ``base_model_uri`` given, else the location recorded in ``base_model.json`` when that is a local
  folder that exists here.

``s3://`` URIs go through the verified, digest-keyed cache (:func:`g2rpo.artifacts.cache.fetch_to_cache`).
The transformer is wrapped in :class:`g2rpo.models.flux.FluxVelocity` with the settings the
trainer uses (image size, VAE scale factor, guidance, timestep rounding), so sampling an export
here gives what sampling the live trainer's policy gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from g2rpo.artifacts.cache import fetch_to_cache, verify_local
from g2rpo.artifacts.storage import S3Settings
from g2rpo.core import flux_sigmas, static_shift_sigmas
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, vae_scale_factor_of
from g2rpo.models.loading import TEXT_COMPONENTS, check_model_dir, load_text_encoder, load_transformer, load_vae
from g2rpo.textfile import read_json_file

__all__ = ["Policy", "PolicyKind", "load_policy", "resolve_device", "sigma_grid", "local_model_dir"]

PolicyKind = Literal["pipeline", "export-transformer", "export-lora"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Policy:
    """What an evaluation needs of a model: the velocity, the VAE and the text encoder."""

    velocity: FluxVelocity
    vae: torch.nn.Module
    text_encoder: FluxTextEncoder
    kind: PolicyKind
    model_uri: str
    base_model_uri: str  # where the VAE and text encoders came from (model_uri for a pipeline)


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise G2RPOError(problem("device", device, "no CUDA device is visible here: use cpu or auto"))
    return torch.device(device)


def sigma_grid(config: EvaluationConfig, image_seq_len: int) -> torch.Tensor:
    """The σ grid ``[T+1]`` from 1 to 0 the config asks for (as ``algorithm.grid`` means it)."""
    if config.grid == "flux":
        return flux_sigmas(config.num_steps, image_seq_len)
    return static_shift_sigmas(config.num_steps, config.shift)


def local_model_dir(uri: str, cache_dir: str | None = None, settings: S3Settings | None = None) -> Path:
    """A local folder for a model URI: a path or ``file://`` as is, ``s3://`` through the verified cache."""
    if uri.startswith("s3://"):
        return fetch_to_cache(uri, cache_dir=cache_dir, settings=settings)
    text = uri.removeprefix("file://")
    if "://" in text:
        raise G2RPOError(
            problem("model", uri, "unsupported scheme; use a local folder, file://PATH or s3://BUCKET/PREFIX")
        )
    path = Path(text).expanduser()
    if not path.is_dir():
        raise G2RPOError(
            problem("model", uri, "no such folder: pass a FluxPipeline folder or a trainer export (output.dir/export)")
        )
    verify_local(path, what="model")  # an export or a model g2rpo wrote: its manifest pins every byte
    return path


def load_policy(
    model_uri: str,
    config: EvaluationConfig,
    *,
    base_model_uri: str | None = None,
    settings: S3Settings | None = None,
) -> Policy:
    """Load the policy at ``model_uri`` (a Flux pipeline or a trainer export) on ``config.device``."""
    device = resolve_device(config.device)
    root = local_model_dir(model_uri, config.cache_dir, settings)
    if (root / "model_index.json").is_file():
        kind: PolicyKind = "pipeline"
        base_uri, base_root = model_uri, root
        transformer = load_transformer(root, dtype=config.dtype)
    elif (root / "base_model.json").is_file():
        info = _read_base_model_json(root / "base_model.json")
        base_uri = base_model_uri or _recorded_base(model_uri, info)
        base_root = local_model_dir(base_uri, config.cache_dir, settings)
        if (root / "transformer").is_dir():
            kind = "export-transformer"
            transformer = _load_export_transformer(root / "transformer", config.dtype)
        elif (root / "lora").is_dir():
            kind = "export-lora"
            transformer = load_transformer(base_root, dtype=config.dtype)
            _load_lora(transformer, root / "lora")
        else:
            raise G2RPOError(
                problem(
                    "model",
                    model_uri,
                    "holds base_model.json but neither transformer/ nor lora/: the export is incomplete; export it again",
                )
            )
    else:
        raise G2RPOError(
            problem(
                "model",
                model_uri,
                "is neither a FluxPipeline folder (model_index.json) nor a trainer export (base_model.json): "
                "pass the base model folder or output.dir/export of a training run",
            )
        )
    check_model_dir(base_root, ("vae", *TEXT_COMPONENTS))
    vae = load_vae(base_root, dtype=config.dtype).to(device).eval().requires_grad_(False)
    size = int(vae.config.sample_size)
    transformer.eval().requires_grad_(False)
    velocity = FluxVelocity(
        transformer,
        height=config.height or size,
        width=config.width or size,
        vae_scale_factor=vae_scale_factor_of(vae),
        guidance=config.guidance,
        timestep_mode="truncate" if config.truncate_timestep else "pipeline",
    ).to(device)
    text_encoder = load_text_encoder(base_root, dtype=config.dtype, max_sequence_length=config.max_sequence_length)
    text_encoder.text_encoder.to(device)
    text_encoder.text_encoder_2.to(device)
    return Policy(velocity, vae, text_encoder, kind, model_uri, str(base_uri))


def _read_base_model_json(path: Path) -> dict[str, Any]:
    return read_json_file(path, what="export record (base_model.json)", fix="the export is damaged: export it again")


def _recorded_base(model_uri: str, info: dict[str, Any]) -> str:
    """The base model location recorded in an export, when it is a local folder that exists here."""
    record = info.get("base_model_record")
    location = record.get("location") if isinstance(record, dict) else None
    if location and "://" not in str(location) and Path(location).expanduser().is_dir():
        return str(location)
    raise G2RPOError(
        problem(
            "base_model_uri",
            None,
            f"the export {model_uri} needs its base model for the VAE and text encoders, and the location it records "
            f"({location!r}, base model {info.get('base_model')!r}) is not a local folder here: pass the base model's "
            "URI (g2rpo eval --base-model URI)",
        )
    )


def _load_lora(transformer: torch.nn.Module, folder: Path) -> None:
    """The exported peft adapters (``save_lora_adapter`` layout) onto the base transformer."""
    weights = folder / "pytorch_lora_weights.safetensors"
    if not weights.is_file():
        raise G2RPOError(problem("model", str(folder), f"the export's lora/ lacks {weights.name}: export it again"))
    transformer.load_lora_adapter(str(folder), weight_name=weights.name, prefix=None, adapter_name="default")


def _load_export_transformer(folder: Path, dtype: str) -> torch.nn.Module:
    """The exported ``FluxTransformer2DModel`` (``save_pretrained`` layout, safetensors)."""
    from diffusers import FluxTransformer2DModel  # heavy: loaded only when a model is

    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors*")):
        raise G2RPOError(
            problem("model", str(folder), "the export's transformer/ lacks config.json or its safetensors weights")
        )
    return FluxTransformer2DModel.from_pretrained(folder, dtype=_DTYPES[dtype], local_files_only=True)
