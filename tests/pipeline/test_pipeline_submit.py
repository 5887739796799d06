"""``g2rpo pipeline submit|schedule`` through the real kfp.Client against a loopback KFP API server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.steps.check import check_arguments
from g2rpo.steps.placement import load_profile
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
        # Merged over the profile's labels: the pool changes, the GPU product stays.
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "h200-spot"},
        "gpus_per_node": "4",  # a string: the only form KFP's driver turns into a GPU limit (pipelines/alignment.py)
        "train_pod_gpus": "4",  # one node: the train pod trains on them (g2rpo/steps/train_pod.py)
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
        (["schedule", "--cron", "0 0 3 31 2 *"], "never fires (no such day within 5 years, e.g. 31 February)"),
        (["schedule", "--cron", "? 0 3 * * *"], "'?' is only for day of month or day of week, not seconds"),
        (
            ["schedule", "--cron", "0 0 3 * * *", "--name", "n" * 300],
            "give 1 to 255 characters on one line (it has 300)",
        ),
        (["submit", "--run-name", "r" * 256], "give 1 to 255 characters"),
    ],
)
def test_bad_input_is_refused_before_any_request(argv, message, capsys):
    with KfpServer() as server:
        verb, *rest = argv
        code = main(["pipeline", verb, "--host", server.url, *rest])
        assert code == 2
        assert server.requests == []
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, messages",
    [
        (["submit", "group_size=1"], ["algorithm.group_size=1 (parameter group_size): Input should be greater than"]),
        (["submit", "strategy=nope"], ["algorithm.strategy (parameter strategy): 'nope' is not a strategy"]),
        (
            ["schedule", "--cron", "0 0 3 * * *", "learning_rate=-1"],
            ["train.learning_rate=-1 (parameter learning_rate): Input should be greater than 0"],
        ),
        (
            # Every problem at once, from the train, evaluate and prepare tasks and the placement.
            [
                "submit",
                "overrides=['train.adam_betas=[0.9, 1.5]', 'train.weight_decay=.inf']",
                "eval_seeds=[18446744073709551616]",
                "test_size=0",
                "nodes=0",
            ],
            [
                "5 problem(s) in the pipeline's parameters (nothing was sent or started)",
                "train.adam_betas.1=1.5: Input should be less than 1",
                "train.weight_decay=inf: Input should be a finite number",
                "seeds.0=18446744073709551616: Input should be less than or equal to 18446744073709551615 "
                "(parameter eval_seeds)",
                "test_size=0: give an integer in 1…",
                "nodes=0: give an integer in 1…",
            ],
        ),
        (
            ["submit", "gates_uri=configs/shapes-gates.yaml"],
            ["gates metrics ['jpeg_compressibility', 'shapes_background'", "that the evaluation does not score"],
        ),
    ],
)
def test_bad_values_are_refused_before_any_request(argv, messages, capsys):
    # What the tasks would refuse hours later on the cluster is refused here: no request at all.
    with KfpServer() as server:
        verb, *rest = argv
        code = main(["pipeline", verb, "--host", server.url, *rest])
        assert code == 2
        assert server.requests == []
    err = capsys.readouterr().err
    for message in messages:
        assert message in err


def test_the_default_run_passes_its_own_checks():
    # The pipeline's defaults with the h200 profile: the default gates gate what the default run scores.
    values = check_arguments({}, load_profile())
    assert values["gates_uri"] == "" and values["gpus_per_node"] == load_profile().gpus_per_node


def test_an_unreachable_host_is_a_clear_error_within_seconds(capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["pipeline", "submit", "--host", f"http://127.0.0.1:{port}", "iterations=3"])
    assert code == 2
    assert "unreachable within 5 s" in capsys.readouterr().err


def test_an_unreachable_host_is_refused_before_the_pipeline_is_imported_or_checked(monkeypatch, capsys):
    """The order, not a wall time (issue 28: 4.8 s of CPU went to validating before the first connection):
    the refusal comes before the pipeline's checks run and before kfp is imported by the command."""
    import sys

    import g2rpo.steps.check

    def checked(*args, **kwargs):
        raise AssertionError("the parameters were checked before the host")

    monkeypatch.setattr(g2rpo.steps.check, "check_arguments", checked)
    monkeypatch.delitem(sys.modules, "pipelines.submit", raising=False)  # re-imported only if reached
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for verb in (["submit"], ["schedule", "--cron", "0 0 3 * * *"]):
        assert main(["pipeline", *verb, "--host", f"http://127.0.0.1:{port}", "iterations=3"]) == 2
        assert "unreachable within 5 s" in capsys.readouterr().err
        assert "pipelines.submit" not in sys.modules, verb


