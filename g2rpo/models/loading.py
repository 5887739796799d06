"""Where a Flux model comes from, what must be there, and the calls that load it.

A **model location** is a local directory in diffusers' ``FluxPipeline`` layout (what
``save_pretrained`` writes and what the Hugging Face repository ``black-forest-labs/FLUX.1-dev``
holds), or an ``s3://bucket/prefix`` URI of such a directory, which is downloaded once into a
local cache through the storage layer (:func:`g2rpo.artifacts.cache.fetch_to_cache`: the directory
must have been published with its ``manifest.json``; every file's sha256 is checked, and a second
run reuses the cache).

Before loading, :func:`check_model_dir` reads ``model_index.json`` and checks every needed
component: its folder, its config file and its weights (a single ``*.safetensors`` file, or a
``*.safetensors.index.json`` whose every shard is present). All problems are reported at once, each
naming the missing path and the fix — a half-finished download is the usual cause.

Everything loads with ``from_pretrained(local_dir, subfolder=..., local_files_only=True)``: the
tiny test model (:mod:`g2rpo.models.tiny`) and FLUX.1-dev go through the same calls. Only the
components a step needs are loaded: training takes the transformer (+ VAE to decode); the text
encoders are loaded only to fill the embedding cache (:mod:`g2rpo.data`).

**Licence.** FLUX.1-dev's weights are under the *FLUX.1 [dev] Non-Commercial License*; a model
fine-tuned from them is a derivative under the same terms. :func:`base_model_record` records the
base model and its licence pointer next to every exported model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from g2rpo.artifacts.cache import fetch_to_cache, verify_local
from g2rpo.errors import G2RPOError, did_you_mean, problem
from g2rpo.models.tiny import TINY_MARKER
from g2rpo.textfile import JSON_MAX_BYTES, RECORD_MAX_BYTES, decode_text, read_json_file

__all__ = [
    "ALL_COMPONENTS",
    "FLUX_DEV_LICENCE",
    "FLUX_DEV_LICENCE_URL",
    "TRAINING_COMPONENTS",
    "TEXT_COMPONENTS",
    "base_model_record",
    "check_model_dir",
    "load_pipeline",
    "load_text_encoder",
    "load_transformer",
    "load_vae",
    "resolve_model_location",
]

FLUX_DEV_LICENCE = "FLUX.1 [dev] Non-Commercial License"
FLUX_DEV_LICENCE_URL = "https://huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/LICENSE.md"

# component -> (kind, config file)
_COMPONENTS: dict[str, tuple[str, str]] = {
    "transformer": ("model", "config.json"),
    "vae": ("model", "config.json"),
    "text_encoder": ("model", "config.json"),
    "text_encoder_2": ("model", "config.json"),
    "tokenizer": ("tokenizer", "tokenizer_config.json"),
    "tokenizer_2": ("tokenizer", "tokenizer_config.json"),
    "scheduler": ("scheduler", "scheduler_config.json"),
}
ALL_COMPONENTS: tuple[str, ...] = tuple(_COMPONENTS)
TRAINING_COMPONENTS: tuple[str, ...] = ("transformer", "vae", "scheduler")
TEXT_COMPONENTS: tuple[str, ...] = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")

SAFETENSORS_HEADER_MAX = 100_000_000  # bytes: the limit the safetensors library itself enforces

_FIX_DOWNLOAD = (
    "download the complete model again (e.g. `huggingface-cli download black-forest-labs/FLUX.1-dev "
    "--local-dir DIR`), or make a tiny one with `g2rpo model init-tiny --output DIR`"
)


# --------------------------------------------------------------------------- locations


def resolve_model_location(location: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A local directory for ``location`` (a path, ``file://`` URI or ``s3://`` URI).

    ``s3://`` locations are fetched once into ``cache_dir`` through the storage layer and verified
    against their manifest; a local path is returned as is (checked by :func:`check_model_dir`).
    """
    text = str(location)
    if text.startswith("s3://"):
        return _fetch_s3_model(text, cache_dir)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        raise G2RPOError(
            f"model location {text!r}: unsupported scheme; use a local directory, file://PATH or s3://BUCKET/PREFIX"
        )
    return Path(text).expanduser()


def _fetch_s3_model(uri: str, cache_dir: str | Path | None) -> Path:
    """Download a published model directory once (``g2rpo.artifacts.cache.fetch_to_cache``: sha256-checked,
    keyed by its manifest's digest) and return the local copy."""

    return Path(fetch_to_cache(uri, cache_dir=cache_dir))


# --------------------------------------------------------------------------- checks


def _safetensors_problem(path: Path) -> str | None:
    """A truncated or damaged safetensors file (reads only its header, not the weights).

    Layout: 8 bytes little-endian header length n, n bytes of JSON header whose tensors'
    ``data_offsets`` [begin, end) index the data that follows; a complete file is exactly
    8 + n + max(end) bytes long.
    """
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            n = int.from_bytes(handle.read(8), "little")
            if size < 8 or n > size - 8:
                raise ValueError("header longer than the file")
            if n > SAFETENSORS_HEADER_MAX:  # the safetensors format's own limit: never read more
                raise ValueError(f"a {n:,}-byte header, over the format's {SAFETENSORS_HEADER_MAX:,}-byte limit")
            header = json.loads(decode_text(handle.read(n), "its header"))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        return f"{path}: not a readable safetensors file ({error}); {_FIX_DOWNLOAD}"
    if size != 8 + n + end:
        return f"{path}: truncated or damaged ({size} bytes, its header says {8 + n + end}); {_FIX_DOWNLOAD}"
    return None


