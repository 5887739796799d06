"""The issue's proof against real servers: a tiny training run serves /metrics to a real Prometheus,
evaluate and promote push to a real Pushgateway, and every PromQL expression of the dashboard and of
the alert rules runs against that Prometheus (each dashboard query returning data).

One module-scoped pair of servers; the first test produces every series, the others read them.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from g2rpo.observability.dashboard import DEFAULT_PATH
from g2rpo.observability.push import PushTarget
from g2rpo.steps.evaluate import evaluate
from g2rpo.steps.promote import decide_and_promote
from g2rpo.steps.register import register
from g2rpo.steps.report_status import report_status
from g2rpo.steps.train import matching_evaluation, train_and_publish
from tests.observability.promservers import (
    CUDA_ONLY,
    REPO,
    RULES,
    SCRAPE_JOB,
    dashboard_queries,
    metric_name_problems,
    query_problems,
    substitute,
)
from tests.registry.registry_helpers import floor_gates
from tests.steps.steps_helpers import PROMPTS, tiny_run_config

pytestmark = pytest.mark.integration

PIPELINE = "nightly-test"
RUN_ID = "run-live"
ITERATIONS = 3
DASHBOARD = json.loads((REPO / DEFAULT_PATH).read_text())


@pytest.fixture(scope="module")
def produced(prom, tiny_flux_dir, tmp_path_factory):
    """Train (exporter on), evaluate + register + promote (pushing), and push two pipeline outcomes."""
    tmp = tmp_path_factory.mktemp("live")
    config = tiny_run_config(
        tiny_flux_dir,
        tmp / RUN_ID,
        train={
            "iterations": ITERATIONS,
            "checkpoint_every": 2,
            # validation at 0, 2 and the end (3): the dashboard's validation panels read these series
            "validation": {"enabled": True, "every": 2, "num_prompts": 2, "seeds": [0]},
        },
        observability={
            "metrics_port": prom.exporter_port,
            "metrics_address": "127.0.0.1",
            "linger_seconds": 3,
            "pipeline": PIPELINE,
            "run_id": RUN_ID,
        },
    )
    trained = train_and_publish(config, publish_uri=(tmp / "exports").as_uri())
    target = PushTarget(prom.gateway_url, pipeline=PIPELINE)
    evaluation = matching_evaluation(config, str(PROMPTS), num_prompts=2, seeds=(0,))
    evaluated = evaluate(
        trained.export_uri,
        evaluation,
        (tmp / "eval").as_uri(),
        base_model_uri=str(tiny_flux_dir),
        pushgateway=target,
        version_label="v1",
    )
    registry = (tmp / "registry").as_uri()
    registered = register(
        registry,
        "flux-live",
        export_uri=trained.export_uri,
        eval_uri=evaluated.output_uri,
        source_run=RUN_ID,
        config_hash=trained.config_hash,
        base_model="tiny",
        licence="apache-2.0",
    )
    floors = {name: mean - 1.0 for name, mean in evaluated.means.items()}  # below its own mean: promoted
    promoted = decide_and_promote(registry, "flux-live", registered.version, floor_gates(floors), pushgateway=target)
    assert promoted.passed and promoted.champion == registered.version
    # the pipeline's exit task, once for a run that succeeded and once for another pipeline's failed run
    ok = report_status("run-ok", "SUCCEEDED", tmp / "ok.json", pushgateway_url=prom.gateway_url, pipeline=PIPELINE)
    failed = report_status(
        "run-bad",
        "FAILED",
        tmp / "bad.json",
        error="boom",
        task="train",
        pushgateway_url=prom.gateway_url,
        pipeline="broken-test",
    )
    assert ok.pushed and failed.pushed
    return {"trained": trained, "promoted": promoted}


def test_prometheus_scrapes_the_training_run_and_the_pushes(prom, produced):
    up = prom.wait_for(f'up{{job="{SCRAPE_JOB}"}} == 1')
    assert up, f"the exporter was never scraped: {prom.logs()}"
    series = prom.wait_for(f'max_over_time(g2rpo_training_iteration{{run_id="{RUN_ID}", pipeline="{PIPELINE}"}}[10m])')
    assert series and int(float(series[0]["values"][-1][1])) == ITERATIONS
    rewards = prom.wait_for(f'g2rpo_training_reward_mean{{run_id="{RUN_ID}"}}')
    assert {(s["metric"]["reward"], s["metric"]["stride"]) for s in rewards} == {
        ("jpeg_compressibility", "1"),
        ("jpeg_compressibility", "2"),
    }  # configs/tiny-cpu.yaml: Λ = [1, 2]
    checkpoints = prom.wait_for(f'max_over_time(g2rpo_training_last_checkpoint_iteration{{run_id="{RUN_ID}"}}[10m])')
    assert int(float(checkpoints[0]["values"][-1][1])) == ITERATIONS  # 2, then the final one at 3
    mean = prom.wait_for(f'g2rpo_evaluation_metric_mean{{pipeline="{PIPELINE}", job="g2rpo-evaluate", version="v1"}}')
    assert {s["metric"]["metric"] for s in mean} == {"jpeg_compressibility"}
    decision = prom.wait_for(f'g2rpo_promotion_last_decision_timestamp_seconds{{pipeline="{PIPELINE}"}}')
    assert decision[0]["metric"]["outcome"] == "promoted" and decision[0]["metric"]["reason"] == "passed"
    assert prom.wait_for(f'g2rpo_promotion_last_promotion_timestamp_seconds{{pipeline="{PIPELINE}"}}')
    assert prom.wait_for(f'g2rpo_pipeline_last_success_timestamp_seconds{{pipeline="{PIPELINE}"}}')
    # Each push is scraped on its own: wait for the failed one too, not only for the first series to appear.
    prom.wait_for('g2rpo_pipeline_last_run_timestamp_seconds{job="g2rpo-pipeline", pipeline="broken-test"}')
    outcomes = prom.wait_for('g2rpo_pipeline_last_run_timestamp_seconds{job="g2rpo-pipeline"}')
    assert {(s["metric"]["pipeline"], s["metric"]["outcome"]) for s in outcomes} == {
        (PIPELINE, "succeeded"),
        ("broken-test", "failed"),
    }


def _variables(prom) -> dict[str, str]:
    """The template variables' values as Grafana would list them (label_values queries), narrowed to ours."""

    def listed() -> dict[str, list[str]]:
        values = {}
        for variable in DASHBOARD["templating"]["list"]:
            if variable["type"] != "query":
                continue
            query = variable["query"].replace('"$pipeline"', f'"{PIPELINE}"')
            inner = query[len("label_values(") : -1]
            selector, label = (part.strip() for part in inner.rsplit(",", 1))
            values[variable["name"]] = prom.api(f"label/{label}/values", **{"match[]": selector})
        return values

    # Both pushed runs reach the TSDB within a scrape or two (seen missing once under a load of 8).
    deadline = time.monotonic() + 20
    while not {PIPELINE, "broken-test"} <= set((values := listed())["pipeline"]) and time.monotonic() < deadline:
        time.sleep(1)
    assert PIPELINE in values["pipeline"] and "broken-test" in values["pipeline"]
    assert values["run"] == [RUN_ID]
    return {"pipeline": PIPELINE, "run": RUN_ID}


