"""Where every random draw comes from.

A draw (the initial noise of a prompt, the SDE noise of one branch, a random subset of steps) is
named by *keys* — the run seed, the iteration, the global prompt index and, where it applies, the
step k and the branch — and its generator is seeded with a stable hash of those keys. Nothing
depends on how many draws were made before, on which rank a prompt lands, or on the device, so:

- a run resumed at iteration i draws exactly what an uninterrupted run draws at iteration i;
- a different data-parallel layout (2 ranks × 4 prompts instead of 8 × 1) draws the same noise for
  the same global prompt index;
- the noise is drawn on the CPU in float32 and then moved, so CPU and GPU runs share it.

The hash is blake2b over a canonical text form of the keys (not Python's ``hash``, which is salted
per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["derive_seed", "generator", "split_key", "Draws"]

_KeyPart = int | str


def split_key(seed: int, text: str) -> bytes:
    """The sort key of a deterministic split: ``sha256(seed, text)``. A split by the smallest keys
    depends neither on the input's order nor on the other items (:func:`g2rpo.data.split_prompts`;
    the shapes model's unseen scenes, :func:`g2rpo.tasks.shapes.unseen_scenes`)."""
    return hashlib.sha256(f"{seed}\x00{text}".encode()).digest()


def derive_seed(run_seed: int, *keys: _KeyPart) -> int:
    """A 63-bit seed determined only by ``run_seed`` and ``keys`` (ints or strings).

    ``derive_seed(7, "branch-noise", 3, 12, 0, 5)`` is the same on every machine and every call.
    Ints and strings are told apart (``1`` and ``"1"`` give different seeds).
    """
    parts = [f"i{int(run_seed)}"]
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"seed keys must be int or str, got {type(key).__name__} {key!r}")
        parts.append(f"i{key}" if isinstance(key, int) else f"s{key}")
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(run_seed: int, *keys: _KeyPart) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of the same arguments."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(run_seed, *keys))
    return gen


@dataclass(frozen=True)
class Draws:
    """The random-draw source of one iteration for a batch of prompts.

    The trainer builds it from the run seed, the iteration and the **global** indices of the
    prompts in this rank's batch (position ``p`` in the batch is prompt ``prompt_indices[p]`` of
    the data set). Strategies draw through it only.
    """

    run_seed: int
    iteration: int
    prompt_indices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_indices", tuple(int(i) for i in self.prompt_indices))

    def generator(self, purpose: str, prompt: int, *keys: _KeyPart) -> torch.Generator:
        """Generator for ``purpose`` of the prompt at batch position ``prompt`` (plus extra keys)."""
        return generator(self.run_seed, purpose, self.iteration, self.prompt_indices[prompt], *keys)

    def normal(
        self,
        shape: Sequence[int],
        purpose: str,
        prompt: int,
        *keys: _KeyPart,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Standard normal float32 tensor of ``shape``, drawn on the CPU, moved to ``device``."""
        gen = self.generator(purpose, prompt, *keys)
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).to(device)

    def permutation(self, n: int, purpose: str, prompt: int, *keys: _KeyPart) -> torch.Tensor:
        """A random permutation of ``range(n)`` (CPU LongTensor) for ``purpose``."""
        return torch.randperm(n, generator=self.generator(purpose, prompt, *keys))
