"""The cluster tier's task pods carry what KFP 2.17's own driver puts on them.

``kfp-backend-check`` (``../shared/tools``) runs the driver's ``initPodSpecPatch`` on the compiled YAML with the
run's parameters; the pods :mod:`tests.cluster.kfp_tasks` builds must carry the same limits, Secret env, volumes,
node selector, tolerations and deadline (its command and arguments are the compiled ones: they are compared
with the YAML itself).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cluster.deploy import run_arguments
from tests.cluster.kfp_tasks import COMPILED, CompiledPipeline, Run
from tests.shared_checkout import require_shared

TASKS = ("train", "evaluate", "decide")  # the tasks whose patch the tool resolves without ML Metadata


@pytest.fixture(scope="module")
def driver_patches(tmp_path_factory) -> dict[str, dict]:
    tool = require_shared("tools/kfp-backend-check")
    out = tmp_path_factory.mktemp("kfp-backend-check")
    params = {k: v for k, v in run_arguments("g2rpo").items() if k in ("node_selector", "tolerations", "gpus_per_node")}
    params.update({k: v for k, v in run_arguments("g2rpo").items() if k.startswith("train_pod_")})
    done = subprocess.run(
        [str(tool), str(COMPILED), str(out), *TASKS],
        capture_output=True,
        text=True,
        timeout=300,
        env={"KFP_CHECK_PARAMS": json.dumps(params), "PATH": "/usr/bin:/bin"},
    )
    patches = {
        task: json.loads((out / f"podspecpatch.{task}.json").read_text())
        for task in TASKS
        if (out / f"podspecpatch.{task}.json").exists()
    }
    assert set(patches) == set(TASKS), done.stdout[-3000:] + done.stderr[-3000:]
    return patches


@pytest.mark.parametrize("task", TASKS)
def test_the_task_pod_matches_the_drivers_pod_spec_patch(driver_patches, task):
    pipeline = CompiledPipeline.load()
    run = Run(pipeline, run_arguments("g2rpo"), "r1", "g2rpo-alignment-r1", "s3://g2rpo/root")
    for upstream in ("prepare-data", "train", "evaluate"):
        outputs = pipeline.component(upstream).get("outputDefinitions", {}).get("artifacts", {})
        run.outputs[upstream] = {
            "artifacts": {
                k: {"uri": f"s3://g2rpo/x/{k}", "type": d["artifactType"], "metadata": {}} for k, d in outputs.items()
            }
        }
    pod = run.pod(task, namespace="ns", service_account="g2rpo", images={}, launcher_configmap="l")
    ours, theirs = pod["spec"], driver_patches[task]
    (main,) = ours["containers"]
    (patched,) = theirs["containers"]
    assert main["resources"] == patched.get("resources", {}), (main["resources"], patched)
    assert [e for e in main["env"] if "secretKeyRef" in e.get("valueFrom", {})] == patched.get("env", [])
    assert ours.get("activeDeadlineSeconds") == theirs.get("activeDeadlineSeconds")
    assert ours.get("nodeSelector") == theirs.get("nodeSelector")
    assert ours.get("tolerations") == theirs.get("tolerations")
    for volume in theirs.get("volumes", []):
        assert volume in ours["volumes"], (volume, ours["volumes"])
    for mount in patched.get("volumeMounts", []):
        assert mount in main["volumeMounts"], (mount, main["volumeMounts"])
    container = pipeline.executor(task)
    launcher_args = main["args"][: main["args"].index("--") + 1]
    assert main["args"][len(launcher_args) :] == [*container["command"], *container["args"]]
    assert patched["image"] == container["image"]
