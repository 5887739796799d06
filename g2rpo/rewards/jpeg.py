"""JPEG compressibility: a weight-free, exact reward (DDPO's ``jpeg_compressibility``, per pixel).

Algorithm (Black et al. 2023, "Training Diffusion Models with Reinforcement Learning", which
rewards −(JPEG size in kB) at quality 95): quantise each image to uint8 (``round(255 · x)``),
encode it with PIL/libjpeg at a fixed ``quality`` (default 95, 4:2:0 chroma subsampling, PIL's
defaults otherwise) and return the negative size in bits per pixel,

    r(x) = − 8 · |JPEG(x)| / (H · W),

so the value does not depend on the resolution (DDPO's kB does). Higher = more compressible
(smoother, fewer details). Deterministic for a given libjpeg build; runs on the CPU per image
(the encoder is not batched), the prompt is not used. The trainer uses this head when no model
weights are available.
"""

from __future__ import annotations

import io

import torch

from g2rpo.rewards.base import RewardModel

__all__ = ["JPEGCompressibility", "jpeg_bits_per_pixel"]


def jpeg_bits_per_pixel(image: torch.Tensor, quality: int = 95) -> float:
    """JPEG size of one ``[3, H, W]`` image in [0, 1], in bits per pixel."""
    from PIL import Image

    pixels = (image.detach().float().cpu().clamp(0, 1) * 255.0).round().to(torch.uint8)  # [3, H, W]
    array = pixels.permute(1, 2, 0).contiguous().numpy()  # [H, W, 3]
    buffer = io.BytesIO()
    Image.fromarray(array, mode="RGB").save(buffer, format="JPEG", quality=quality)
    return 8.0 * buffer.tell() / (array.shape[0] * array.shape[1])


class JPEGCompressibility(RewardModel):
    """Negative JPEG bits per pixel at a fixed quality (weight-free)."""

    name = "jpeg_compressibility"
    needs_prompts = False

    def __init__(self, quality: int = 95):
        self.quality = quality

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        bpp = [jpeg_bits_per_pixel(image, self.quality) for image in images]
        return -torch.tensor(bpp, dtype=torch.float32)  # [B]
