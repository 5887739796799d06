"""Process-group set-up for data-parallel training, and which rank trains which prompts.

Launch: one process (plain ``g2rpo train``), or ``torchrun --nproc_per_node N -m g2rpo train ...``
(torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK`` — the node's index —,
``MASTER_ADDR``/``PORT``). The backend
is NCCL on CUDA and gloo on the CPU. DeepSpeed is driven directly (``deepspeed.init_distributed``
reuses the group made here); accelerate is not used because with DeepSpeed on the CPU it
miscounts processes (both ranks claim to be the main one; measured with accelerate 1.15 and
DeepSpeed 0.19).

Prompt → rank assignment. An iteration trains ``prompts_per_iteration`` groups (one prompt and
its G branches each). A whole group stays on one rank (its advantages are normalised over its G
branches, and the shared-velocity trick needs all G at one place), and ranks take different
prompts: rank r holds the contiguous slice ``[r·P, (r+1)·P)`` of the iteration's global batch,
``P = prompts_per_iteration / world_size``. A world size that does not divide the work is an
error, never a silently uneven split. The global order is an infinite stream of seeded
permutations of the prompt set (one per epoch, :func:`g2rpo.seeding.derive_seed`), so the prompts
of iteration i depend only on (seed, i) — not on the world size or on a resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.seeding import derive_seed
from g2rpo.strategies.base import LossTerm

__all__ = [
    "DistContext",
    "init_distributed",
    "lockstep_rounds",
    "prompts_per_rank",
    "global_prompt_indices",
    "rank_prompt_indices",
]


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: rank, world size, local rank, its node and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    node_rank: int = 0  # torchrun's GROUP_RANK: which node this process runs on
    # output.node_local: output.dir is a folder of this node alone, not one every node shares
    # (g2rpo.training.checkpoint, g2rpo.training.mirror).
    node_local: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_folder_leader(self) -> bool:
        """Whether this rank makes, tidies and claims ``output.dir`` for the ranks that see it: rank 0 of
        a folder every node shares, or the first rank of each node when each node has its own."""
        return self.local_rank == 0 if self.node_local else self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the ranks (collective; the value itself on one process)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t.item() / self.world_size)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank (collective)."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, value)
        return out

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` (picklable) on every rank (collective; the others' values are ignored)."""
        if not self.distributed:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def shutdown(self) -> None:
        """Leave the process group together (every rank calls it last). A one-process group (DeepSpeed makes
        one even for a single rank) is destroyed too: left, NCCL warns at exit that it may leak resources."""
        if not torch.distributed.is_initialized():
            return
        if self.distributed:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def lockstep_rounds(
    terms: Iterator[LossTerm], zero_loss: Callable[[], torch.Tensor]
) -> Iterator[tuple[torch.Tensor, LossTerm | None, bool]]:
    """The rounds in which several ranks back-propagate their loss terms: ``(loss, term, last_round)``.

    Ranks must issue the same collectives in the same order — ZeRO-2/3 reduce gradients inside every
    backward, ZeRO-3 also gathers weights inside every forward — but a rank whose groups were dropped
    (NaN reward) yields fewer terms. So the ranks advance in lock-step rounds: each takes its next
    term, or, when it has none left, ``zero_loss()`` (a zero loss made by a real one-row forward: same
    modules, same gather/reduce order as a term; ``term`` is then None); one all-reduce tells whether
    any rank still had a term. The caller back-propagates every round's loss; in the last round (no
    rank had a term) the zero losses close the accumulation and all ranks step together. Cost: one
    extra one-row forward and backward per iteration, and a scalar all-reduce per term.
    """
    while True:
        term = next(terms, None)
        loss = term.loss if term is not None else zero_loss()
        flag = torch.tensor([0 if term is None else 1], dtype=torch.long)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        last_round = int(flag.item()) == 0
        yield loss, term, last_round
        if last_round:
            return


def init_distributed(device: str = "auto", timeout_s: float = 600.0) -> DistContext:
    """Join the torchrun process group if there is one (gloo on CPU, NCCL on CUDA).

    ``device``: ``auto`` (CUDA when available), ``cpu`` or ``cuda``. Without torchrun's
    environment this is a single process and no group is created.
    """
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node_rank = int(os.environ.get("GROUP_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise G2RPOError(problem("train.device", "cuda", "no CUDA device is visible: use device=cpu or auto"))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world_size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, node_rank=node_rank)


def prompts_per_rank(prompts_per_iteration: int, world_size: int) -> int:
    """P = prompts_per_iteration / world_size; an uneven split is an error naming the fix."""
    if prompts_per_iteration % world_size:
        divisors = [n for n in range(world_size, 8 * world_size + 1, world_size)]
        raise G2RPOError(
            problem(
                "train.prompts_per_iteration",
                prompts_per_iteration,
                f"must be a multiple of the world size {world_size} (one whole group per prompt stays on one rank); "
                f"use e.g. {', '.join(map(str, divisors[:4]))}, or launch a number of processes that divides it",
            )
        )
    return prompts_per_iteration // world_size


def global_prompt_indices(seed: int, iteration: int, prompts_per_iteration: int, num_prompts: int) -> list[int]:
    """The data-set indices of iteration ``iteration``'s global batch (all ranks), in order.

    Positions ``[i·B, (i+1)·B)`` of the stream ``perm_0 ++ perm_1 ++ …`` where ``perm_e`` is the
    seeded permutation of ``range(num_prompts)`` for epoch e.
    """
    if num_prompts < 1:
        raise G2RPOError(problem("data.prompts", num_prompts, "the prompt set is empty: give at least one prompt"))
    start = iteration * prompts_per_iteration
    out: list[int] = []
    cache: dict[int, list[int]] = {}
    for position in range(start, start + prompts_per_iteration):
        epoch, offset = divmod(position, num_prompts)
        if epoch not in cache:
            gen = torch.Generator().manual_seed(derive_seed(seed, "epoch-order", epoch))
            cache[epoch] = torch.randperm(num_prompts, generator=gen).tolist()
        out.append(cache[epoch][offset])
    return out


def rank_prompt_indices(
    seed: int, iteration: int, prompts_per_iteration: int, num_prompts: int, rank: int, world_size: int
) -> list[int]:
    """This rank's contiguous share of :func:`global_prompt_indices`."""
    per_rank = prompts_per_rank(prompts_per_iteration, world_size)
    batch = global_prompt_indices(seed, iteration, prompts_per_iteration, num_prompts)
    return batch[rank * per_rank : (rank + 1) * per_rank]
