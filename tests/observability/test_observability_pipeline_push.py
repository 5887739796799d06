"""The pipeline's evaluate, decide and promote steps push to a real Pushgateway (the pipeline's
``pushgateway_url``), and only warn when it is down.

One tiny training run, then the tasks as the pipeline chains them: evaluate (no champion yet), decide
(passes), promote; evaluate again (now against champion v1), decide (refused: it must beat v1 by 1.0).
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from g2rpo.observability.push import PushgatewayWarning
from g2rpo.steps.candidates import evaluate_candidates
from g2rpo.steps.gate import decide_challenger, promote_challenger
from g2rpo.steps.promote import write_gates
from g2rpo.steps.train_task import train_task
from tests.registry.registry_helpers import floor_gates
from tests.s3server import free_ports
from tests.steps.steps_helpers import PROMPTS, REPO

pytestmark = pytest.mark.integration

PIPELINE = "pipeline-push-test"


def _gateway_samples(url: str, name: str) -> list[dict[str, str]]:
    """The labels of every sample of ``name`` the gateway holds for :data:`PIPELINE`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    return [
        dict(sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("pipeline") == PIPELINE
    ]


def test_evaluate_decide_and_promote_push_and_a_dead_gateway_only_warns(prom, tiny_flux_dir, tmp_path):
    root = tmp_path.as_uri()
    registry, url = f"{root}/registry", prom.gateway_url
    train_dir = tmp_path / "train"
    train_task(
        str(REPO / "configs" / "tiny-cpu.yaml"),
        {"iterations": 1},
        prompts=str(PROMPTS),
        base_model_uri=str(tiny_flux_dir),
        publish_uri=f"{root}/exports",
        record_dir=train_dir,
        work_dir=tmp_path / "work",
    )

    def candidates(name: str, gateway: str):
        return evaluate_candidates(
            train_dir,
            str(PROMPTS),
            registry_uri=registry,
            model="m",
            store_uri=root,
            output_dir=tmp_path / name,
            report_path=tmp_path / name / "report.html",
            num_prompts=1,
            seeds=(0,),
            pushgateway_url=gateway,
            pipeline=PIPELINE,
        )

    def decide(name: str, evaluation: str, gates: str, gateway: str):
        return decide_challenger(
            train_dir,
            tmp_path / evaluation,
            registry_uri=registry,
            model="m",
            gates_uri=gates,
            source_run=name,
            output_dir=tmp_path / name,
            pushgateway_url=gateway,
            pipeline=PIPELINE,
        )

    def decisions() -> set[tuple[str, str]]:
        samples = _gateway_samples(url, "g2rpo_promotion_last_decision_timestamp_seconds")
        return {(s["outcome"], s["reason"]) for s in samples}

    first = candidates("eval-1", url)
    means = _gateway_samples(url, "g2rpo_evaluation_metric_mean")
    assert {(s["job"], s["version"], s["metric"]) for s in means} == {
        ("g2rpo-evaluate", "challenger", name) for name in first.challenger_means
    }

    floors, _ = write_gates(floor_gates({m: v - 1.0 for m, v in first.challenger_means.items()}), tmp_path / "f.yaml")
    assert decide("decide-1", "eval-1", str(floors), url).passed
    assert decisions() == {("dry_run", "passed")}
    promoted = promote_challenger(
        tmp_path / "decide-1",
        tmp_path / "eval-1",
        registry_uri=registry,
        gates_uri=str(floors),
        reason="test",
        pushgateway_url=url,
        pipeline=PIPELINE,
    )
    assert promoted.champion == 1
    assert decisions() == {("promoted", "passed")}  # the promote push replaced decide's
    assert [s["model"] for s in _gateway_samples(url, "g2rpo_promotion_last_promotion_timestamp_seconds")] == ["m"]

    # against champion v1: both evaluations in the one push, neither replacing the other
    second = candidates("eval-2", url)
    assert second.champion_version == 1
    means = _gateway_samples(url, "g2rpo_evaluation_metric_mean")
    assert {s["version"] for s in means} == {"challenger", "v1"}
    higher, _ = write_gates(floor_gates({m: -1e9 for m in second.challenger_means}, 1.0), tmp_path / "h.yaml")
    refused = decide("decide-2", "eval-2", str(higher), url)
    assert not refused.passed
    assert {outcome for outcome, _ in decisions()} == {"rejected"}  # a refusal in the pipeline is final

    # a gateway that is down: the steps warn and finish, records written
    (port,) = free_ports(1)
    dead = f"http://127.0.0.1:{port}"
    with pytest.warns(PushgatewayWarning, match="g2rpo-evaluate"):
        third = candidates("eval-3", dead)
    assert third.champion_version == 1 and (tmp_path / "eval-3" / "record.json").is_file()
    with pytest.warns(PushgatewayWarning, match="g2rpo-promote"):
        assert not decide("decide-3", "eval-3", str(higher), dead).passed
    assert (tmp_path / "decide-3" / "record.json").is_file()
    assert {outcome for outcome, _ in decisions()} == {"rejected"}  # the live gateway kept its last push
