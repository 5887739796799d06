"""The one batched scoring loop: the trainer, the evaluation and ``g2rpo rewards score`` all call it.

:func:`score_rewards` scores N images against their prompts with R reward models, each in calls of
at most its own batch size, and returns the scores as one ``[R, N]`` float32 tensor on the CPU
(row r is ``models[r]``; column n is image n). Slicing never changes a score: batched scores equal
one call on the whole batch.

``images`` is either one tensor ``[N, 3, H, W]`` (checked once, up front, as
:func:`~g2rpo.rewards.base.validate_inputs` checks it) or a sequence of ``[3, H, W]`` tensors that
may differ in size (image files): runs of consecutive images of one size are stacked into calls.

NaN/inf scores are kept by default, for a caller that drops the affected groups (the trainer),
and logged by :meth:`~g2rpo.rewards.base.RewardModel.score`; ``require_finite=True`` raises
instead, naming the reward and the count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel, check_finite, validate_inputs

__all__ = ["score_rewards"]


def score_rewards(
    models: Sequence[RewardModel],
    images: torch.Tensor | Sequence[torch.Tensor],
    prompts: Sequence[str],
    batch_size: int | Sequence[int],
    *,
    require_finite: bool = False,
) -> torch.Tensor:
    """Scores ``[R, N]`` (float32, CPU) of ``images`` under each of ``models``.

    ``batch_size``: images per call, one number for every model or one per model.
    """
    models = list(models)
    if not models:
        raise G2RPOError(problem("rewards", [], "give at least one reward model to score with"))
    sizes = _batch_sizes(models, batch_size)
    name = models[0].name if len(models) == 1 else "rewards"
    needs_prompts = any(model.needs_prompts for model in models)
    if isinstance(images, torch.Tensor):
        images, prompts = validate_inputs(name, images, prompts, needs_prompts=needs_prompts)
    else:
        images, prompts = _check_image_list(name, images, prompts)
    rows = []
    for model, size in zip(models, sizes):
        row = torch.cat([model.score(batch, texts).float().cpu() for batch, texts in _batches(images, prompts, size)])
        rows.append(check_finite(model.name, row) if require_finite else row)
    return torch.stack(rows)  # [R, N]


def _batch_sizes(models: list[RewardModel], batch_size: int | Sequence[int]) -> list[int]:
    if isinstance(batch_size, Sequence) and not isinstance(batch_size, str):
        sizes = list(batch_size)
        if len(sizes) != len(models):
            raise G2RPOError(
                problem("batch_size", sizes, f"give one batch size per reward model ({len(models)}) or a single one")
            )
    else:
        sizes = [batch_size] * len(models)
    for model, size in zip(models, sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise G2RPOError(
                problem(f"{model.name}.batch_size", size, "use a positive whole number of images per call")
            )
    return sizes


def _check_image_list(name: str, images: object, prompts: object) -> tuple[list[torch.Tensor], list[str]]:
    if isinstance(images, str) or not isinstance(images, Sequence) or not images:
        raise G2RPOError(
            problem(
                f"{name}.images", type(images).__name__, "pass a tensor [N, 3, H, W] or a list of [3, H, W] tensors"
            )
        )
    for i, image in enumerate(images):
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
            raise G2RPOError(problem(f"{name}.images[{i}]", shape, "each image must be a [3, H, W] tensor"))
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or len(prompts) != len(images):
        count = len(prompts) if isinstance(prompts, Sequence) and not isinstance(prompts, str) else prompts
        raise G2RPOError(
            problem(f"{name}.prompts", f"{count} prompts for {len(images)} images", "pass exactly one prompt per image")
        )
    return list(images), list(prompts)


def _batches(
    images: torch.Tensor | list[torch.Tensor], prompts: list[str], size: int
) -> Iterator[tuple[torch.Tensor, list[str]]]:
    """``(images [B, 3, H, W], prompts)`` of at most ``size`` images, in order; one image size per call."""
    if isinstance(images, torch.Tensor):
        for start in range(0, images.shape[0], size):
            yield images[start : start + size], prompts[start : start + size]
        return
    start = 0
    while start < len(images):
        end = start + 1
        while end < len(images) and end - start < size and images[end].shape == images[start].shape:
            end += 1
        yield torch.stack(images[start:end]), prompts[start:end]
        start = end