def test_the_default_node_selector_label_can_be_removed(capsys):
    with KfpServer() as server:
        assert (
            main(
                ["pipeline", "submit", "--host", server.url, "node_selector={nvidia.com/gpu.product: null, pool: cpu}"]
            )
            == 0
        )
        (run,) = server.bodies("POST", RUNS)
    assert run["runtime_config"]["parameters"]["node_selector"] == {"pool": "cpu"}


def _schedule(server: KfpServer, *extra: str) -> int:
    return main(["pipeline", "schedule", "--host", server.url, "--cron", "0 0 3 * * *", "--name", "nightly", *extra])


def test_schedule_is_idempotent_by_name_and_refuses_other_settings(capsys):
    # The observed server creates a second recurring run for a second request of the same name.
    with KfpServer() as server:
        assert _schedule(server, "iterations=100") == 0
        assert "next fire times (UTC):" in capsys.readouterr().out
        assert _schedule(server, "iterations=100") == 0  # same settings: nothing changes
        out = capsys.readouterr().out
        assert "already scheduled with these settings: recurring run rr1" in out and "nothing changed" in out
        assert len(server.bodies("POST", RECURRING)) == 1 and list(server.recurring) == ["rr1"]

        assert _schedule(server, "iterations=200") == 2  # other settings under the same name
        err = capsys.readouterr().err
        assert "already has a recurring run of this name with other settings: rr1 (ENABLED)" in err
        assert "--replace" in err
        assert list(server.recurring) == ["rr1"]

        assert _schedule(server, "iterations=200", "--replace") == 0
        out = capsys.readouterr().out
        assert "scheduled recurring run rr2" in out and "replaced recurring run rr1" in out
        assert list(server.recurring) == ["rr2"]
        assert server.recurring["rr2"]["runtime_config"]["parameters"] == {"iterations": 200}
        # The new one existed before the old one was disabled, then deleted.
        order = [(m, p.split("?")[0]) for m, p, _ in server.requests if m != "GET"]
        assert order[-3:] == [("POST", RECURRING), ("POST", f"{RECURRING}/rr1:disable"), ("DELETE", f"{RECURRING}/rr1")]


def test_server_errors_are_clear_messages_not_tracebacks(capsys):
    with KfpServer() as server:
        message = "Internal error: Failed to create a recurring run: scheduledworkflow admission refused"
        server.fail[("POST", RECURRING)] = (500, {"error": message, "code": 13, "message": message})
        assert _schedule(server) == 2
        err = capsys.readouterr().err
        assert "creating recurring run 'nightly': the KFP server answered 500" in err
        assert "scheduledworkflow admission refused" in err and "kubectl get scheduledworkflows" in err
        assert "Traceback" not in err

        server.fail[("POST", RUNS)] = (403, {"error": "denied", "message": "user cannot create runs in kubeflow"})
        assert main(["pipeline", "submit", "--host", server.url]) == 2
        err = capsys.readouterr().err
        assert "the KFP server answered 403" in err and "user cannot create runs in kubeflow" in err
        assert "check your namespace and permissions" in err

        server.fail[("POST", RUNS)] = (502, ["upstream connect error"])  # a proxy's reply, not KFP's object
        assert main(["pipeline", "submit", "--host", server.url]) == 2
        err = capsys.readouterr().err
        assert "the KFP server answered 502" in err and '["upstream connect error"]' in err
        assert "Traceback" not in err


def test_a_long_name_would_fail_on_the_observed_server():
    # What the name check prevents: the loopback server answers a 300-character name as KFP 2.17 did.
    import json
    import urllib.request

    with KfpServer() as server:
        request = urllib.request.Request(
            server.url + RECURRING, data=json.dumps({"display_name": "n" * 300}).encode(), method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request)
    assert err.value.code == 500 and b"Data too long for column 'DisplayName'" in err.value.read()


def test_next_fire_times_follow_the_scheduler():
    from datetime import UTC, datetime

    from g2rpo.steps.cron import next_fire_times

    start = datetime(2026, 12, 1, 15, 0, tzinfo=UTC)
    assert [t.isoformat() for t in next_fire_times("0 30 2 * * MON", start)] == [
        "2026-12-07T02:30:00+00:00",  # 1 Dec 2026 is a Tuesday
        "2026-12-14T02:30:00+00:00",
        "2026-12-21T02:30:00+00:00",
    ]
    # Both day fields restricted: either matches (13 Dec 2026 is a Sunday, 4 Dec a Friday).
    assert [t.day for t in next_fire_times("0 0 12 13 * FRI", start)] == [4, 11, 13]
    # 29 February: once in the five years the scheduler looks ahead.
    assert next_fire_times("0 0 0 29 2 *", start) == [datetime(2028, 2, 29, tzinfo=UTC)]
    assert [t.hour for t in next_fire_times("0 0 3 ? * ?", start)] == [3, 3, 3]


