"""Exact rewards of the shapes task (:mod:`g2rpo.tasks.shapes`), computed from the image and its prompt.

Each head parses the prompt into its scene (shape, colour c, size, position, background b) and
scores an image ``[3, S, S]`` in [0, 1] with per-pixel arithmetic; every score lies in [0, 1],
higher is better, and the rendered scene itself scores 1 on all four. With per-pixel distances
d_c = mean over RGB of |x − c| and d_b likewise for b:

- ``shapes_colour`` (colour fidelity): the pixels that are not background (d_b > 0.2) should have
  the prompt's colour: 1 − mean d_c over them; 0 when every pixel is background.
- ``shapes_shape`` (shape correctness): the foreground F = pixels closer to c than to b (in RGB
  distance); the IoU of F with the prompt's shape and size moved so that its centroid is F's — so
  the shape counts, not where it is; 0 when F is empty.
- ``shapes_position``: 1 − |centroid(F) − centroid of the prompt's shape at its position| / (S/√2),
  at least 0 (S/√2 is the distance between opposite corner positions); 0 when F is empty.
- ``shapes_background`` (background fidelity): 1 − mean d_b over the pixels at least 2 pixels away
  from the prompt's shape at its place.
- ``shapes_colour_match`` (is the colour right, 0 or 1): 1 when the mean RGB of the pixels that are
  not background (d_b > 0.2) is nearer (Euclidean) to the prompt's colour than to any other colour
  of the task; 0 otherwise, and when every pixel is background. The mean over samples is "the
  fraction drawn in the asked colour", which a person can check on the images; ``shapes_colour``
  is its smooth version, the one trained on.

One more head is a *positive control* for MGAI (docs/algorithm.md §4), not part of the task's
scores (:data:`CONTROLS`; :func:`scene_scores` leaves it out):

- ``shapes_texture`` (fine texture, asked by size): with luma y = 0.299 R + 0.587 G + 0.114 B and
  the one-pixel checker c[i, j] = (−1)^(i+j), the texture amplitude is t = mean over the foreground
  F (as for ``shapes_shape``) of y·c. A *large* shape should be filled with that fine checker
  (score t), a *small* one flat (score −|t|); 0 when F is empty. Pixel-scale detail like this is
  decided by the last denoising steps, so — unlike the task's scores — it depends on how a branch
  is finished (``benchmarks/stride_agreement.py --rewards texture``). Scores are small (|t| ≲ 0.02
  on the shipped models) and lie in [−0.5, 0.5]; only their ranking within a group matters.

The task's training rewards are ``shapes_colour`` and ``shapes_shape`` (the paper's multi-reward
setting); ``shapes_colour_match`` reads the first as a fraction of right colours (an in-domain
check, never trained on); ``shapes_position``, ``shapes_background`` and ``jpeg_compressibility``
are out-of-domain metrics nobody trains on, which show whether optimising the first two hacks the
rest.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel
from g2rpo.tasks.shapes import BACKGROUNDS, COLOURS, Scene, parse_prompt, scene_centre, shape_mask

__all__ = [
    "CONTROLS",
    "IN_DOMAIN",
    "IN_DOMAIN_CHECKS",
    "MEASURES",
    "OUT_OF_DOMAIN",
    "ShapesReward",
    "scene_scores",
    "texture_amplitude",
]

IN_DOMAIN = ("shapes_colour", "shapes_shape")
IN_DOMAIN_CHECKS = ("shapes_colour_match",)  # what the trained rewards ask, read plainly; never trained on
OUT_OF_DOMAIN = ("shapes_position", "shapes_background", "jpeg_compressibility")
BACKGROUND_THRESHOLD = 0.2  # mean |x − b| over RGB above which a pixel is not background
BACKGROUND_MARGIN = 2  # pixels around the shape left out of the background's score


def _distance(image: torch.Tensor, rgb: tuple[float, float, float]) -> torch.Tensor:
    """Mean over RGB of |x − rgb|: ``[S, S]``."""
    return (image - torch.tensor(rgb, device=image.device)[:, None, None]).abs().mean(0)


def _foreground(image: torch.Tensor, scene: Scene) -> torch.Tensor:
    colour = torch.tensor(COLOURS[scene.colour], device=image.device)[:, None, None]
    background = torch.tensor(BACKGROUNDS[scene.background], device=image.device)[:, None, None]
    return ((image - colour) ** 2).sum(0) < ((image - background) ** 2).sum(0)  # [S, S]


def _centroid(mask: torch.Tensor) -> tuple[float, float]:
    ys, xs = mask.nonzero(as_tuple=True)
    return float(xs.float().mean()) + 0.5, float(ys.float().mean()) + 0.5


def colour_fidelity(image: torch.Tensor, scene: Scene) -> float:
    not_background = _distance(image, BACKGROUNDS[scene.background]) > BACKGROUND_THRESHOLD
    if not bool(not_background.any()):
        return 0.0
    return 1.0 - float(_distance(image, COLOURS[scene.colour])[not_background].mean())


def colour_match(image: torch.Tensor, scene: Scene) -> float:
    not_background = _distance(image, BACKGROUNDS[scene.background]) > BACKGROUND_THRESHOLD  # [S, S]
    if not bool(not_background.any()):
        return 0.0
    mean = image[:, not_background].mean(1)  # [3]
    palette = torch.tensor(list(COLOURS.values()), device=image.device)  # [K, 3]
    nearest = list(COLOURS)[int(((palette - mean) ** 2).sum(1).argmin())]
    return float(nearest == scene.colour)


def _expected(image: torch.Tensor, scene: Scene, centre: tuple[float, float] | None = None) -> torch.Tensor:
    """The prompt's shape mask, at its position or with its centre at ``centre``."""
    size = image.shape[-1]
    at = centre if centre is not None else scene_centre(scene.position, size)
    return shape_mask(scene.shape, scene.size, at, size, device=image.device)


