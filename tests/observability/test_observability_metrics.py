"""The exported series follow Prometheus' naming rules; the exporter serves them and refuses a used
port by name; the dashboard file is what the generator writes."""

from __future__ import annotations

import json
import math
import socket
import urllib.request
from types import SimpleNamespace

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.observability import TrainingExporter
from g2rpo.observability import exporter as exporter_module
from g2rpo.observability.dashboard import DEFAULT_PATH, PANELS, dashboard_json
from g2rpo.strategies.base import StepStats
from g2rpo.training.metrics import IterationRecord
from g2rpo.training.run_config import RunConfig
from tests.observability.promservers import REPO, dashboard_queries
from tests.s3server import free_ports

ALLOWED_LABELS = {
    "run_id",
    "pipeline",
    "reward",
    "stride",
    "phase",
    "device",
    "kind",
    "le",
    "version",
    "strategy",
    "model",
}


def _record(iteration: int, loss: float = 0.25) -> IterationRecord:
    stats = StepStats(
        reward_mean=[[0.5, 0.75]],
        reward_std=[[0.125, 0.25]],
        reward_mean_all=0.625,
        advantage_mean=0.0,
        advantage_std=1.0,
        advantage_abs_max=1.5,
        loss=loss,
        clip_fraction=0.1,
        ratio_mean=1.0,
        ratio_max=1.2,
        sampling_forwards=40,
        training_forwards=8,
        training_backwards=8,
        model_calls=10,
        optimizer_steps=1,
        dropped_groups=1,
        total_groups=4,
        reference_forwards=6,
    )
    return IterationRecord(
        iteration=iteration,
        stats=stats,
        grad_norm=None,
        learning_rate=1e-3,
        seconds={"sampling": 0.2, "decoding": 0.05, "reward": 0.01, "training": 0.3},
        reward_names=["jpeg_compressibility"],
        reward_mean_global=0.625,
        prompt_indices=[0, 1],
    )


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return {family.name: family for family in text_string_to_metric_families(response.read().decode())}


def test_the_exporter_serves_conventional_names_and_low_cardinality_labels():
    (port,) = free_ports(1)
    exporter = TrainingExporter(
        port, address="127.0.0.1", run_id="r1", pipeline="p", target_iterations=4, strides=[1, 2]
    )
    trainer = SimpleNamespace(ctx=SimpleNamespace(device=torch.device("cpu")))
    try:
        exporter.on_iteration_end(trainer, _record(0))
        exporter.on_iteration_end(trainer, _record(1, loss=math.nan))
        exporter.on_checkpoint(trainer, None, 2)
        families = _scrape(exporter.url)
    finally:
        exporter.close()
    ours = {name: f for name, f in families.items() if name.startswith("g2rpo_")}
    assert set(families) - set(ours) <= {n for n in families if n.startswith("process_")}
    for name, family in ours.items():
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (name, sample.labels)
            if family.type == "counter" and not sample.name.endswith("_created"):
                assert sample.name.endswith("_total"), sample.name
            if "timestamp" in name or name.endswith("_seconds"):
                assert name.endswith("_seconds"), name
    assert set(families["g2rpo_build_info"].samples[0].labels) == {"version"}
    assert families["g2rpo_training_run_info"].samples[0].labels["run_id"] == "r1"
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in ours.values() for s in f.samples}
    run = (("pipeline", "p"), ("run_id", "r1"))
    assert value[("g2rpo_training_iteration", run)] == 2
    assert value[("g2rpo_training_iterations_total", run)] == 2
    assert value[("g2rpo_training_dropped_groups_total", run)] == 2
    assert value[("g2rpo_training_reference_forwards_total", run)] == 12  # 6 per iteration (Flow-GRPO's KL)
    assert value[("g2rpo_training_target_iterations", run)] == 4
    assert value[("g2rpo_training_last_checkpoint_iteration", run)] == 2
    stride2 = (("pipeline", "p"), ("reward", "jpeg_compressibility"), ("run_id", "r1"), ("stride", "2"))
    assert value[("g2rpo_training_reward_mean", stride2)] == 0.75
    assert value[("g2rpo_training_reward_std", stride2)] == 0.25
    assert math.isnan(value[("g2rpo_training_loss", run)])  # NaN exported as NaN (the alert's input)
    assert math.isnan(value[("g2rpo_training_grad_norm", run)])  # no optimiser step reported
    assert value[("g2rpo_training_phase_seconds_count", (("phase", "training"), *run))] == 2