def test_every_dashboard_query_returns_data(prom, produced):
    variables = _variables(prom)
    queries = [(title, substitute(expr, variables)) for title, expr in dashboard_queries(DASHBOARD)]
    assert len(queries) >= 20
    deadline = time.monotonic() + 20  # pushed series reach the TSDB within a scrape or two
    while (problems := query_problems(prom, queries, allow_empty=CUDA_ONLY)) and time.monotonic() < deadline:
        time.sleep(1)
    assert problems == []


def test_a_misspelt_metric_in_a_panel_fails_the_check(prom, produced):
    variables = _variables(prom)
    title, expr = dashboard_queries(DASHBOARD)[0]
    misspelt = substitute(expr, variables).replace("g2rpo_training_reward_mean", "g2rpo_training_reward_maen")
    problems = query_problems(prom, [(title, misspelt)], allow_empty=CUDA_ONLY)
    assert problems == [f"{title}: no data for {misspelt!r}"]
    broken = substitute(expr, variables).replace("{", "{{")
    assert "error" in query_problems(prom, [(title, broken)])[0]


def test_the_cuda_only_exemption_names_a_metric_the_exporter_defines(produced):
    from prometheus_client import CollectorRegistry

    from g2rpo.observability.metrics import TrainingMetrics

    registry = CollectorRegistry()
    TrainingMetrics(registry, run_id="r", pipeline="p", process_metrics=False)
    assert CUDA_ONLY <= {family.name for family in registry.collect()}


def test_every_rule_runs_and_names_only_existing_series(prom, produced):
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    exprs = [rule["expr"] for rule in rules]
    for expr in exprs:
        prom.query(expr)  # raises PromQLError when Prometheus refuses it
    assert metric_name_problems(prom, exprs, allow_empty=CUDA_ONLY) == []
    # the server itself evaluates the loaded rule file: every rule healthy
    deadline = time.monotonic() + 10
    while True:
        loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        if all(r.get("lastEvaluation", "").startswith("20") for r in loaded) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {r["name"] for r in loaded} == {rule["alert"] for rule in rules}
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []


def test_a_failed_pipeline_run_fires_its_alert(prom, produced):
    firing = prom.wait_for('ALERTS{alertname="G2RPOPipelineRunFailed", alertstate="firing"}')
    assert {s["metric"]["pipeline"] for s in firing} == {"broken-test"}