def _weights_problems(folder: Path) -> list[str]:
    """Problems with a model folder's safetensors weights (single file or sharded with an index):
    missing files, and files whose size does not match their header (a half-finished download)."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        problems = []
        for index in indexes:
            try:
                weight_map = read_json_file(index, what="shard index", fix=_FIX_DOWNLOAD, max_bytes=JSON_MAX_BYTES)
            except G2RPOError as exc:
                problems.append(str(exc))
                continue
            weight_map = weight_map.get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                problems.append(f"{index}: unreadable shard index (no 'weight_map' of file names); {_FIX_DOWNLOAD}")
                continue
            missing = sorted({name for name in weight_map.values() if not (folder / name).is_file()})
            if missing:
                problems.append(
                    f"{folder}: missing weight shard(s) {', '.join(missing)} listed in {index.name}; {_FIX_DOWNLOAD}"
                )
            present = sorted({name for name in weight_map.values() if (folder / name).is_file()})
            problems += [p for p in (_safetensors_problem(folder / name) for name in present) if p]
        return problems
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return [p for p in (_safetensors_problem(f) for f in files) if p]
    if any(folder.glob("*.bin")):
        return [
            f"{folder}: weights are pickled *.bin files; g2rpo loads safetensors only — re-save with save_pretrained(..., safe_serialization=True)"
        ]
    return [f"{folder}: no weights file (*.safetensors); {_FIX_DOWNLOAD}"]


def _missing_path_fix(root: Path) -> str:
    """How to fix a model path that does not exist: most often a typo or a model not made yet, so
    name the nearest folder that exists and the closest name in it (no download hint here: that is
    for a folder that exists but is incomplete)."""
    existing = root.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    make = "or make a model there first (a tiny one: `g2rpo model init-tiny --output DIR`)"
    if existing != root.parent:
        return f"check the path: its nearest existing folder is {str(existing)!r}; {make}"
    siblings = [p.name for p in existing.iterdir() if p.is_dir()] if existing.is_dir() else []
    return f"check the path: {str(existing)!r} has no {root.name!r}{did_you_mean(root.name, siblings)}; {make}"


def check_model_dir(path: str | Path, components: Iterable[str] = ALL_COMPONENTS) -> dict[str, Any]:
    """Check a ``FluxPipeline`` directory for ``components``; return its ``model_index.json``.

    Raises one :class:`G2RPOError` listing every missing or partial piece. A folder with a
    ``manifest.json`` (what g2rpo writes and downloads) is then checked against it: every file of
    ``components`` and every top-level file must have its recorded size and sha256
    (:func:`g2rpo.artifacts.cache.verify_local`, cached by file identity).
    """
    root = Path(path)
    if not root.exists():
        raise G2RPOError(f"model directory {str(root)!r} does not exist: {_missing_path_fix(root)}")
    if not root.is_dir():
        raise G2RPOError(
            f"model location {str(root)!r} is a file, not a directory in FluxPipeline layout: pass the directory"
        )
    index_path = root / "model_index.json"
    if not index_path.is_file():
        raise G2RPOError(
            f"model directory {str(root)!r} has no model_index.json, so it is not a saved diffusers pipeline: {_FIX_DOWNLOAD}"
        )
    index = read_json_file(index_path, what="model index", fix=_FIX_DOWNLOAD, max_bytes=JSON_MAX_BYTES)
    problems: list[str] = []
    for name in components:
        if name not in _COMPONENTS:
            raise G2RPOError(f"unknown model component {name!r}: use one of {', '.join(ALL_COMPONENTS)}")
        kind, config_name = _COMPONENTS[name]
        entry = index.get(name)
        if not entry or entry == [None, None]:
            problems.append(f"{index_path}: no {name!r} component listed; {_FIX_DOWNLOAD}")
            continue
        folder = root / name
        if not folder.is_dir():
            problems.append(f"{folder}: component folder missing; {_FIX_DOWNLOAD}")
            continue
        if not (folder / config_name).is_file():
            problems.append(f"{folder / config_name}: missing config file; {_FIX_DOWNLOAD}")
        if kind == "model":
            problems += _weights_problems(folder)
        elif kind == "tokenizer":
            vocab_files = ("tokenizer.json", "vocab.json", "spiece.model")
            if not any((folder / f).is_file() for f in vocab_files):
                problems.append(f"{folder}: no vocabulary ({' / '.join(vocab_files)}); {_FIX_DOWNLOAD}")
    if problems:
        lines = [f"model directory {str(root)!r} is incomplete ({len(problems)} problem(s)):"]
        lines += [f"  - {p}" for p in problems]
        raise G2RPOError("\n".join(lines))

    # A folder g2rpo made or downloaded carries a manifest: every file of these components is checked
    # against it (sha256, cached by file identity), so damaged weights are never trained or sampled.
    verify_local(root, only=components, what="model directory")
    return index


# --------------------------------------------------------------------------- loading


def _dtype(dtype: Any) -> Any:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in names:
        raise G2RPOError(f"dtype={dtype!r}: use one of float32, bfloat16, float16")
    return names[dtype]


def load_transformer(location: str | Path, dtype: Any = "bfloat16", cache_dir: str | Path | None = None) -> Any:
    """``FluxTransformer2DModel`` from ``location``'s ``transformer/`` folder, in ``dtype``."""
    from diffusers import FluxTransformer2DModel

    root = resolve_model_location(location, cache_dir)
    check_model_dir(root, ("transformer",))
    return FluxTransformer2DModel.from_pretrained(
        root, subfolder="transformer", dtype=_dtype(dtype), local_files_only=True
    )