def test_a_used_port_is_refused_naming_the_field():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(G2RPOError, match=rf"observability.metrics_port.*{port}.*choose a free port"):
            TrainingExporter(port, address="127.0.0.1", run_id="r", pipeline="p")


def test_metrics_are_off_by_default_and_the_port_is_checked():
    from g2rpo.steps.train import training_exporter

    config = load_config(RunConfig, REPO / "configs" / "tiny-cpu.yaml")
    assert config.observability.metrics_port is None and training_exporter(config) is None
    with pytest.raises(G2RPOError, match="observability.metrics_port"):
        load_config(RunConfig, REPO / "configs" / "tiny-cpu.yaml", {"observability": {"metrics_port": 70000}})


def test_the_training_runtimes_metrics_port_turns_the_exporter_on(monkeypatch):
    # The chart's ClusterTrainingRuntime sets G2RPO_METRICS_PORT (the port its PodMonitor scrapes).
    import yaml

    from g2rpo.steps.train import METRICS_PORT_ENV, training_exporter

    values = yaml.safe_load((REPO / "charts" / "g2rpo" / "values.yaml").read_text())
    runtime = (REPO / "charts" / "g2rpo" / "templates" / "clustertrainingruntime.yaml").read_text()
    assert f"name: {METRICS_PORT_ENV}" in runtime
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(METRICS_PORT_ENV, str(port))
    overrides = {"observability": {"linger_seconds": 0, "metrics_address": "127.0.0.1"}}
    config = load_config(RunConfig, REPO / "configs" / "tiny-cpu.yaml", overrides)
    exporter = training_exporter(config)
    assert exporter is not None and exporter.port == port
    exporter.close(linger=False)
    monkeypatch.setenv(METRICS_PORT_ENV, "metrics")
    with pytest.raises(G2RPOError, match="G2RPO_METRICS_PORT='metrics'"):
        training_exporter(config)
    assert isinstance(values["trainingRuntime"]["metricsPort"], int)


def test_the_exporter_lingers_only_when_a_last_scrape_has_something_to_see(monkeypatch):
    """The linger gives a scraper the last iteration of a run; a run refused at setup (the trainer's
    start-up checks come after the exporter is up) observed nothing and exits at once."""
    slept: list[float] = []
    monkeypatch.setattr(exporter_module, "time", SimpleNamespace(sleep=slept.append))
    trainer = SimpleNamespace(ctx=SimpleNamespace(device=torch.device("cpu")))
    for observe in (None, "iteration", "checkpoint"):
        (port,) = free_ports(1)
        exporter = TrainingExporter(port, address="127.0.0.1", run_id="r1", pipeline="p", linger_seconds=15)
        if observe == "iteration":
            exporter.on_iteration_end(trainer, _record(0))
        elif observe == "checkpoint":
            exporter.on_checkpoint(trainer, None, 2)
        exporter.close()
    assert slept == [15, 15]


def test_the_checked_in_dashboard_is_what_the_generator_writes():
    checked_in = (REPO / DEFAULT_PATH).read_text()
    assert checked_in == dashboard_json(), "regenerate: python -m g2rpo.observability.dashboard"


def test_the_dashboard_has_the_variables_and_every_query_selects_by_them():
    board = json.loads(dashboard_json())
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "pipeline", "run"]
    queries = dashboard_queries(board)
    assert len(queries) == sum(len(p.queries) for p in PANELS)
    for title, expr in queries:
        assert 'pipeline=~"$pipeline"' in expr, title
        if "g2rpo_training_" in expr:
            assert 'run_id=~"$run"' in expr, title
    for panel in board["panels"]:
        ref_ids = [t["refId"] for t in panel.get("targets", [])]
        assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids)
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)


@pytest.mark.gpu
def test_the_exporter_reports_cuda_memory():
    (port,) = free_ports(1)
    device = torch.device("cuda", torch.cuda.current_device())
    held = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # 64 MiB allocated
    exporter = TrainingExporter(port, address="127.0.0.1", run_id="r1", pipeline="p")
    try:
        exporter.on_iteration_end(SimpleNamespace(ctx=SimpleNamespace(device=device)), _record(0))
        family = _scrape(exporter.url)["g2rpo_training_accelerator_memory_bytes"]
    finally:
        exporter.close()
    by_kind = {s.labels["kind"]: s.value for s in family.samples}
    assert by_kind["allocated"] >= held.numel() and by_kind["reserved"] >= by_kind["allocated"]
    assert by_kind["peak_allocated"] >= by_kind["allocated"]
    assert {s.labels["device"] for s in family.samples} == {str(device)}
