"""Inputs shared by the parity generators: offline guard, prompts, images, random weights, JSON.

Imported by ``make_hps_v21.py`` and ``make_image_reward.py``, which run inside the reference
virtualenvs (``parity/.venv-hpsv2``, ``parity/.venv-imagereward``), so this module needs only
the standard library, torch, numpy and Pillow (both envs have them).

Everything is seeded: the same seed gives byte-identical PNGs and weights on the same torch.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import platform
import shlex
import socket
import sys
from pathlib import Path

import torch
from PIL import Image

SEED = 20261129

# One prompt per image. The last prompt is longer than both context windows (77 CLIP BPE tokens,
# 35 BERT word pieces) so truncation is part of the check; "Zyxwvut" is not in the tiny BERT vocab
# (an [UNK]); capitals and punctuation exercise lower-casing and splitting.
PROMPTS = [
    "a photo of a red fox sitting in the snow",
    "An oil painting of a lighthouse at dusk, dramatic clouds!",
    "cyberpunk city street at night, neon signs and rain. Zyxwvut",
    (
        "a highly detailed watercolor painting of an old stone bridge over a quiet river in autumn, "
        "golden leaves falling, warm evening light, soft mist over the water, a small red boat near "
        "the bank, mountains in the distance under a pale blue sky, children playing on the grass, "
        "a dog running beside them, birds flying over the trees, a wooden house with smoke rising "
        "from the chimney, lanterns hanging along the path, reflections shimmering on the surface"
    ),
]


def forbid_network() -> None:
    """Make any non-loopback socket connection raise (the reference code must stay offline); one thread."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = host == "localhost"
            if not loopback:
                raise RuntimeError(f"parity generator tried to reach {address!r}; it must run offline")
        return real_connect(self, address)

    socket.socket.connect = guarded
    # One thread: the reference sums (and the images) then do not depend on the machine's cores.
    torch.set_num_threads(1)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[var] = "1"


def smooth_image(generator: torch.Generator, height: int, width: int) -> Image.Image:
    """A seeded RGB image: a bilinear-upsampled 5×5 colour field plus a sharp rectangle.

    Smooth fields keep the PNGs small; the rectangle adds edges, so a resize or a channel-order
    error changes the pixels the model sees.
    """
    # float64: with float32, torch's thread count changed one rounded pixel of a 200×300 image.
    coarse = torch.rand(1, 3, 5, 5, generator=generator, dtype=torch.float64)  # [1, 3, 5, 5]
    field = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=True)[0]
    top, left = (int(v) for v in torch.randint(0, min(height, width) // 2, (2,), generator=generator))
    colour = torch.rand(3, 1, 1, generator=generator, dtype=torch.float64)
    field[:, top : top + height // 3, left : left + width // 4] = colour
    pixels = (field.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()  # [H, W, 3]
    return Image.fromarray(pixels.numpy(), mode="RGB")


def write_images(out_dir: Path, sizes: list[tuple[int, int]], prefix: str, generator: torch.Generator) -> list[str]:
    """Write one PNG per (height, width); return their paths relative to ``out_dir``'s parent."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for index, (height, width) in enumerate(sizes):
        name = f"{prefix}{index}_{height}x{width}.png"
        smooth_image(generator, height, width).save(out_dir / name, optimize=True)
        names.append(f"{out_dir.name}/{name}")
    return names


def randomize_(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Overwrite every floating parameter with seeded random values of a sane scale.

    Matrices get N(0, 1/fan_in) (fan_in = all dims but the first), so activations stay O(1) at any
    width and float32 differences between implementations stay near 1e-7. One-dimensional
    ``*weight`` tensors (LayerNorm gains) get 1 + N(0, 0.1²); other vectors (biases, class
    embeddings) N(0, 0.1²). No parameter keeps a constant initial value, so a swapped or dropped
    key changes the score.
    """
    with torch.no_grad():
        for name, param in module.named_parameters():
            if not param.is_floating_point() or param.ndim == 0:
                continue  # scalars such as CLIP's logit_scale do not enter the scores
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.ndim >= 2:
                fan_in = param[0].numel()
                param.copy_(noise / math.sqrt(fan_in))
            elif name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            else:
                param.copy_(0.1 * noise)


def versions(*distributions: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in distributions:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
