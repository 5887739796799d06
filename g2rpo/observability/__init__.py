"""Prometheus metrics for training, evaluation, promotion and the pipeline (see docs/observability.md).

How the numbers leave the process, as Prometheus recommends for each kind of job:

- the long-running training process serves ``/metrics`` on rank 0 while it trains
  (:class:`~g2rpo.observability.exporter.TrainingExporter`, a trainer callback; a PodMonitor scrapes it);
- the short batch steps (evaluate, decide/promote, the pipeline's exit handler) each push one summary
  to a Pushgateway (:mod:`g2rpo.observability.push`) under a fixed grouping key (job + pipeline), which
  replaces that step's previous push. A Pushgateway that cannot be reached is a warning, never a failure.

This package imports nothing of training or the steps: the exporter reads the trainer's records by
duck typing (the :class:`g2rpo.training.callbacks.TrainerCallback` protocol) and the pushes take plain
values. The metric names, types and labels are defined in :mod:`g2rpo.observability.metrics`.
"""

from g2rpo.observability.exporter import TrainingExporter
from g2rpo.observability.push import (
    PushgatewayWarning,
    PushTarget,
    push_evaluation,
    push_evaluations,
    push_pipeline_run,
    push_promotion,
)

__all__ = [
    "PushTarget",
    "PushgatewayWarning",
    "TrainingExporter",
    "push_evaluation",
    "push_evaluations",
    "push_pipeline_run",
    "push_promotion",
]
