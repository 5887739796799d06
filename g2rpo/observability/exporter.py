"""Serve the training metrics on ``/metrics`` from rank 0 while the trainer runs.

:class:`TrainingExporter` is a trainer callback (it implements the
:class:`g2rpo.training.callbacks.TrainerCallback` protocol by its method names, without importing
training): ``on_iteration_end`` copies the iteration's record into
:class:`~g2rpo.observability.metrics.TrainingMetrics`, ``on_checkpoint`` the checkpoint's time,
``on_validation`` each validation pass (``train.validation``) and whether the run stopped early. The
HTTP server starts when the exporter is made (so a scrape sees the run while models load) and
:meth:`TrainingExporter.close` stops it after ``linger_seconds``, which gives the scraper a chance
to see the last iteration of a run that ends between two scrapes (a run that stopped before its
first iteration, checkpoint or validation — refused at setup — has nothing new to show and does not
linger).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from prometheus_client import CollectorRegistry, start_http_server

from g2rpo.errors import G2RPOError, problem
from g2rpo.observability.metrics import TrainingMetrics

__all__ = ["TrainingExporter"]


class TrainingExporter:
    """Trainer callback that exports each iteration's numbers; serves ``http://address:port/metrics``."""

    def __init__(
        self,
        port: int,
        *,
        address: str = "0.0.0.0",
        run_id: str,
        pipeline: str,
        strategy: str = "",
        model: str = "",
        target_iterations: int | None = None,
        strides: Sequence[int] | None = None,
        linger_seconds: float = 0.0,
    ) -> None:
        self.registry = CollectorRegistry()
        self.metrics = TrainingMetrics(
            self.registry,
            run_id=run_id,
            pipeline=pipeline,
            strategy=strategy,
            model=model,
            target_iterations=target_iterations,
        )
        self.strides = list(strides) if strides is not None else None
        self.linger_seconds = linger_seconds
        self._observed = False  # anything a last scrape could see
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise G2RPOError(
                problem(
                    "observability.metrics_port",
                    port,
                    f"cannot serve /metrics on {address}:{port} ({exc}): choose a free port, or null to turn it off",
                )
            ) from exc
        self.address, self.port = address, self._server.server_port

    # ------------------------------------------------------------------ the callback protocol

    def on_iteration_end(self, trainer: Any, record: Any) -> None:
        self._observed = True
        self.metrics.observe_iteration(
            iteration=record.iteration,
            stats=record.stats.as_dict(),
            reward_names=record.reward_names,
            reward_global_mean=record.reward_mean_global,
            grad_norm=record.grad_norm,
            learning_rate=record.learning_rate,
            seconds=record.seconds,
            strides=self.strides,
        )
        device = torch.device(getattr(getattr(trainer, "ctx", None), "device", "cpu"))
        if device.type == "cuda":
            self.metrics.observe_memory(
                str(device),
                torch.cuda.memory_allocated(device),
                torch.cuda.memory_reserved(device),
                torch.cuda.max_memory_allocated(device),
            )

    def on_checkpoint(self, trainer: Any, path: Any, iteration: int) -> None:
        self._observed = True
        self.metrics.observe_checkpoint(iteration)

    def on_validation(self, trainer: Any, record: Any, selection: Any) -> None:
        self._observed = True
        self.metrics.observe_validation(
            iteration=record.iteration,
            metrics={name: (m.mean, m.ci_low, m.ci_high) for name, m in record.metrics.items()},
            objective=record.objective,
            breached=len(record.breached),
            forwards=record.forwards,
            seconds=record.seconds,
            selected_iteration=None if selection is None else selection.iteration,
            stopped=getattr(trainer, "stop_reason", None) is not None,
        )

    # ------------------------------------------------------------------ lifetime

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def close(self, linger: bool = True) -> None:
        """Stop serving (after ``linger_seconds`` unless ``linger`` is false or nothing was observed)."""
        if linger and self._observed and self.linger_seconds > 0:
            time.sleep(self.linger_seconds)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
