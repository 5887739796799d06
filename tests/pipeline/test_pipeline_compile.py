"""The compiled pipeline: byte-for-byte the committed YAML, and the H200 placement in its platform spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.images import TRAINER_IMAGE
from g2rpo.errors import ConfigError
from g2rpo.steps.parameters import pipeline_defaults
from g2rpo.steps.placement import DEFAULT_PROFILE, load_profile
from pipelines.alignment import TASK_MARGIN_S, compile_pipeline

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "pipelines" / "compiled" / "alignment.yaml"


def _documents(path: Path) -> tuple[dict, dict]:
    pipeline_spec, platform_spec = yaml.safe_load_all(path.read_text())
    return pipeline_spec, platform_spec


def test_recompiled_pipeline_matches_the_committed_yaml(tmp_path):
    fresh = compile_pipeline(tmp_path / "alignment.yaml")
    assert fresh.read_bytes() == COMPILED.read_bytes(), (
        "pipelines/compiled/alignment.yaml is stale: run `g2rpo pipeline compile` and commit the result"
    )


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (k, *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def test_every_text_kfp_stores_is_ascii():
    # The API server stores the run's Workflow in its database: a MySQL/MariaDB column in latin1 (the cluster
    # tier's MariaDB, and any server left at that default) refuses "Λ" with a 500 on every submit. Found there.
    spec, platform = _documents(COMPILED)
    wide = sorted({s for s in _strings(spec) + _strings(platform) if not s.isascii()})
    assert not wide, f"non-ASCII text in the compiled pipeline: {wide}"


def test_train_placement_lands_in_the_platform_spec():
    profile = load_profile()
    spec, platform = _documents(COMPILED)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    train = executors["exec-train"]
    assert train["nodeSelector"] == {"nodeSelectorJson": {"componentInputParameter": "pipelinechannel--node_selector"}}
    assert train["tolerations"] == [{"tolerationJson": {"componentInputParameter": "pipelinechannel--tolerations"}}]
    assert train["emptyDirMounts"] == [
        {"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": profile.shm_size, "volumeName": "dshm"}
    ]
    assert train["podMetadata"]["labels"] == profile.pod_labels
    assert int(train["activeDeadlineSeconds"]) == profile.timeouts.train
    # The node selector and tolerations are pipeline parameters whose defaults are the profile's.
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["node_selector"]["defaultValue"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert inputs["tolerations"]["defaultValue"] == profile.tolerations
    assert inputs["gpus_per_node"] == {"defaultValue": "8", "isOptional": True, "parameterType": "STRING"}
    resources = spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]
    assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
    # The pod's size: parameters whose defaults are the profile's (g2rpo/steps/train_pod.py).
    assert resources["accelerator"]["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--train_pod_gpus']}}"
    assert inputs["train_pod_memory"]["defaultValue"] == profile.memory_limit


def test_every_task_has_a_timeout_the_s3_secret_by_name_and_no_cache():
    spec, platform = _documents(COMPILED)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    names = {"exec-prepare-data", "exec-train", "exec-evaluate", "exec-decide", "exec-promote", "exec-report-status"}
    assert set(executors) == names
    for name, executor in executors.items():
        assert int(executor["activeDeadlineSeconds"]) >= 60, name
        (secret,) = executor["secretAsEnv"]
        assert secret["secretName"] == "g2rpo-s3"
        assert {m["envVar"] for m in secret["keyToEnv"]} == {
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ENDPOINT_URL_S3",
        }
    tasks = dict(spec["root"]["dag"]["tasks"])
    tasks.update(spec["components"]["comp-exit-handler-1"]["dag"]["tasks"])
    tasks.update(spec["components"]["comp-condition-2"]["dag"]["tasks"])
    assert set(tasks) == {
        "exit-handler-1",
        "prepare-data",
        "train",
        "evaluate",
        "decide",
        "condition-2",
        "promote",
        "report-status",
    }
    for name, task in tasks.items():
        if name.startswith(("exit-handler", "condition")):
            continue
        assert task["cachingOptions"] == {}, f"{name} must not be cached"  # KFP writes enableCache only when true
        assert ("retryPolicy" in task) == (name in {"prepare-data", "train", "evaluate", "report-status"}), name
    assert (
        tasks["condition-2"]["triggerPolicy"]["condition"]
        == "inputs.parameter_values['pipelinechannel--decide-Output'] == true"
    )


def test_no_secret_value_appears_in_the_yaml(tmp_path, monkeypatch):
    # Whatever the compiling shell holds, only the Secret's name and keys reach the YAML.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEVALUE1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t/Value+Example")
    text = compile_pipeline(tmp_path / "p.yaml").read_text()
    assert "AKIAEXAMPLEVALUE1234" not in text and "s3cr3t/Value+Example" not in text
    assert "g2rpo-s3" in text


def test_every_retraining_choice_is_a_pipeline_parameter():
    spec, _ = _documents(COMPILED)
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    for name in ("base_model_uri", "prompts_uri", "strategy", "group_size", "num_steps", "granularities", "rewards"):
        assert name in inputs
    for name in ("iterations", "learning_rate", "gates_uri", "nodes", "gpus_per_node", "node_selector", "tolerations"):
        assert name in inputs
    assert set(pipeline_defaults()) <= set(inputs)
    assert inputs["granularities"]["defaultValue"] == [1, 2, 3]


def test_a_bad_profile_names_the_field(tmp_path):
    bad = tmp_path / "profile.yaml"
    bad.write_text(DEFAULT_PROFILE.read_text().replace("gpus_per_node: 8", "gpus_per_node: 0") + "\nnode_pool: x\n")
    with pytest.raises(ConfigError) as err:
        load_profile(bad)
    assert "gpus_per_node" in str(err.value) and "node_pool" in str(err.value)


def test_the_train_task_carries_its_run_identity_checkpoints_and_trainjob_placement():
    profile = load_profile()
    spec, _ = _documents(COMPILED)
    train = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    constants = {name: value["runtimeValue"]["constant"] for name, value in train.items() if "runtimeValue" in value}
    assert constants["run_id"] == "{{$.pipeline_job_uuid}}" and constants["task_name"] == "{{$.pipeline_task_name}}"
    assert constants["trainer_image"] == TRAINER_IMAGE
    assert constants["shm_size"] == profile.shm_size and constants["service_account"] == profile.service_account
    assert (
        constants["s3_secret_name"] == profile.s3_secret_name and constants["s3_secret_keys"] == profile.s3_secret_keys
    )
    assert int(constants["trainjob_deadline_s"]) == profile.timeouts.train - TASK_MARGIN_S
    for name in ("node_selector", "tolerations", "gpus_per_node", "nodes", "checkpoint_store_uri"):
        assert train[name] == {"componentInputParameter": f"pipelinechannel--{name}"}
    assert spec["root"]["inputDefinitions"]["parameters"]["checkpoint_store_uri"]["defaultValue"] == ""


@pytest.mark.parametrize("task", ["train", "evaluate"])
def test_tasks_that_load_models_quiet_library_bars_before_importing_the_steps(task):
    # A pod's stderr is a log: transformers' loading bars would be lines of carriage returns. The
    # pod runs the component's shipped source, not the CLI (which does this itself), and the env
    # variable works only if set before transformers is imported.
    pipeline_spec, _ = _documents(COMPILED)
    source = "\n".join(pipeline_spec["deploymentSpec"]["executors"][f"exec-{task}"]["container"]["command"])
    quiet = source.index("quiet_library_bars_in_logs()")
    assert quiet < source.index("from g2rpo.steps."), source
