"""HPS-v2.1: Human Preference Score v2.1 on open_clip ViT-H-14.

Algorithm (Wu et al. 2023, "Human Preference Score v2"; the ``hpsv2`` package's
``img_score.score``): an open_clip CLIP model fine-tuned on human preference pairs; the score of
image x for prompt y is the cosine of their embeddings,

    HPS(x, y) = <f_img(x) / |f_img(x)|, f_txt(y) / |f_txt(y)|>,

with no logit scale (≈ 0.25–0.35 on real images, the scale of the paper's tables).

Checkpoint: ``HPS_v2.1_compressed.pt`` is ``{"state_dict": <open_clip CLIP state dict>}`` (the
hpsv2 code reads ``checkpoint['state_dict']`` and loads it strictly into
``create_model_and_transforms('ViT-H-14', ...)``); it holds only tensors, so it is read with
``torch.load(weights_only=True)``. A bare state dict (no ``state_dict`` wrapper) is accepted too, and
so is a ``.safetensors`` state dict (a converted checkpoint, or a learned reward made here:
:mod:`g2rpo.rewards.shapes_learned`); a folder holding ``open_clip_model.safetensors`` and
``open_clip_config.json`` (open_clip's ``local-dir`` layout) is read as that file with that config.

Preprocessing reproduced: hpsv2's ``img_score`` builds its model with
``light_augmentation=True``, so its ``preprocess_val`` is ``ToTensor`` then ``ResizeMaxSize(224)``:
the *longer* side is resized to 224 with torchvision bicubic on the *tensor* (antialiased) and
the shorter side is zero-padded to 224 (centred, extra pixel right/bottom), then ``Normalize``
with OpenAI CLIP mean/std. Square images therefore get a plain resize; non-square ones are
letterboxed, not center-cropped. Because hpsv2 resizes a tensor, not a PIL image, the batched
torch path here (:func:`~g2rpo.rewards.base.resize_longest_pad`) runs the same kernel. Tokenizer:
open_clip's ``SimpleTokenizer`` (context 77) from ``get_tokenizer(arch)``.

Departures: batched (the reference scores one image at a time); no CUDA autocast (run the head in
bf16 by passing ``dtype``); the text is tokenized once per batch.

Public loader (the contract with the parity fixtures, docs/rewards.md)::

    HPSv21.from_checkpoint(checkpoint_path, *, arch="ViT-H-14", open_clip_config=None,
                           device="cpu", dtype=torch.float32)
    head.score(images [B, 3, H, W] in [0, 1], prompts: list[str]) -> tensor[B]

``open_clip_config`` (a dict, an ``open_clip_config.json`` path, or its folder) replaces the
built-in ``arch`` config, e.g. with a tiny architecture for tests.
"""

from __future__ import annotations

from pathlib import Path

import torch

from g2rpo.rewards.base import normalize, require_file, resize_longest_pad
from g2rpo.rewards.clip_score import OpenClipCosine
from g2rpo.rewards.openclip_loading import (
    OpenClipConfig,
    build_open_clip,
    load_open_clip_state_dict,
    load_open_clip_weights,
)

__all__ = ["HPSv21"]


class HPSv21(OpenClipCosine):
    """HPS-v2.1 reward: cosine of open_clip image and text embeddings, hpsv2's preprocessing."""

    name = "hps_v21"

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        *,
        arch: str = "ViT-H-14",
        open_clip_config: OpenClipConfig = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> HPSv21:
        """Load an ``HPS_v2.1_compressed.pt``-layout checkpoint strictly (see module docstring)."""
        field = "hps_v21.weights"
        path = require_file(
            field, checkpoint_path, "HPS_v2.1_compressed.pt (a {'state_dict': ...} torch file) or a .safetensors"
        )
        model, preprocess_cfg, tokenizer = build_open_clip("hps_v21", arch, open_clip_config)
        load_open_clip_state_dict(field, path, model, load_open_clip_weights(field, path))
        return cls(model, tokenizer, preprocess_cfg, device=device, dtype=dtype)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """hpsv2's ``ResizeMaxSize`` + ``Normalize`` on a float batch in [0, 1]."""
        size = self.preprocess_cfg["size"]
        size = size if isinstance(size, int) else size[0]
        x = resize_longest_pad(images, size, fill=0.0, interpolation="bicubic")  # [B, 3, S, S]
        return normalize(x, self.preprocess_cfg["mean"], self.preprocess_cfg["std"])
