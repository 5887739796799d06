"""``g2rpo pipeline submit|schedule`` through the real kfp.Client against a loopback KFP API server."""

from __future__ import annotations

import socket
import time

import pytest
import yaml

from g2rpo.cli import main
from pipelines.placement import load_profile
from pipelines.submit import check_cron
from tests.pipeline.kfp_server import KfpServer

RUNS = "/apis/v2beta1/runs"
RECURRING = "/apis/v2beta1/recurringruns"


@pytest.fixture(autouse=True)
def _no_kfp_context(tmp_path, monkeypatch):
    # kfp.Client reads and writes ~/.config/kfp/context.json: keep the user's out of the test.
    from kfp.client import client

    monkeypatch.setattr(client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp" / "context.json"))


def _check_pipeline_spec(body: dict) -> None:
    spec = body["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "g2rpo-alignment"
    executors = spec["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-train"]["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
    assert executors["exec-train"]["secretAsEnv"][0]["secretName"] == "g2rpo-s3"


def test_submit_sends_experiment_pipeline_platform_spec_and_parameters(capsys):
    with KfpServer() as server:
        code = main(
            [
                "pipeline",
                "submit",
                "--host",
                server.url,
                "--experiment",
                "nightly",
                "iterations=120",
                "learning_rate=3e-6",
                "granularities=[1,2]",
                "node_selector={pool: h200-spot}",
                "gpus_per_node=4",
            ]
        )
        assert code == 0
        (experiment,) = server.bodies("POST", "/apis/v2beta1/experiments")
        assert experiment["display_name"] == "nightly"
        (run,) = server.bodies("POST", RUNS)
    assert run["experiment_id"] == "e1"
    assert run["runtime_config"]["parameters"] == {
        "iterations": 120,
        "learning_rate": 3e-6,
        "granularities": [1, 2],
        "node_selector": {"pool": "h200-spot"},
        "gpus_per_node": "4",  # a string: the only form KFP's driver turns into a GPU limit (pipelines/alignment.py)
    }
    assert run["service_account"] == load_profile().service_account
    _check_pipeline_spec(run)
    assert "submitted run r1" in capsys.readouterr().out


def test_schedule_sends_cron_one_at_a_time_and_no_catchup(capsys):
    with KfpServer() as server:
        code = main(
            ["pipeline", "schedule", "--host", server.url, "--cron", "0 0 3 * * *", "--name", "nightly", "nodes=1"]
        )
        assert code == 0
        (recurring,) = server.bodies("POST", RECURRING)
    assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    assert recurring["max_concurrency"] == "1" or recurring["max_concurrency"] == 1
    assert recurring["no_catchup"] is True
    assert recurring["mode"] == "ENABLE"
    assert recurring["experiment_id"] == "e1"
    assert recurring["display_name"] == "nightly"
    assert recurring["runtime_config"]["parameters"] == {"nodes": 1}
    assert recurring["service_account"] == load_profile().service_account
    _check_pipeline_spec(recurring)
    assert "(UTC)" in capsys.readouterr().out


def test_submit_with_the_charts_service_account_overrides_the_profiles(capsys):
    # The Helm chart's retraining CronJob passes its own service account (charts/g2rpo/templates).
    with KfpServer() as server:
        code = main(["pipeline", "submit", "--host", server.url, "--service-account", "g2rpo-runner", "nodes=1"])
        assert code == 0
        (run,) = server.bodies("POST", RUNS)
    assert run["service_account"] == "g2rpo-runner" != load_profile().service_account


@pytest.mark.parametrize(
    "argv, message",
    [
        (["submit", "itrations=3"], "valid parameters: base_model_uri"),
        (["submit", "iterations=many"], "iterations='many': must be Integer"),
        (["submit", "granularities"], "write name=value"),
        (["submit", "gpus_per_node=four"], "gpus_per_node='four': give the GPUs of one node as a whole number"),
        (["submit", "gpus_per_node=0"], "gpus_per_node='0': give the GPUs of one node as a whole number from 1 to 16"),
        (["schedule", "--cron", "0 0 3 * * *", "gpus_per_node=2.5"], "gpus_per_node='2.5'"),
        (["schedule", "--cron", "0 3 * * *"], "has 5 fields"),
        (["schedule", "--cron", "0 0 25 * * *"], "hours '25' is outside 0-23"),
        (["schedule", "--cron", "0 0 3 * * FUNDAY"], "day of week 'FUNDAY'"),
    ],
)
def test_bad_input_is_refused_before_any_request(argv, message, capsys):
    with KfpServer() as server:
        verb, *rest = argv
        code = main(["pipeline", verb, "--host", server.url, *rest])
        assert code == 2
        assert server.requests == []
    assert message in capsys.readouterr().err


def test_an_unreachable_host_is_a_clear_error_within_seconds(capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.perf_counter()
    code = main(["pipeline", "submit", "--host", f"http://127.0.0.1:{port}", "iterations=3"])
    assert code == 2
    assert time.perf_counter() - started < 10
    assert "unreachable within 5 s" in capsys.readouterr().err


def test_valid_crons_pass_through():
    assert check_cron("0  0 3 * * *") == "0 0 3 * * *"
    assert check_cron("0 */15 1-5 ? JAN-MAR MON,WED") == "0 */15 1-5 ? JAN-MAR MON,WED"


def test_compile_command_writes_the_committed_yaml(tmp_path):
    out = tmp_path / "p.yaml"
    assert main(["pipeline", "compile", "--output", str(out)]) == 0
    first, _ = yaml.safe_load_all(out.read_text())
    assert first["pipelineInfo"]["name"] == "g2rpo-alignment"


def test_the_installed_command_finds_pipelines_outside_the_checkout(tmp_path):
    # `make demo` runs the console script from the checkout, where the interpreter's path holds the
    # venv, not the checkout: pipelines/ and components/ must be found through g2rpo's own location.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "p.yaml"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from g2rpo.cli import main; sys.exit(main())", "pipeline", "compile",
         "--output", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load_all(out.read_text()).__next__()["pipelineInfo"]["name"] == "g2rpo-alignment"
