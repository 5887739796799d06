"""How much memory one iteration's rollout holds, checked before a run starts.

A rollout keeps, per rank, every tensor its loss needs until the update, plus the decoded images
until they are scored. With P prompts on the rank, K trained steps per prompt, J strides, G
branches, T steps, latents ``[L, C]`` and images ``3 × H × W`` (float32 throughout)::

    branch strategies (G²RPO):      N = P·K·J·G final latents
        states  = P·K·L·C (x[k]) + P·K·G·L·C (branches)
    trajectory strategies (Dance/MixGRPO): N = P·G final latents
        states  = P·G·(T+1)·L·C
    final latents = N·L·C,   images = N·3·H·W          (bytes = 4 × elements)

This is a lower bound: it leaves out the model, its activations and the optimiser, which the
GPU benchmark measures. It catches the settings that can never fit (a group size of 10⁸), which
otherwise die with a bare ``MemoryError`` after the model has loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from g2rpo.errors import problem

__all__ = [
    "RolloutMemory",
    "rollout_memory",
    "available_memory",
    "memory_problem",
    "is_out_of_memory",
    "out_of_memory_message",
]

FLOAT_BYTES = 4


@dataclass(frozen=True)
class RolloutMemory:
    """Bytes of one iteration's rollout on one rank, by part."""

    final_latents: int
    states: int
    images: int
    rows: int  # N, images decoded and scored per rank and iteration

    @property
    def total(self) -> int:
        return self.final_latents + self.states + self.images


def rollout_memory(
    *,
    trajectory: bool,
    prompts: int,
    trained_steps: int,
    strides: int,
    group_size: int,
    num_steps: int,
    latent_tokens: int,
    latent_channels: int,
    height: int,
    width: int,
) -> RolloutMemory:
    """The module docstring's count, in bytes (Python ints: no overflow for absurd settings)."""
    latent = latent_tokens * latent_channels  # elements of one [L, C] latent
    if trajectory:
        rows = prompts * group_size
        states = prompts * group_size * (num_steps + 1) * latent
    else:
        rows = prompts * trained_steps * strides * group_size
        states = prompts * trained_steps * latent + prompts * trained_steps * group_size * latent
    return RolloutMemory(
        final_latents=rows * latent * FLOAT_BYTES,
        states=states * FLOAT_BYTES,
        images=rows * 3 * height * width * FLOAT_BYTES,
        rows=rows,
    )


def available_memory(device: str) -> tuple[int, str] | None:
    """Free bytes where the rollout will live, and what they are: the GPU's free memory for
    ``cuda`` (when one is visible), the host's ``MemAvailable`` otherwise; None when unknown."""
    if device in ("cuda", "auto") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free), "free memory of cuda:0"
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else -1
    return (pages * os.sysconf("SC_PAGE_SIZE"), "available host memory") if pages > 0 else None


def memory_problem(estimate: RolloutMemory, available: tuple[int, str] | None, settings: str) -> str | None:
    """A ``field=value: fix`` problem when the rollout alone cannot fit, else None."""
    if available is None or estimate.total <= available[0]:
        return None
    free, where = available
    return problem(
        "algorithm",
        settings,
        f"one iteration's rollout needs at least {_gib(estimate.total)} ({estimate.rows:,} images per rank: "
        f"{_gib(estimate.final_latents)} final latents, {_gib(estimate.states)} saved states, "
        f"{_gib(estimate.images)} decoded images) but the {where} is {_gib(free)}; lower algorithm.group_size, "
        "algorithm.g2rpo.granularities, algorithm.g2rpo.branch_steps_per_iteration or train.prompts_per_iteration "
        "(or run on more ranks)",
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def out_of_memory_message(config: Any, iteration: int, device: Any, error: BaseException) -> str:
    """What a run that ran out of memory tells the user: where, and the settings that set the size."""
    algorithm, train, model = config.algorithm, config.train, config.model
    return (
        f"out of memory on {device} in iteration {iteration} ({type(error).__name__}: {str(error)[:200]}). "
        f"The rollout grows with algorithm.group_size={algorithm.group_size}, "
        f"algorithm.g2rpo.granularities={list(algorithm.g2rpo.granularities)}, "
        f"algorithm.g2rpo.branch_steps_per_iteration={algorithm.g2rpo.branch_steps_per_iteration}, "
        f"train.prompts_per_iteration={train.prompts_per_iteration} and model.height×width="
        f"{model.height}×{model.width}; activations with algorithm.micro_batch={algorithm.micro_batch} and "
        f"train.decode_micro_batch={train.decode_micro_batch}. Lower one of them (or turn on "
        "train.gradient_checkpointing / run on more ranks); the run resumes from its last checkpoint"
    )


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocator that ran out: CUDA's OutOfMemoryError, Python's MemoryError, or the
    RuntimeError torch's CPU allocator raises."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
