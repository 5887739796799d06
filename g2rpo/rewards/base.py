"""The reward interface, input validation and the batched torch preprocessing every head shares.

Every reward head is a :class:`RewardModel`: ``score(images, prompts) -> tensor[B]`` in the
model's own native scale (HPS ≈ 0.3, PickScore ≈ 20, ImageReward ≈ N(0, 1), ...). ``images`` is a
float tensor ``[B, 3, H, W]`` with values in [0, 1] (the VAE decoder's [−1, 1] output mapped by
``(x + 1) / 2``); ``prompts`` is a ``list[str]`` of length B.

Validation (:func:`validate_inputs`) rejects, with a :class:`~g2rpo.errors.G2RPOError` that names
the fix: a non-tensor or non-float tensor, a shape other than ``[B, 3, H, W]``, values outside
[0, 1] by more than :data:`RANGE_TOLERANCE`, NaN/inf pixels, a prompt list of another length, a
non-string or empty prompt. Values inside the tolerance band (bf16 rounding of a decoder output
gives ≈ 1e-3 overshoot) are clamped to [0, 1]; nothing further is corrected.

Preprocessing is done in torch on the whole batch (:func:`resize_shortest_center_crop`,
:func:`resize_squash`, :func:`normalize`), on the images' device, through torchvision's tensor
kernels. The reference packages instead resize a PIL image per sample (ImageReward, open_clip,
PickScore's transformers-4 ``CLIPImageProcessor``) or a per-sample tensor (hpsv2). When the input
already has the model's resolution the resize is the identity in every path and scores agree to
float precision; otherwise torch bicubic (antialiased, float) and PIL bicubic (uint8) differ by a
few 1e-3 in pixel value (measured numbers: docs/rewards.md).

Non-finite scores are reported by reward name and count: every :meth:`RewardModel.score` call
that returns a NaN/inf score logs a warning on the ``g2rpo.rewards`` logger
(:func:`non_finite_report`: ``reward 'hps_v21' returned NaN/inf for 2 of 8 image(s) (indices
[1, 5])``) and returns the scores unchanged, so that a caller such as the trainer can keep them and
drop the affected groups; :func:`check_finite` (used by
:func:`~g2rpo.rewards.scoring.score_rewards` with ``require_finite=True``) raises the same line as
an error instead.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import torch

from g2rpo.errors import G2RPOError, problem

__all__ = [
    "RANGE_TOLERANCE",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "RewardModel",
    "validate_inputs",
    "non_finite_report",
    "check_finite",
    "resize_shortest_center_crop",
    "resize_squash",
    "resize_longest_pad",
    "normalize",
    "require_file",
    "require_dir",
    "load_weights_only",
    "strict_key_check",
]

_log = logging.getLogger("g2rpo.rewards")

# Pixels may leave [0, 1] by this much (bf16/fp16 decoder rounding) before it is an error.
RANGE_TOLERANCE = 1e-2

# CLIP's normalisation constants (OpenAI CLIP, reused by open_clip, HPS, PickScore, BLIP/ImageReward).
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class RewardModel(ABC):
    """A reward head. Subclasses set ``name`` and implement :meth:`_score` on validated input."""

    name: str = "reward"

    def score(self, images: torch.Tensor, prompts: Sequence[str], *, grad: bool = False) -> torch.Tensor:
        """Scores ``[B]`` (float32, on the images' device) in the model's native scale.

        Runs under ``torch.no_grad()`` unless ``grad=True`` (reward backpropagation into the
        images; the JPEG head is not differentiable and returns scores without a graph). NaN/inf
        scores are returned as they are and logged as a warning naming the reward and the count.
        """
        images, prompts = validate_inputs(self.name, images, prompts, needs_prompts=self.needs_prompts)
        with torch.set_grad_enabled(grad):
            out = self._score(images, prompts)
        out = out.float().to(images.device)
        report = non_finite_report(self.name, out)
        if report is not None:
            _log.warning(report)
        return out

    #: Weight-free image-only scorers set this to False: they accept empty prompts.
    needs_prompts: bool = True

    @abstractmethod
    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Scores for validated ``images`` ``[B, 3, H, W]`` in [0, 1]."""


# --------------------------------------------------------------------------- validation


def validate_inputs(
    name: str,
    images: object,
    prompts: object,
    *,
    needs_prompts: bool = True,
    tolerance: float = RANGE_TOLERANCE,
) -> tuple[torch.Tensor, list[str]]:
    """Check ``images`` and ``prompts`` against the reward interface; clamp the tolerance band.

    Returns the images (clamped into [0, 1] when they lie within ``tolerance`` outside it) and the
    prompts as a list. Everything else that is off raises :class:`G2RPOError`.
    """
    field = f"{name}.images"
    if not isinstance(images, torch.Tensor):
        raise G2RPOError(
            problem(field, type(images).__name__, "pass a torch.Tensor [B, 3, H, W] with values in [0, 1]")
        )
    if not images.is_floating_point():
        raise G2RPOError(
            problem(
                f"{field}.dtype",
                str(images.dtype),
                "pass a float tensor in [0, 1]; for uint8 images use images.float() / 255",
            )
        )
    if images.ndim != 4 or images.shape[1] != 3:
        raise G2RPOError(
            problem(
                f"{field}.shape",
                tuple(images.shape),
                "pass [B, 3, H, W] (channels first, RGB); for one image use images[None], "
                "for [B, H, W, 3] use images.permute(0, 3, 1, 2)",
            )
        )
    if images.shape[0] == 0 or images.shape[2] == 0 or images.shape[3] == 0:
        raise G2RPOError(
            problem(f"{field}.shape", tuple(images.shape), "the batch and both image sides must be non-empty")
        )
    finite = torch.isfinite(images.detach())
    if not bool(finite.all()):
        bad = int((~finite.flatten(1).all(dim=1)).sum())
        raise G2RPOError(problem(field, f"{bad} image(s) with NaN/inf pixels", "drop or regenerate those images"))
    lo, hi = float(images.detach().min()), float(images.detach().max())
    if lo < -tolerance or hi > 1.0 + tolerance:
        hint = " (they look like [-1, 1] decoder output: map them with (x + 1) / 2)" if lo < -0.5 else ""
        hint = " (they look like [0, 255] pixels: divide by 255)" if hi > 2.0 else hint
        raise G2RPOError(
            problem(f"{field} range", (round(lo, 4), round(hi, 4)), f"pixel values must lie in [0, 1]{hint}")
        )
    if lo < 0.0 or hi > 1.0:
        images = images.clamp(0.0, 1.0)

    batch = images.shape[0]
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise G2RPOError(
            problem(f"{name}.prompts", type(prompts).__name__, f"pass a list of {batch} strings, one per image")
        )
    prompts = list(prompts)
    if len(prompts) != batch:
        raise G2RPOError(
            problem(
                f"{name}.prompts", f"{len(prompts)} prompts for {batch} images", "pass exactly one prompt per image"
            )
        )
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise G2RPOError(problem(f"{name}.prompts[{i}]", prompt, "every prompt must be a str"))
        if needs_prompts and not prompt.strip():
            raise G2RPOError(
                problem(
                    f"{name}.prompts[{i}]", prompt, f"'{name}' scores image-text agreement: give a non-empty prompt"
                )
            )
    return images, prompts


def non_finite_report(name: str, scores: torch.Tensor) -> str | None:
    """``None`` when every score is finite, else a line naming the reward, the count and indices."""
    bad = ~torch.isfinite(scores.detach())
    count = int(bad.sum())
    if count == 0:
        return None
    indices = torch.nonzero(bad.flatten()).flatten().tolist()
    shown = indices[:10] + (["..."] if len(indices) > 10 else [])
    return f"reward '{name}' returned NaN/inf for {count} of {scores.numel()} image(s) (indices {shown})"


def check_finite(name: str, scores: torch.Tensor) -> torch.Tensor:
    """Return ``scores`` unchanged, or raise :class:`G2RPOError` with :func:`non_finite_report`."""
    report = non_finite_report(name, scores)
    if report is not None:
        raise G2RPOError(report + ": check the reward's weights and dtype (bf16/fp16 overflow) and the images")
    return scores


# --------------------------------------------------------------------------- preprocessing


def resize_shortest_center_crop(images: torch.Tensor, size: int, *, interpolation: str = "bicubic") -> torch.Tensor:
    """Resize the shorter side to ``size`` (aspect kept), then center-crop ``size × size``.

    torchvision's tensor kernels on the whole batch ``[B, 3, H, W]`` (antialiased); the
    identity when the images are already ``size × size``. Equals torchvision's
    ``Resize(size) + CenterCrop(size)`` on each tensor image (the hpsv2 path) exactly.
    """
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    mode = InterpolationMode(interpolation)
    h, w = images.shape[-2:]
    if min(h, w) != size:
        images = TF.resize(images, size, interpolation=mode, antialias=True)  # [B, 3, h', w'], min(h', w') = size
    if images.shape[-2:] != (size, size):
        images = TF.center_crop(images, [size, size])
    return images  # [B, 3, size, size]


def resize_longest_pad(
    images: torch.Tensor, size: int, *, fill: float = 0.0, interpolation: str = "bicubic"
) -> torch.Tensor:
    """Resize the *longer* side to ``size`` (aspect kept), then pad to ``size × size`` with ``fill``.

    hpsv2's ``ResizeMaxSize`` (its ``preprocess_val`` under ``light_augmentation=True``, which
    ``img_score`` uses): scale = size / max(H, W); new sides ``round(H·scale)``, ``round(W·scale)``
    (Python rounding); torchvision bicubic on the tensor; zero padding split as
    ``[⌊pw/2⌋ left, ⌊ph/2⌋ top, rest right/bottom]``. hpsv2 skips the padding when the longer
    side already equals ``size``, handing a non-square tensor to the ViT (which then fails);
    here such images are padded too.
    """
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    h, w = images.shape[-2:]
    scale = size / float(max(h, w))
    if scale != 1.0:
        new_h, new_w = round(h * scale), round(w * scale)
        images = TF.resize(images, [new_h, new_w], interpolation=InterpolationMode(interpolation), antialias=True)
    h, w = images.shape[-2:]
    pad_h, pad_w = size - h, size - w
    if pad_h or pad_w:
        images = TF.pad(images, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=fill)
    return images  # [B, 3, size, size]


def resize_squash(images: torch.Tensor, size: tuple[int, int], *, interpolation: str = "bicubic") -> torch.Tensor:
    """Resize to exactly ``size = (height, width)`` ignoring the aspect ratio (open_clip 'squash')."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    if tuple(images.shape[-2:]) == tuple(size):
        return images
    return TF.resize(images, list(size), interpolation=InterpolationMode(interpolation), antialias=True)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x − mean) / std`` per channel on ``[B, 3, H, W]``."""
    m = torch.as_tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)  # [1, 3, 1, 1]
    s = torch.as_tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)  # [1, 3, 1, 1]
    return (images - m) / s