def shape_correctness(image: torch.Tensor, scene: Scene) -> float:
    foreground = _foreground(image, scene)
    if not bool(foreground.any()):
        return 0.0
    # Move the expected shape so that its centroid sits on the foreground's (a triangle's centroid is
    # not its centre).
    (fx, fy), (ex, ey) = _centroid(foreground), _centroid(_expected(image, scene))
    cx, cy = scene_centre(scene.position, image.shape[-1])
    template = _expected(image, scene, (cx + fx - ex, cy + fy - ey))
    return float((foreground & template).sum()) / float((foreground | template).sum())


def position_accuracy(image: torch.Tensor, scene: Scene) -> float:
    foreground = _foreground(image, scene)
    if not bool(foreground.any()):
        return 0.0
    (x, y), (tx, ty) = _centroid(foreground), _centroid(_expected(image, scene))
    return max(0.0, 1.0 - math.hypot(x - tx, y - ty) / (image.shape[-1] / math.sqrt(2)))


def background_fidelity(image: torch.Tensor, scene: Scene) -> float:
    mask = _expected(image, scene)
    kernel = 2 * BACKGROUND_MARGIN + 1
    near = F.max_pool2d(mask[None, None].float(), kernel, stride=1, padding=BACKGROUND_MARGIN)[0, 0] > 0
    return 1.0 - float(_distance(image, BACKGROUNDS[scene.background])[~near].mean())


_LUMA = (0.299, 0.587, 0.114)
TEXTURED_SIZE = "large"  # shapes_texture asks a fine checker fill of this size, a flat fill of the other


def texture_amplitude(image: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over ``mask`` of luma × the one-pixel checker (−1)^(i+j): the fine texture's signed amplitude."""
    if not bool(mask.any()):
        return 0.0
    size = image.shape[-1]
    index = torch.arange(size, device=image.device)
    checker = 1.0 - 2.0 * ((index[:, None] + index[None, :]) % 2).float()  # +1 where i + j is even
    luma = (image * torch.tensor(_LUMA, device=image.device)[:, None, None]).sum(0)
    return float((luma * checker)[mask].mean())


def texture_fidelity(image: torch.Tensor, scene: Scene) -> float:
    foreground = _foreground(image, scene)
    if not bool(foreground.any()):
        return 0.0
    t = texture_amplitude(image, foreground)
    return t if scene.size == TEXTURED_SIZE else -abs(t)


MEASURES = {
    "shapes_colour": colour_fidelity,
    "shapes_shape": shape_correctness,
    "shapes_position": position_accuracy,
    "shapes_background": background_fidelity,
    "shapes_colour_match": colour_match,
}


CONTROLS = {"shapes_texture": texture_fidelity}  # positive controls (not task scores; not in scene_scores)


def scene_scores(image: torch.Tensor, prompt: str) -> dict[str, float]:
    """Every shapes score of one image ``[3, S, S]`` in [0, 1] for its prompt."""
    scene = parse_prompt(prompt)
    image = image.detach().float()
    return {name: measure(image, scene) for name, measure in MEASURES.items()}


class ShapesReward(RewardModel):
    """One of the shapes scores (``name`` in :data:`MEASURES` or :data:`CONTROLS`), exact and weight-free."""

    needs_prompts = True

    def __init__(self, name: str):
        heads = {**MEASURES, **CONTROLS}
        if name not in heads:
            raise G2RPOError(problem("reward", name, f"not a shapes reward; use one of {', '.join(heads)}"))
        self.name = name
        self._measure = heads[name]

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        scenes = [parse_prompt(p) for p in prompts]
        return torch.tensor([self._measure(img.detach().float(), s) for img, s in zip(images, scenes, strict=True)])