def test_valid_crons_pass_through():
    assert check_cron("0  0 3 * * *") == "0 0 3 * * *"
    assert check_cron("0 */15 1-5 ? JAN-MAR MON,WED") == "0 */15 1-5 ? JAN-MAR MON,WED"


def test_compile_command_writes_the_committed_yaml(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["pipeline", "compile", "--output", str(out)]) == 0
    # it says what it is doing before the seconds of imports, and where it wrote when done
    captured = capsys.readouterr()
    assert captured.err.startswith(f"compiling the alignment pipeline into {out} (loading kfp and the components) …")
    assert captured.out == f"wrote {out}\n"
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


@pytest.mark.parametrize(
    "command",
    [
        ["pipeline", "submit", "--run-name", "run-\U0001f680"],
        ["pipeline", "submit", "--experiment", "nightly-\U0001f680"],
        ["pipeline", "submit", "prompts_uri=s3://g2rpo/prompts/\U0001f680.txt"],
        ["pipeline", "submit", "overrides=[train.note=\U0001f680]"],
        ["pipeline", "schedule", "--cron", "0 0 3 * * *", "--name", "emoji-\U0001f680"],
        ["pipeline", "schedule", "--cron", "0 0 3 * * *", "prompts_uri=s3://g2rpo/prompts/\U0001f680.txt"],
    ],
)
def test_characters_outside_the_bmp_are_refused_before_any_request(command, capsys):
    # KFP 2.17 stores names and parameters in MySQL as utf8 (3 bytes): an emoji fails there only after the
    # Argo Workflow or ScheduledWorkflow exists in Kubernetes. Nothing may reach the server.
    with KfpServer() as server:
        assert main([*command[:2], "--host", server.url, *command[2:]]) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert "'\U0001f680' (U+1F680), outside the Basic Multilingual Plane" in err
    assert "MySQL as utf8" in err and "no emoji" in err


def test_characters_up_to_u_ffff_pass():
    from pipelines.submit import check_texts

    check_texts({"--run-name": "Läufe \u00e9t\u00e9 \u4e2d\u6587 \ufffd", "rewards": [{"name": "clip", "w": 1.0}]})
    with pytest.raises(G2RPOError) as err:
        check_texts({"rewards": [{"name": "clip"}], "node_selector": {"pool\U00010000": "x"}})
    assert "node_selector" in str(err.value) and "U+10000" in str(err.value)


def test_a_failing_server_names_what_it_may_have_left_per_request_kind(capsys):
    with KfpServer() as server:
        server.fail[("POST", RUNS)] = (500, {"error": "boom", "message": "Error 1366 (HY000): Incorrect string value"})
        assert main(["pipeline", "submit", "--host", server.url]) == 2
        err = capsys.readouterr().err
        assert "an Argo Workflow" in err and "kubectl get workflows" in err and "ScheduledWorkflow" not in err
        server.fail[("POST", RECURRING)] = (500, {"error": "boom", "message": "boom"})
        assert _schedule(server) == 2
        err = capsys.readouterr().err
        assert "a ScheduledWorkflow" in err and "kubectl get scheduledworkflows" in err


def test_the_ranks_need_deepspeed_rule_has_one_wording_before_a_run_and_in_validate():
    """One owner (run_config.deepspeed_rank_problem): the pipeline's check and `g2rpo validate` say the same."""
    from g2rpo.training.preflight import run_problems
    from g2rpo.training.run_config import deepspeed_rank_problem, load_run_config

    rule = deepspeed_rank_problem(False, 2)
    assert rule == "deepspeed.enabled=False: 2 ranks need DeepSpeed for data parallelism: set it to true"
    assert deepspeed_rank_problem(False, 1) is None and deepspeed_rank_problem(True, 2) is None
    with pytest.raises(G2RPOError) as refused:  # a CPU config (no DeepSpeed) on two GPUs of one node
        check_arguments({"config_uri": "configs/tiny-cpu.yaml", "nodes": 1, "gpus_per_node": "2"}, load_profile())
    assert f"train task: {rule}" in str(refused.value)
    config = load_run_config(str(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"))
    assert rule in run_problems(config, world_size=2)
