"""What a trainer callback may hook into (:class:`TrainerCallback`), passed as ``Trainer(config, callbacks=[...])``.

The S3 checkpoint mirror (:mod:`g2rpo.training.mirror`) and the ``/metrics`` exporter
(:mod:`g2rpo.observability`) are callbacks; the trainer calls them from inside its loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from g2rpo.training.metrics import IterationRecord
from g2rpo.training.validation import Selection, ValidationRecord

if TYPE_CHECKING:  # the trainer imports this module: the annotations only
    from g2rpo.training.trainer import Trainer

__all__ = ["TrainerCallback"]


class TrainerCallback:
    """What a callback may hook into; subclass it and override the methods you need.

    Called on every rank, in the order given, from inside the loop: a callback that should act
    once per run checks ``trainer.ctx.is_main``; one that does a collective must do it on every
    rank. An exception in a callback is not caught: it propagates out of ``step()`` / ``run()`` and
    stops the run like any other error (a resume continues from the last complete checkpoint).
    """

    def before_resume(self, trainer: Trainer) -> None:
        """During setup, after the start-up checks (``output.dir``, the process group, the config) and
        before the trainer looks for a checkpoint to resume from and loads the models. A callback that
        writes into ``output.dir`` here calls ``trainer.claim_output_dir()`` first (rank 0); the ranks
        meet at a barrier after it (the S3 mirror restores its newest checkpoint here)."""

    def on_iteration_end(self, trainer: Trainer, record: IterationRecord) -> None:
        """After each iteration, once its record is in ``metrics.jsonl`` and before its checkpoint.

        ``record`` is this rank's (its prompts, its seconds); ``record.as_json()`` is what rank 0
        wrote to ``metrics.jsonl``.
        """

    def on_checkpoint(self, trainer: Trainer, path: Path, iteration: int) -> None:
        """After the checkpoint of ``iteration`` is complete (manifest written) at ``path``."""

    def on_validation(self, trainer: Trainer, record: ValidationRecord, selection: Selection | None) -> None:
        """After each validation pass (``train.validation``), once its event is in ``metrics.jsonl`` and
        the early stop is decided (``trainer.stop_reason``); ``selection`` is the checkpoint the export
        would take now (None after the baseline)."""
