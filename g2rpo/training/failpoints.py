"""Fail points: named places in training where a test can kill the real process.

The resume tests need a run that dies at a known point, the way a preempted node dies: SIGKILL, no
``finally`` blocks, no flushing. One environment variable picks the point, and a second one arms
it (:mod:`g2rpo.faults`: without ``G2RPO_ARM_FAULT_POINTS=1`` a stray ``G2RPO_FAULT_KILL_AT`` is
ignored, with one line saying so)::

    G2RPO_ARM_FAULT_POINTS=1 G2RPO_FAULT_KILL_AT=iteration:N    # or checkpoint:N, mirror_part:N, sigterm:N, hold:N

- ``iteration:N`` — in :meth:`~g2rpo.training.trainer.Trainer.step` of iteration N, after the
  rewards and advantages, before the training phase (no optimiser step of N has happened). Proves
  that a run killed mid-iteration resumes from its last checkpoint and ends bit-identical to an
  uninterrupted one.
- ``sigterm:N`` — at the same place as ``iteration:N``, SIGTERM instead (what Kubernetes sends a
  pod it ends): the run must finish iteration N, checkpoint it and exit 143
  (:mod:`g2rpo.training.preemption`).
- ``hold:N`` — at the same place, global rank 0 (``RANK``, 0 when unset) waits until the process
  is signalled (at most :data:`HOLD_S`), then goes on; other ranks wait for it in their next
  collective. A test that ends a *pod* (``kubectl delete pod``: SIGTERM from outside, through
  torchrun) needs the signal to land mid-run whatever the machine's speed; holding makes that
  certain: the run is stopped in iteration N, and its checkpoint is that of iteration N + 1.
- ``checkpoint:N`` — while the checkpoint of iteration N is saved, after the driver's weights and
  optimiser state are written, before the RNG files, the EMA and the manifest. Proves that a
  half-written checkpoint (no manifest) is never resumed from.
- ``mirror_part:N`` — with node-local folders (``output.node_local``), in the S3 mirror's publish of
  checkpoint N, on the first rank of a node whose environment sets it, before that node uploads its
  part (:meth:`~g2rpo.training.mirror.CheckpointMirror.publish_parts`). Proves that a prefix holding
  only some nodes' parts never counts as a checkpoint.

Every point that acts first names the variables on stderr. Unset (every normal run), each point is
one dictionary lookup and nothing else. The trainer calls :func:`fail_point` at the iteration
point; the checkpoint point sits in the driver's ``save`` through :class:`FailAfterSave`, because
:class:`~g2rpo.training.checkpoint.CheckpointManager` owns the order in which a checkpoint's files
are written.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from g2rpo.faults import FAULT_ENV, announce, armed_fault
from g2rpo.training.checkpoint import TrainerState

__all__ = ["FAIL_POINT_ENV", "FailAfterSave", "fail_point"]

FAIL_POINT_ENV = FAULT_ENV

HOLD_S = 600.0  # the longest a ``hold:N`` point waits for its signal

FailPoint = Literal["iteration", "checkpoint", "mirror_part"]


def fail_point(point: FailPoint, iteration: int, signalled: Callable[[], bool] = lambda: False) -> None:
    """SIGKILL (or SIGTERM, or hold) this process if ``G2RPO_FAULT_KILL_AT`` names this point and
    iteration and ``G2RPO_ARM_FAULT_POINTS=1`` arms it. ``signalled``: whether the process has
    received its stop signal (what a hold waits for)."""
    wanted = armed_fault()
    if wanted is None:
        return
    if wanted == f"{point}:{iteration}":
        announce(wanted, f"SIGKILL in {point} {iteration}")
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "iteration" and wanted == f"sigterm:{iteration}":
        announce(wanted, f"SIGTERM in iteration {iteration}")
        os.kill(os.getpid(), signal.SIGTERM)
    if point == "iteration" and wanted == f"hold:{iteration}" and os.environ.get("RANK", "0") == "0":
        hold(iteration, signalled)


def hold(iteration: int, signalled: Callable[[], bool], limit_s: float = HOLD_S) -> bool:
    """Wait in iteration ``iteration`` until ``signalled()`` (True) or ``limit_s`` passes (False)."""
    announce(f"hold:{iteration}", f"holding in iteration {iteration} until a signal (at most {limit_s:g} s)")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if signalled():
            return True
        time.sleep(0.1)
    return signalled()


class _SavesAndLoads(Protocol):
    def save(self, directory: Path) -> None: ...

    def load(self, directory: Path, saved: TrainerState) -> None: ...


class FailAfterSave:
    """A driver seen by the checkpoint manager: ``save`` writes the driver's state, then passes
    the ``checkpoint`` fail point of ``iteration``; ``load`` passes straight through."""

    def __init__(self, driver: _SavesAndLoads, iteration: int) -> None:
        self._driver, self._iteration = driver, iteration

    def save(self, directory: Path) -> None:
        self._driver.save(directory)
        fail_point("checkpoint", self._iteration)

    def load(self, directory: Path, saved: TrainerState) -> None:
        self._driver.load(directory, saved)
