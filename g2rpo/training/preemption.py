"""SIGTERM and SIGINT during training: finish the iteration, checkpoint it, exit 128 + signal.

Kubernetes ends a pod (node drain, spot reclaim, a deleted TrainJob) with SIGTERM, then SIGKILL
after ``terminationGracePeriodSeconds`` (30 s by default). Without a handler the run dies at once
and loses every iteration since its last checkpoint. With :class:`StopOnSignal` around the loop:

1. the signal only sets a flag (one stderr line says so); the iteration in progress goes on, so no
   optimiser step is left half done;
2. after the iteration every rank learns whether any rank was signalled (a MAX all-reduce), so all
   stop at the same iteration;
3. the trainer writes a checkpoint of that iteration (mirrored to S3 when the run mirrors) and
   raises :class:`Preempted`; ``g2rpo train`` exits with 128 + the signal (143 for SIGTERM, 130 for
   SIGINT): a failure that a retry policy may restart, and the restart resumes from that checkpoint.

``train.stop_grace_s`` bounds step 1–3: if the checkpoint is not written that long after the
signal, the process leaves at once with the same status (the last complete checkpoint stands — a
half-written one is never resumed from). Keep it below the pod's grace period and torchrun's own
30 s kill delay. A second signal leaves at once too.

After the last iteration (:meth:`StopOnSignal.finishing`) a signal no longer stops anything: the
training is done, so the final checkpoint and the export go on, bounded by the same grace period,
and the run ends as it would have (status 0 once the export is written). Before, a signal there
killed the process silently and lost the export.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType

import torch

from g2rpo.training.distributed import DistContext

__all__ = ["Preempted", "StopOnSignal", "exit_status"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    """The shell's status for a process ended by ``signum``: 128 + signum."""
    return 128 + int(signum)


class Preempted(Exception):  # noqa: N818 - a request to stop, not an error of the run
    """Training stopped on a signal after checkpointing ``iteration`` at ``checkpoint``."""

    def __init__(self, signum: int, iteration: int, checkpoint: str) -> None:
        self.signum, self.iteration, self.checkpoint = signum, iteration, checkpoint
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after iteration {iteration}; checkpoint {checkpoint} "
            f"written; run the same command again to resume from it"
        )

    @property
    def exit_status(self) -> int:
        return exit_status(self.signum)


class StopOnSignal:
    """A context manager for the training loop: records SIGTERM/SIGINT instead of dying.

    Handlers are installed only in the main thread (Python's rule); elsewhere it does nothing.
    """

    def __init__(self, grace_s: float, *, announce: bool = True) -> None:
        self.grace_s = grace_s
        self.announce = announce
        self.signum: int | None = None
        self.phase = "training"
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.done()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # a second signal: leave now
            os._exit(exit_status(signum))
        self.signum = signum
        self.received_at = time.monotonic()
        if self.announce:
            doing = (
                "finishing this iteration, then writing a checkpoint"
                if self.phase == "training"
                else "the last iteration is done: finishing the final checkpoint and the export"
            )
            print(
                f"g2rpo train: {signal.Signals(signum).name} received: {doing} (within train.stop_grace_s = "
                f"{self.grace_s:g} s)",
                file=sys.stderr,
                flush=True,
            )
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        what = "no checkpoint" if self.phase == "training" else "the final checkpoint and export not done"
        print(
            f"g2rpo train: {what} within train.stop_grace_s = {self.grace_s:g} s of the signal: leaving now; "
            "the last complete checkpoint stands",
            file=sys.stderr,
            flush=True,
        )
        os._exit(exit_status(self.signum or signal.SIGTERM))

    def finishing(self) -> None:
        """The last iteration is done: a signal from now on lets the final checkpoint and export finish
        (within the grace period) instead of stopping the run."""
        self.phase = "finishing"

    @property
    def received(self) -> bool:
        """Whether this process has been signalled (a fail point's hold waits for it)."""
        return self.signum is not None

    def requested(self, ctx: DistContext) -> int | None:
        """The signal any rank received (every rank calls this after each iteration), else None."""
        local = int(self.signum or 0)
        if ctx.distributed and torch.distributed.is_initialized():
            flag = torch.tensor([local], dtype=torch.int64, device=ctx.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            local = int(flag.item())
        return local or None

    def done(self) -> None:
        """The checkpoint is written (or the loop is over): the grace timer stops."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
