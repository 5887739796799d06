"""The train task's own pod: the one-node size, or sized for waiting when a TrainJob trains (g2rpo/steps/train_pod.py)."""

from __future__ import annotations

import pytest
import yaml

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.steps.placement import load_profile
from g2rpo.steps.train_pod import WAITING, size_train_pod
from tests.pipeline.kfp_server import KfpServer

PROFILE = load_profile()


def test_more_than_one_node_sizes_the_pod_for_waiting():
    assert size_train_pod({"nodes": 2, "gpus_per_node": "4"}, PROFILE) == {
        "nodes": 2,
        "gpus_per_node": "4",
        "train_pod_gpus": "0",
        "train_pod_cpu": "1",
        "train_pod_memory": "4Gi",
    }


def test_one_node_keeps_the_pipeline_defaults_and_follows_gpus_per_node():
    assert size_train_pod({}, PROFILE) == {}  # the compiled defaults are the profile's one-node size
    assert size_train_pod({"nodes": 1, "gpus_per_node": "2"}, PROFILE) == {
        "nodes": 1,
        "gpus_per_node": "2",
        "train_pod_gpus": "2",
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"nodes": 2, "train_pod_gpus": "8"}, "its own pod would hold 8 idle GPUs; give 0"),
        ({"nodes": 1, "gpus_per_node": "4", "train_pod_gpus": "0"}, "on gpus_per_node=4 GPUs; give 4"),
    ],
)
def test_a_pod_size_given_by_hand_that_idles_or_starves_gpus_is_refused(arguments, message):
    with pytest.raises(G2RPOError) as err:
        size_train_pod(arguments, PROFILE)
    assert "train_pod_gpus" in str(err.value) and message in str(err.value)


def test_the_compiled_train_task_reads_its_size_from_the_parameters():
    spec, _ = yaml.safe_load_all(open("pipelines/compiled/alignment.yaml").read())
    resources = spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]
    assert resources["accelerator"]["resourceCount"] == "{{$.inputs.parameters['pipelinechannel--train_pod_gpus']}}"
    assert resources["resourceCpuLimit"] == "{{$.inputs.parameters['pipelinechannel--train_pod_cpu']}}"
    assert resources["resourceMemoryLimit"] == "{{$.inputs.parameters['pipelinechannel--train_pod_memory']}}"
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["train_pod_gpus"]["defaultValue"] == str(PROFILE.gpus_per_node)
    assert inputs["train_pod_cpu"]["defaultValue"] == PROFILE.cpu_limit
    assert inputs["train_pod_memory"]["defaultValue"] == PROFILE.memory_limit


def test_submit_with_two_nodes_sends_the_waiting_size(tmp_path, monkeypatch):
    from kfp.client import client

    monkeypatch.setattr(client.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp" / "context.json"))
    with KfpServer() as server:
        assert main(["pipeline", "submit", "--host", server.url, "nodes=2", "gpus_per_node=4"]) == 0
        (run,) = server.bodies("POST", "/apis/v2beta1/runs")
    assert run["runtime_config"]["parameters"] == {"nodes": 2, "gpus_per_node": "4", **WAITING}
