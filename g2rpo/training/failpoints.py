"""Fail points: named places in training where a test can kill the real process.

The resume tests need a run that dies at a known point, the way a preempted node dies: SIGKILL, no
``finally`` blocks, no flushing. One environment variable picks the point::

    G2RPO_FAULT_KILL_AT=iteration:N    # or checkpoint:N, or sigterm:N

- ``iteration:N`` — in :meth:`~g2rpo.training.trainer.Trainer.step` of iteration N, after the
  rewards and advantages, before the training phase (no optimiser step of N has happened). Proves
  that a run killed mid-iteration resumes from its last checkpoint and ends bit-identical to an
  uninterrupted one.
- ``sigterm:N`` — at the same place as ``iteration:N``, SIGTERM instead (what Kubernetes sends a
  pod it ends): the run must finish iteration N, checkpoint it and exit 143
  (:mod:`g2rpo.training.preemption`).
- ``checkpoint:N`` — while the checkpoint of iteration N is saved, after the driver's weights and
  optimiser state are written, before the RNG files, the EMA and the manifest. Proves that a
  half-written checkpoint (no manifest) is never resumed from.

Unset (every normal run), each point is one dictionary lookup and nothing else. The trainer calls
:func:`fail_point` at the iteration point; the checkpoint point sits in the driver's ``save``
through :class:`FailAfterSave`, because :class:`~g2rpo.training.checkpoint.CheckpointManager` owns
the order in which a checkpoint's files are written.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Literal, Protocol

from g2rpo.training.checkpoint import TrainerState

__all__ = ["FAIL_POINT_ENV", "FailAfterSave", "fail_point"]

FAIL_POINT_ENV = "G2RPO_FAULT_KILL_AT"

FailPoint = Literal["iteration", "checkpoint"]


def fail_point(point: FailPoint, iteration: int) -> None:
    """SIGKILL this process if ``G2RPO_FAULT_KILL_AT`` names this point and iteration."""
    wanted = os.environ.get(FAIL_POINT_ENV)
    if wanted == f"{point}:{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "iteration" and wanted == f"sigterm:{iteration}":
        os.kill(os.getpid(), signal.SIGTERM)


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
