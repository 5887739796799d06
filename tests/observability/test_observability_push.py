"""A Pushgateway that is down makes a step warn and succeed; the flags reach the steps."""

from __future__ import annotations

import pytest

from g2rpo.cli import main
from g2rpo.observability.push import PushgatewayWarning, PushTarget, push_evaluation, push_pipeline_run
from g2rpo.steps.promote import decide_and_promote, write_gates
from tests.registry.registry_helpers import floor_gates
from tests.s3server import free_ports
from tests.steps.steps_helpers import PROMPTS, make_scores, publish_fake_export

pytestmark = pytest.mark.integration


@pytest.fixture
def dead_gateway() -> str:
    (port,) = free_ports(1)  # nothing listens there
    return f"http://127.0.0.1:{port}"


def test_pushes_to_a_dead_gateway_warn_and_return_false(dead_gateway):
    target = PushTarget(dead_gateway, pipeline="p", timeout=2)
    with pytest.warns(
        PushgatewayWarning, match=rf"could not push g2rpo-pipeline metrics to the Pushgateway {dead_gateway}"
    ):
        assert push_pipeline_run(target, succeeded=False) is False
    with pytest.warns(PushgatewayWarning, match="g2rpo-evaluate"):
        assert push_evaluation(target, {4: {"jpeg": {"mean": 1.0, "std": 0.1, "n": 4}}}) is False
    with pytest.warns(PushgatewayWarning, match="not-a-url"):
        assert push_pipeline_run(PushTarget("not-a-url"), succeeded=True) is False


def test_the_exit_task_with_a_dead_gateway_warns_and_records(dead_gateway, tmp_path):
    from g2rpo.steps.report_status import report_status

    with pytest.warns(PushgatewayWarning, match="g2rpo-pipeline"):
        status = report_status("run-1", "FAILED", tmp_path / "status.json", pushgateway_url=dead_gateway)
    assert status.pushed is False and status.pushgateway_url == dead_gateway
    assert '"pushed": false' in (tmp_path / "status.json").read_text()


def test_promote_with_a_dead_gateway_warns_and_promotes(dead_gateway, tmp_path):
    from g2rpo.steps.register import register

    root = tmp_path.as_uri()
    registry = f"{root}/registry"
    register(
        registry,
        "m",
        export_uri=publish_fake_export(root, tmp_path, "r1"),
        scores=make_scores({"jpeg": -5.0}),
        source_run="r1",
        config_hash="cfg",
        base_model="tiny",
        licence="apache-2.0",
    )
    # the CLI: --pushgateway reaches the step, a dry run's exit code is unchanged
    gates, _ = write_gates(floor_gates({"jpeg": -6.0}), tmp_path / "gates.yaml")
    argv = ["registry", "promote", "m", "1", "--registry", registry, "--gates", str(gates), "--dry-run"]
    with pytest.warns(PushgatewayWarning, match=dead_gateway):
        assert main([*argv, "--pushgateway", dead_gateway, "--pipeline", "p"]) == 0
    target = PushTarget(dead_gateway, pipeline="p", timeout=2)
    with pytest.warns(PushgatewayWarning) as caught:
        result = decide_and_promote(registry, "m", 1, floor_gates({"jpeg": -6.0}), pushgateway=target)
    assert result.passed and result.champion == 1
    pushed = sorted(str(w.message).split()[3] for w in caught)
    assert pushed == ["g2rpo-promote", "g2rpo-promotion"]  # the decision, and the promotion's time


def test_eval_cli_with_a_dead_gateway_warns_and_publishes(dead_gateway, tiny_flux_dir, tmp_path, capsys):
    output = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_flux_dir), "--prompts", str(PROMPTS), "--output", str(output)]
    argv += ["--seeds", "0", "--steps", "2", "--metrics", "jpeg_compressibility"]
    argv += ["num_prompts=1", "device=cpu", "height=64", "width=64", "--pushgateway", dead_gateway]
    with pytest.warns(PushgatewayWarning, match="g2rpo-evaluate"):
        assert main([*argv, "--pipeline", "p", "--version-label", "base"]) == 0
    assert (output / "manifest.json").is_file()
    assert "published" in capsys.readouterr().out