def transformer_skeleton(location: str | Path) -> Any:
    """The ``FluxTransformer2DModel`` of a local model folder built from its ``transformer/config.json`` on
    the meta device: every module with its class and shapes, no weights read or memory taken (what a
    check of module names needs; FLUX.1-dev's 12 B parameters included). A config diffusers cannot
    build is a G2RPOError naming the file."""
    import torch
    from diffusers import FluxTransformer2DModel

    config_path = Path(location) / "transformer" / "config.json"
    try:
        config = FluxTransformer2DModel.load_config(str(config_path.parent), local_files_only=True)
        with torch.device("meta"):
            return FluxTransformer2DModel.from_config(config)
    except (OSError, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise G2RPOError(
            problem("transformer config", str(config_path), f"cannot build the transformer from it ({reason})")
        ) from None


def load_vae(location: str | Path, dtype: Any = "bfloat16", cache_dir: str | Path | None = None) -> Any:
    """``AutoencoderKL`` from ``location``'s ``vae/`` folder, in ``dtype``."""
    from diffusers import AutoencoderKL

    root = resolve_model_location(location, cache_dir)
    check_model_dir(root, ("vae",))
    return AutoencoderKL.from_pretrained(root, subfolder="vae", dtype=_dtype(dtype), local_files_only=True)


def load_text_encoder(
    location: str | Path,
    dtype: Any = "bfloat16",
    max_sequence_length: int | None = None,
    cache_dir: str | Path | None = None,
) -> Any:
    """A :class:`~g2rpo.models.flux.FluxTextEncoder` (both tokenizers and text encoders)."""
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    from g2rpo.models.flux import FluxTextEncoder

    root = resolve_model_location(location, cache_dir)
    check_model_dir(root, TEXT_COMPONENTS)
    dt = _dtype(dtype)
    return FluxTextEncoder(
        CLIPTokenizer.from_pretrained(root, subfolder="tokenizer", local_files_only=True),
        CLIPTextModel.from_pretrained(root, subfolder="text_encoder", dtype=dt, local_files_only=True).eval(),
        T5TokenizerFast.from_pretrained(root, subfolder="tokenizer_2", local_files_only=True),
        T5EncoderModel.from_pretrained(root, subfolder="text_encoder_2", dtype=dt, local_files_only=True).eval(),
        max_sequence_length=max_sequence_length,
    )


def load_pipeline(location: str | Path, dtype: Any = "bfloat16", cache_dir: str | Path | None = None) -> Any:
    """The whole ``FluxPipeline`` (for evaluation and parity checks)."""
    from diffusers import FluxPipeline

    root = resolve_model_location(location, cache_dir)
    check_model_dir(root, ALL_COMPONENTS)
    return FluxPipeline.from_pretrained(root, dtype=_dtype(dtype), local_files_only=True)


# --------------------------------------------------------------------------- provenance


def base_model_record(location: str | Path, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Provenance of a base model, stored next to every exported fine-tune.

    ``{"location", "kind", "licence", "licence_url", "note"}``: the tiny model made by
    ``g2rpo model init-tiny`` (its ``g2rpo_tiny.json``) is the project's own random weights;
    anything else is taken to be FLUX.1-dev (or a fine-tune of it), whose licence binds derivatives.
    """
    root = resolve_model_location(location, cache_dir)
    marker = root / TINY_MARKER
    if marker.is_file():
        fix = "restore the model folder from its source or make it again (`g2rpo model init-tiny`)"
        info = read_json_file(marker, what="model marker", fix=fix, max_bytes=RECORD_MAX_BYTES)
        return {
            "location": str(location),
            "kind": "tiny",
            "licence": info.get("licence", "random weights made by g2rpo"),
            "licence_url": None,
            "note": "tiny random-weight model for tests and demos; not derived from FLUX.1-dev",
        }
    local_licence = root / "LICENSE.md"
    return {
        "location": str(location),
        "kind": "flux",
        "licence": FLUX_DEV_LICENCE,
        "licence_url": str(local_licence) if local_licence.is_file() else FLUX_DEV_LICENCE_URL,
        "note": "FLUX.1-dev weights are non-commercial; a model fine-tuned from them is a derivative under the same licence",
    }
