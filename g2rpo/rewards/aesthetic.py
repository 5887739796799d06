"""LAION aesthetic score: the improved-aesthetic-predictor MLP on CLIP ViT-L/14 image embeddings.

Algorithm (C. Schuhmann, ``improved-aesthetic-predictor``, ``simple_inference.py``): the image's
CLIP ViT-L/14 (OpenAI weights) embedding e is L2-normalised and fed to a 5-layer linear MLP
(768 → 1024 → 128 → 64 → 16 → 1, dropout between the first four, no activations):

    aesthetic(x) = MLP(e / |e|),   e = f_img(x)   (≈ 1–10, the AVA rating scale).

The prompt is not used. Weights: the MLP state dict ``sac+logos+ava1-l14-linearMSE.pth`` (keys
``layers.{0,2,4,6,7}.weight/bias``, tensors only: ``torch.load(weights_only=True)``, strict) and
an open_clip ViT-L/14 with QuickGELU (the OpenAI weights), from an open_clip ``local-dir:``
folder (``open_clip_config.json`` + weights, e.g. ``timm/vit_large_patch14_clip_224.openai``) or
a state-dict file with ``arch='ViT-L-14-quickgelu'``. OpenAI's own ``ViT-L-14.pt`` is a
TorchScript archive that ``weights_only`` cannot read: convert it to a state dict first.

Preprocessing: OpenAI CLIP's (shorter side to 224 bicubic, center crop, CLIP mean/std), from
the open_clip folder's ``preprocess_cfg``, in torch on the batch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel, load_weights_only, require_file, strict_key_check
from g2rpo.rewards.clip_score import CLIPScore
from g2rpo.rewards.openclip_loading import open_clip_preprocess

__all__ = ["Aesthetic", "AestheticMLP"]


class AestheticMLP(nn.Module):
    """The predictor's MLP; Linear layers at ``layers.{0,2,4,6,7}`` as in the published file. ImageReward's
    head is the same network (its checkpoint's ``mlp.layers.*``), so it uses this class too."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.layers(embedding).squeeze(-1)  # [B]


class Aesthetic(RewardModel):
    """LAION aesthetic predictor (image only)."""

    name = "aesthetic"
    needs_prompts = False

    def __init__(self, clip: CLIPScore, mlp: AestheticMLP):
        self.clip = clip
        self.mlp = mlp.to(clip.device).float().eval().requires_grad_(False)

    @classmethod
    def from_files(
        cls,
        mlp_path: str | Path,
        *,
        clip_dir: str | Path | None = None,
        clip_checkpoint: str | Path | None = None,
        arch: str = "ViT-L-14-quickgelu",
        device="cpu",
        dtype=torch.float32,
    ) -> Aesthetic:
        if (clip_dir is None) == (clip_checkpoint is None):
            raise G2RPOError(
                problem(
                    "aesthetic.backbone",
                    (clip_dir, clip_checkpoint),
                    "give exactly one of an open_clip folder or a ViT-L/14 state-dict file",
                )
            )
        if clip_dir is not None:
            clip = CLIPScore.from_local_dir(clip_dir, device=device, dtype=dtype)
        else:
            clip = CLIPScore.from_checkpoint(clip_checkpoint, arch=arch, device=device, dtype=dtype)
        field = "aesthetic.weights"
        path = require_file(field, mlp_path, "the aesthetic MLP state dict (sac+logos+ava1-l14-linearMSE.pth)")
        state = load_weights_only(field, path)
        if not isinstance(state, dict):
            raise G2RPOError(problem(field, str(path), "does not hold a state dict"))
        width = clip.model.visual.output_dim
        mlp = AestheticMLP(width)
        strict_key_check(
            field, path, set(mlp.state_dict()), set(state), "Pass the improved-aesthetic-predictor MLP file"
        )
        first = state["layers.0.weight"]
        if tuple(first.shape) != (1024, width):
            raise G2RPOError(
                problem(
                    field,
                    str(path),
                    f"layers.0.weight is {tuple(first.shape)}, the CLIP embedding is "
                    f"{width} wide: pair the MLP with its CLIP backbone (ViT-L/14 → 768)",
                )
            )
        mlp.load_state_dict(state, strict=True)
        return cls(clip, mlp)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        clip = self.clip
        x = images.to(device=clip.device, dtype=torch.float32)
        x = open_clip_preprocess(x, clip.preprocess_cfg).to(clip.dtype)  # [B, 3, 224, 224]
        embedding = clip.model.encode_image(x, normalize=True).float()  # [B, D], unit norm
        return self.mlp(embedding)  # [B]
