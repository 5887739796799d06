"""Trainer callbacks (what the metrics exporter hooks into) and the metrics.jsonl reader, on real
single-process runs of the tiny Flux model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_testlib import tiny_overrides

from g2rpo.config import load_config
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.checkpoint import is_complete
from g2rpo.training.metrics import IterationRecord, read_iteration_records
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import Trainer
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("callbacks_tiny_flux"))


def _config(model: Path, out: Path) -> RunConfig:
    extra = {"train.iterations": 3, "train.checkpoint_every": 2, "output.export": False}
    return load_config(RunConfig, None, tiny_overrides(model, out, **extra))


class Recorder(TrainerCallback):
    """Keeps what it is given, and what the run directory held at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_iteration_end(self, trainer: Trainer, record: IterationRecord) -> None:
        on_disk = (trainer.out / "metrics.jsonl").read_text().splitlines()[-1]
        self.calls.append(("iteration", record, json.loads(on_disk)))

    def on_checkpoint(self, trainer: Trainer, path: Path, iteration: int) -> None:
        self.calls.append(("checkpoint", path, iteration, is_complete(path)))


def test_callbacks_see_each_iteration_record_and_each_checkpoint(tiny_model, tmp_path):
    out = tmp_path / "run"
    recorder = Recorder()
    Trainer(_config(tiny_model, out), callbacks=[recorder]).run()
    # iterations 0, 1, then the checkpoint every 2, iteration 2, then the end-of-run checkpoint
    kinds = [(c[0], c[1].iteration if c[0] == "iteration" else c[2]) for c in recorder.calls]
    assert kinds == [("iteration", 0), ("iteration", 1), ("checkpoint", 2), ("iteration", 2), ("checkpoint", 3)]
    records = [c for c in recorder.calls if c[0] == "iteration"]
    for _, record, last_line in records:
        # the same numbers rank 0 wrote, already on disk when the callback runs
        assert json.loads(json.dumps(record.as_json())) == last_line
    written = read_iteration_records(out / "metrics.jsonl")
    assert [line for _, _, line in records] == written
    assert written[0]["loss"] == records[0][1].stats.loss and written[0]["grad_norm"] > 0
    checkpoints = [c[1:] for c in recorder.calls if c[0] == "checkpoint"]
    assert checkpoints == [
        (out / "checkpoints" / "iter-000002", 2, True),  # complete (manifest written) when announced
        (out / "checkpoints" / "iter-000003", 3, True),
    ]


class ExporterDown(RuntimeError):
    pass


class FailsAtIteration(TrainerCallback):
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_iteration_end(self, trainer: Trainer, record: IterationRecord) -> None:
        if record.iteration == self.iteration:
            raise ExporterDown(f"metrics exporter unreachable at iteration {record.iteration}")


def test_an_exception_in_a_callback_stops_the_run_and_a_rerun_starts_over(tiny_model, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ExporterDown, match="iteration 1"):
        Trainer(_config(tiny_model, out), callbacks=[FailsAtIteration(1)]).run()
    # iteration 1's record was written before its callback ran; its checkpoint (every 2) was not
    assert [r["iteration"] for r in read_iteration_records(out / "metrics.jsonl")] == [0, 1]
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    summary = Trainer(_config(tiny_model, out)).run()  # no checkpoint to resume: it starts again
    assert summary.resumed_at == 0 and summary.iterations == 3
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines if "event" in e] == ["restarted"]
    assert [r["iteration"] for r in read_iteration_records(out / "metrics.jsonl")] == [0, 1, 2]


def test_read_iteration_records_keeps_the_last_record_of_each_iteration(tmp_path):
    # What a resumed run leaves: iterations 0-2, killed, resumed from checkpoint 2 (iteration 2
    # written again with the resumed run's numbers), then iteration 3.
    lines = [
        {"iteration": 0, "loss": 0.5},
        {"iteration": 1, "loss": 0.4},
        {"iteration": 2, "loss": 0.3},
        {"event": "resumed", "from": "checkpoints/iter-000002", "iteration": 2, "time": 1.0},
        {"iteration": 2, "loss": 0.25},
        {"iteration": 3, "loss": None},  # a NaN loss is written as null
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_iteration_records(path) == [lines[0], lines[1], lines[4], lines[5]]
