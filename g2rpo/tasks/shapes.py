"""The "shapes" task: procedurally generated scenes whose prompts say exactly what the image must show.

A scene is one shape on a plain background, all of it named in its prompt::

    "a small red circle at the top left on a black background"

3 shapes (circle, square, triangle) × 4 colours (red, green, blue, yellow) × 2 sizes (small, large)
× 5 positions (top left, top right, bottom left, bottom right, center) × 3 backgrounds (black,
white, gray) = 360 scenes. :func:`render` draws a scene exactly (hard edges, pixel centres
sampled, 64×64 by default); :func:`parse_prompt` reads a prompt back into its scene, so a reward
can compare any image with what its prompt asks for (:mod:`g2rpo.rewards.shapes`).

Geometry on an S×S image (S = 64): the shape's centre is at a fixed point per position (a quarter
or half of S from the edges), its half-extent r is S·7/64 (small) or S·12/64 (large). Circle:
distance to the centre ≤ r. Square: both offsets ≤ 0.85·r (about the circle's area). Triangle:
pointing up, apex at (cx, cy − r), base from (cx − r, cy + r) to (cx + r, cy + r).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.seeding import split_key

__all__ = [
    "BACKGROUNDS",
    "COLOURS",
    "IMAGE_SIZE",
    "POSITIONS",
    "SHAPES",
    "SIZES",
    "Scene",
    "all_scenes",
    "parse_prompt",
    "render",
    "sample_scenes",
    "scene_centre",
    "shape_mask",
    "unseen_scenes",
    "write_prompts",
]

IMAGE_SIZE = 64
SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (1.0, 0.0, 0.0), "green": (0.0, 0.8, 0.0), "blue": (0.0, 0.0, 1.0), "yellow": (1.0, 1.0, 0.0)}
BACKGROUNDS = {"black": (0.0, 0.0, 0.0), "white": (1.0, 1.0, 1.0), "gray": (0.5, 0.5, 0.5)}
SIZES = {"small": 7 / 64, "large": 12 / 64}  # half-extent as a fraction of the image side
POSITIONS = {  # centre as fractions of the side (x, y), y down
    "top left": (0.25, 0.25),
    "top right": (0.75, 0.25),
    "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75),
    "center": (0.5, 0.5),
}
SQUARE_FRACTION = 0.85  # a square's half-side relative to r: about the area of the circle of radius r

_PROMPT = re.compile(
    rf"a ({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)}) at the ({'|'.join(POSITIONS)}) "
    rf"on a ({'|'.join(BACKGROUNDS)}) background"
)
_GRAMMAR = "a <small|large> <red|green|blue|yellow> <circle|square|triangle> at the <position> on a <black|white|gray> background"


@dataclass(frozen=True)
class Scene:
    """One shape on a plain background."""

    shape: str
    colour: str
    size: str
    position: str
    background: str

    @property
    def prompt(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} at the {self.position} on a {self.background} background"


def all_scenes() -> list[Scene]:
    """Every scene, in a fixed order (shape, colour, size, position, background)."""
    return [
        Scene(shape, colour, size, position, background)
        for shape in SHAPES
        for colour in COLOURS
        for size in SIZES
        for position in POSITIONS
        for background in BACKGROUNDS
    ]


def sample_scenes(count: int, seed: int = 0) -> list[Scene]:
    """``count`` different scenes drawn without replacement with ``random.Random(seed)`` (a small,
    reproducible prompt set: the demos train on one)."""
    scenes = all_scenes()
    if not 1 <= count <= len(scenes):
        raise G2RPOError(problem("count", count, f"draw between 1 and {len(scenes)} scenes"))
    return random.Random(seed).sample(scenes, count)


def unseen_scenes(count: int, seed: int = 0) -> set[Scene]:
    """The ``count`` scenes whose prompts have the smallest split keys (:func:`g2rpo.seeding.split_key`).

    They are the scenes the pipeline's prepare step holds out first: with split seed 0, the first 64
    are its 64 test prompts (what ``make demo`` evaluates on) and the next 32 the ablation's
    validation prompts (``benchmarks/ablation.py``), because both splits take the smallest keys. A
    shapes model pretrained without them has never seen those scenes, drawn or named.
    """
    scenes = all_scenes()
    if not 0 <= count < len(scenes):
        raise G2RPOError(problem("count", count, f"leave out between 0 and {len(scenes) - 1} scenes"))
    return set(sorted(scenes, key=lambda s: split_key(seed, s.prompt))[:count])


def parse_prompt(prompt: str) -> Scene:
    """The scene a prompt describes; a prompt outside the grammar is a G2RPOError naming it."""
    match = _PROMPT.fullmatch(prompt.strip().lower())
    if match is None:
        raise G2RPOError(problem("prompt", prompt, f"not a shapes prompt; write it as '{_GRAMMAR}'"))
    size, colour, shape, position, background = match.groups()
    return Scene(shape, colour, size, position, background)


def scene_centre(position: str, image_size: int = IMAGE_SIZE) -> tuple[float, float]:
    """The centre ``(x, y)`` in pixels of a position."""
    fx, fy = POSITIONS[position]
    return fx * image_size, fy * image_size


def shape_mask(
    shape: str, size: str, centre: tuple[float, float], image_size: int = IMAGE_SIZE, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Bool ``[S, S]``: the pixels (centres sampled) a shape of ``size`` centred at ``centre`` covers."""
    r = SIZES[size] * image_size
    coords = torch.arange(image_size, device=device, dtype=torch.float32) + 0.5
    dx = coords[None, :] - centre[0]  # [1, S] (x along columns)
    dy = coords[:, None] - centre[1]  # [S, 1]
    if shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape == "square":
        half = SQUARE_FRACTION * r
        return (dx.abs() <= half) & (dy.abs() <= half)
    if shape == "triangle":
        height = dy + r  # 0 at the apex, 2r at the base
        return (height >= 0) & (height <= 2 * r) & (dx.abs() <= height / 2)
    raise G2RPOError(problem("shape", shape, f"use one of {', '.join(SHAPES)}"))


def render(scene: Scene, image_size: int = IMAGE_SIZE) -> torch.Tensor:
    """The scene as a float image ``[3, S, S]`` in [0, 1]."""
    mask = shape_mask(scene.shape, scene.size, scene_centre(scene.position, image_size), image_size)
    background = torch.tensor(BACKGROUNDS[scene.background])[:, None, None]
    colour = torch.tensor(COLOURS[scene.colour])[:, None, None]
    return torch.where(mask[None], colour, background).float()


def write_prompts(path: str | Path, scenes: list[Scene] | None = None) -> Path:
    """Write the scenes' prompts, one a line (a prompt file the trainer and evaluation read)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(f"{s.prompt}\n" for s in (scenes if scenes is not None else all_scenes())), encoding="utf-8")
    return out
