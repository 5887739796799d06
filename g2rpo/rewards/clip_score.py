"""CLIP score: cosine of open_clip image and text embeddings.

Algorithm (Hessel et al. 2021 without their ×2.5 rescale and clipping at 0; the G²RPO / MixGRPO
training scripts' ``clip_score``): with f_img, f_txt an open_clip model's two towers,

    CLIP(x, y) = <f_img(x) / |f_img(x)|, f_txt(y) / |f_txt(y)|>   (≈ 0.2–0.4 on real images).

Weights: by default the reference scripts' model, Apple's DFN5B CLIP ViT-H-14 (384 px), which the
scripts load with ``open_clip.create_model_from_pretrained('local-dir:<folder>')``: a folder with
``open_clip_config.json`` (``model_cfg`` + ``preprocess_cfg``) and the weights
(``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``, as on the Hub). Any other
open_clip architecture loads from a folder of that layout (:meth:`CLIPScore.from_local_dir`) or
from a bare state-dict file plus a built-in ``arch`` name (:meth:`CLIPScore.from_checkpoint`).
``.bin`` files are read with ``torch.load(weights_only=True)``; loading is strict.

Preprocessing reproduced: open_clip's eval transform from the folder's ``preprocess_cfg``
(``resize_mode`` 'shortest' = shorter side to ``size`` + center crop, or 'squash'; the
interpolation; mean/std), batched in torch. open_clip resizes a PIL image; the torch kernel is
the identity at the model's resolution (docs/rewards.md: tolerance otherwise). Tokenizer: the
model's own (``open_clip.get_tokenizer``), which for DFN5B is the same ``SimpleTokenizer``
the reference scripts use.
"""

from __future__ import annotations

from pathlib import Path

import torch

from g2rpo.rewards.base import RewardModel, require_dir, require_file
from g2rpo.rewards.openclip_loading import (
    OpenClipConfig,
    build_open_clip,
    find_open_clip_weights,
    load_open_clip_state_dict,
    load_open_clip_weights,
    open_clip_preprocess,
)

__all__ = ["CLIPScore", "OpenClipCosine", "load_open_clip_weights", "find_open_clip_weights", "DEFAULT_CLIP_ARCH"]

# What the reference scripts load: hf-hub:apple/DFN5B-CLIP-ViT-H-14-384, here from a local folder.
DEFAULT_CLIP_ARCH = "apple/DFN5B-CLIP-ViT-H-14-384 (local-dir)"


class OpenClipCosine(RewardModel):
    """The cosine of an open_clip model's normalised image and text embeddings (no logit scale), after
    the head's own :meth:`preprocess`: what CLIP score and HPS-v2.1 share (they differ in preprocessing
    and weights only)."""

    def __init__(self, model: torch.nn.Module, tokenizer, preprocess_cfg: dict, *, device="cpu", dtype=torch.float32):
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.preprocess_cfg = preprocess_cfg
        self.device = torch.device(device)
        self.dtype = dtype

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """open_clip's eval transform from ``preprocess_cfg`` on a float batch in [0, 1]."""
        return open_clip_preprocess(images, self.preprocess_cfg)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        x = images.to(device=self.device, dtype=torch.float32)
        x = self.preprocess(x).to(self.dtype)  # [B, 3, S, S]
        tokens = self.tokenizer(prompts).to(self.device)  # [B, L]
        image_features = self.model.encode_image(x, normalize=True)  # [B, D], unit norm
        text_features = self.model.encode_text(tokens, normalize=True)  # [B, D], unit norm
        return (image_features * text_features).sum(dim=-1)  # [B] = diag(I Tᵀ)


class CLIPScore(OpenClipCosine):
    """Cosine similarity of open_clip embeddings (no logit scale), open_clip's own preprocessing."""

    name = "clip"

    @classmethod
    def from_local_dir(cls, folder: str | Path, *, device="cpu", dtype=torch.float32) -> CLIPScore:
        """An open_clip ``local-dir:`` folder (``open_clip_config.json`` + weights)."""
        field = "clip.weights"
        path = require_dir(field, folder, "an open_clip folder with open_clip_config.json and weights")
        require_file(
            f"{field}/open_clip_config.json", path / "open_clip_config.json", "the folder's open_clip_config.json"
        )
        weights = find_open_clip_weights(field, path)
        model, preprocess_cfg, tokenizer = build_open_clip("clip", str(path), path)
        load_open_clip_state_dict(field, weights, model, load_open_clip_weights(field, weights))
        return cls(model, tokenizer, preprocess_cfg, device=device, dtype=dtype)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        *,
        arch: str,
        open_clip_config: OpenClipConfig = None,
        device="cpu",
        dtype=torch.float32,
    ) -> CLIPScore:
        """A bare open_clip state-dict file for a built-in ``arch`` (or an explicit config)."""
        field = "clip.weights"
        path = require_file(field, checkpoint_path, "an open_clip state dict (.bin/.pt/.safetensors)")
        model, preprocess_cfg, tokenizer = build_open_clip("clip", arch, open_clip_config)
        load_open_clip_state_dict(field, path, model, load_open_clip_weights(field, path))
        return cls(model, tokenizer, preprocess_cfg, device=device, dtype=dtype)
