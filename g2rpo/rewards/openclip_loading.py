"""Build an open_clip model + tokenizer offline and load a state dict into it strictly.

Shared by the HPS-v2.1 and CLIP-score heads. The architecture is either an open_clip built-in
name (``"ViT-H-14"``) or an explicit config: a ``dict`` (``{"model_cfg": ..., "preprocess_cfg":
...}`` as in an ``open_clip_config.json``, or a bare model config with ``embed_dim`` /
``vision_cfg`` / ``text_cfg``), a path to such a JSON file, or a folder holding
``open_clip_config.json`` (open_clip's ``local-dir:`` layout). Explicit configs go through
open_clip's own ``local-dir:`` code path (written to a temporary folder when needed), so the
model class, defaults and tokenizer are chosen exactly as open_clip chooses them. No network:
``pretrained`` is never passed, weights are loaded by :func:`load_open_clip_state_dict`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from g2rpo.config import CONFIG_MAX_BYTES
from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import (
    load_weights_only,
    normalize,
    resize_shortest_center_crop,
    resize_squash,
    shape_check,
    strict_key_check,
)
from g2rpo.textfile import read_json_file

OpenClipConfig = None | dict | str | Path


@contextlib.contextmanager
def _quiet_open_clip():
    """open_clip logs 'no pretrained weights loaded' warnings on the root logger; weights are
    loaded separately here, so those lines would only mislead."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _config_dict(field: str, open_clip_config: dict | str | Path) -> dict[str, Any]:
    if isinstance(open_clip_config, dict):
        cfg = open_clip_config
    else:
        path = Path(open_clip_config)
        if path.is_dir():
            path = path / "open_clip_config.json"
        try:  # a regular UTF-8 file of at most CONFIG_MAX_BYTES holding one JSON object
            cfg = read_json_file(
                path,
                what="config file",
                fix="pass an open_clip_config.json or its folder",
                max_bytes=CONFIG_MAX_BYTES,
            )
        except G2RPOError as exc:
            raise G2RPOError(problem(field, str(path), str(exc))) from None
    if "model_cfg" not in cfg:
        cfg = {"model_cfg": cfg}
    model_cfg = cfg["model_cfg"]
    if not isinstance(model_cfg, dict) or not {"embed_dim", "vision_cfg", "text_cfg"} <= set(model_cfg):
        raise G2RPOError(
            problem(
                field,
                sorted(model_cfg) if isinstance(model_cfg, dict) else model_cfg,
                "an open_clip model config needs embed_dim, vision_cfg and text_cfg",
            )
        )
    return cfg


def build_open_clip(
    field: str,
    arch: str,
    open_clip_config: OpenClipConfig = None,
) -> tuple[torch.nn.Module, dict[str, Any], Any]:
    """``(model, preprocess_cfg, tokenizer)`` with random weights, in eval mode, on the CPU.

    ``open_clip_config`` None: ``arch`` is an open_clip built-in name. Otherwise the explicit
    config wins and ``arch`` is only used in messages.
    """
    import open_clip

    if open_clip_config is None:
        if arch not in open_clip.list_models():
            raise G2RPOError(
                problem(
                    f"{field}.arch",
                    arch,
                    "not an open_clip built-in architecture; use e.g. 'ViT-H-14' "
                    "or pass open_clip_config (a dict, JSON file or local-dir folder)",
                )
            )
        with _quiet_open_clip():
            model = open_clip.create_model(arch, pretrained=None, device="cpu")
        tokenizer = open_clip.get_tokenizer(arch)
    else:
        cfg = _config_dict(f"{field}.open_clip_config", open_clip_config)
        with tempfile.TemporaryDirectory(prefix="g2rpo-openclip-") as tmp:
            (Path(tmp) / "open_clip_config.json").write_text(json.dumps(cfg), encoding="utf-8")
            try:
                with _quiet_open_clip():
                    model = open_clip.create_model(f"local-dir:{tmp}", device="cpu")
                    tokenizer = open_clip.get_tokenizer(f"local-dir:{tmp}")
            except (ValueError, TypeError, KeyError, RuntimeError) as exc:
                raise G2RPOError(
                    problem(f"{field}.open_clip_config", cfg["model_cfg"], f"open_clip cannot build it ({exc})")
                ) from None
    model.eval()
    return model, dict(model.visual.preprocess_cfg), tokenizer


def load_open_clip_state_dict(field: str, path: Path, model: torch.nn.Module, state_dict: object) -> None:
    """Strictly load ``state_dict`` into ``model``; missing/unexpected/mis-shaped keys are errors."""
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise G2RPOError(
            problem(field, str(path), "does not hold a state dict of tensors; pass the published checkpoint")
        )
    expected = model.state_dict()
    strict_key_check(
        field,
        path,
        set(expected),
        set(state_dict),
        "The file does not match the architecture: check `arch` / `open_clip_config`",
    )
    shape_check(field, path, expected, state_dict, "check `arch` / `open_clip_config`")
    model.load_state_dict(state_dict, strict=True)


def open_clip_preprocess(images: torch.Tensor, preprocess_cfg: dict[str, Any]) -> torch.Tensor:
    """open_clip's eval transform (resize mode, size, interpolation, mean/std) on a batch."""
    size = preprocess_cfg["size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    mode = preprocess_cfg.get("resize_mode", "shortest")
    interpolation = preprocess_cfg.get("interpolation", "bicubic")
    if mode == "shortest" and size[0] == size[1]:
        images = resize_shortest_center_crop(images, size[0], interpolation=interpolation)
    elif mode == "squash":
        images = resize_squash(images, size, interpolation=interpolation)
    else:
        raise G2RPOError(
            problem(
                "preprocess_cfg.resize_mode", (mode, size), "only 'shortest' (square size) and 'squash' are supported"
            )
        )
    return normalize(images, preprocess_cfg["mean"], preprocess_cfg["std"])


_WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def find_open_clip_weights(field: str, folder: Path) -> Path:
    for name in _WEIGHT_NAMES:
        if (folder / name).is_file():
            return folder / name
    raise G2RPOError(problem(field, str(folder), f"holds no weights; expected one of {list(_WEIGHT_NAMES)}"))


def load_open_clip_weights(field: str, path: Path) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` or a tensors-only torch file (``weights_only=True``)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # noqa: BLE001
            raise G2RPOError(problem(field, str(path), f"is not a readable safetensors file ({exc})")) from None
    state = load_weights_only(field, path)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return state  # type: ignore[return-value]