# --------------------------------------------------------------------------- files


def require_file(field: str, path: str | Path, what: str) -> Path:
    """``path`` as a Path if it is an existing file, else a G2RPOError saying what belongs there."""
    p = Path(path)
    if not p.is_file():
        state = "is a directory" if p.is_dir() else "does not exist"
        raise G2RPOError(problem(field, str(p), f"{state}; point it at {what}"))
    return p


def require_dir(field: str, path: str | Path, what: str) -> Path:
    """``path`` as a Path if it is an existing directory, else a G2RPOError."""
    p = Path(path)
    if not p.is_dir():
        state = "is a file" if p.is_file() else "does not exist"
        raise G2RPOError(problem(field, str(p), f"{state}; point it at {what}"))
    return p


def load_weights_only(field: str, path: Path) -> object:
    """``torch.load(path, map_location='cpu', weights_only=True)`` with a clear error on failure.

    ``weights_only=True`` refuses arbitrary pickled objects; every published file these heads read
    (HPS_v2.1_compressed.pt, ImageReward.pt, open_clip .bin) holds only tensors and containers.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - re-raised as a user-facing error
        raise G2RPOError(
            problem(
                field,
                str(path),
                f"could not be read as a tensors-only torch checkpoint ({exc.__class__.__name__}: "
                f"{str(exc).splitlines()[0][:200]}); pass the published file, not a full pickled model",
            )
        ) from None


def strict_key_check(field: str, path: Path, expected: set[str], found: set[str], fix: str) -> None:
    """Raise a G2RPOError listing missing and unexpected state-dict keys, if any."""
    missing = sorted(expected - found)
    unexpected = sorted(found - expected)
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {_head(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {_head(unexpected)}")
    raise G2RPOError(problem(field, str(path), "; ".join(parts) + f". {fix}"))


def shape_check(
    field: str, path: Path, expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], fix: str
) -> None:
    """Raise a G2RPOError naming the tensors of ``found`` whose shape differs from ``expected``'s (same keys)."""
    wrong = [
        f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in found.items()
        if tuple(v.shape) != tuple(expected[k].shape)
    ]
    if wrong:
        raise G2RPOError(
            problem(field, str(path), f"{len(wrong)} tensor(s) have the wrong shape ({'; '.join(wrong[:4])}): {fix}")
        )


def _head(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(keys[:n])
    return shown + (f", ... (+{len(keys) - n} more)" if len(keys) > n else "")
