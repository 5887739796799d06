"""The pipeline's train task beyond one pod: checkpoints mirrored under the run's identity so a lost pod
resumes from S3, and more than one node as the run's Kubeflow Trainer TrainJob.

The TrainJob test runs the real launcher (Kubeflow SDK) against the loopback Kubernetes API of tests/launch, which here also plays the Trainer controller: it runs
the job's container command once per node, with the ``PET_*`` variables the Trainer's torch plugin sets
and the S3 credentials resolved from the Secret the job names, and reports Complete or Failed by their
exit status. So the job body the task creates is the one that trains, mirrors and publishes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from g2rpo.artifacts.manifest import verify
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import G2RPOError
from g2rpo.faults import fault_env
from g2rpo.launch.trainjob import CONFIG_ENV, TRAINING_RUNTIME, job_name
from g2rpo.steps.placement import load_profile
from g2rpo.steps.train_task import checkpoint_uri_for, train_task, trainjob_for
from g2rpo.training.mirror import CheckpointMirror
from tests.chart.chart_render import training_runtime
from tests.launch.kubeapi import KubeAPI, condition
from tests.trainer.trainer_testlib import subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "tiny-cpu.yaml")
PROMPTS = str(ROOT / "configs" / "tiny-prompts.txt")
OVERRIDES = ["train.prompts_per_iteration=2", "train.checkpoint_every=1", "train.progress=false"]
RUN_ID = "5d0f6b1e-8c2a-4f7e-b0d3-2a9c4e6f8b10"
NAMESPACE = "team-a"


def _task(tiny_flux_dir: Path, work_dir: Path, store: str, iterations: int, overrides=OVERRIDES, **kwargs):
    return train_task(
        CONFIG,
        {"iterations": iterations},
        overrides,
        prompts=PROMPTS,
        base_model_uri=str(tiny_flux_dir),
        publish_uri=f"{store}/exports/g2rpo-tiny",
        record_dir=work_dir / "record",
        work_dir=work_dir / "work",
        **kwargs,
    )


def test_checkpoint_uri_is_the_runs_store_run_id_and_task():
    assert checkpoint_uri_for("s3://b/artifacts/", RUN_ID, "train") == f"s3://b/artifacts/checkpoints/{RUN_ID}/train"
    assert checkpoint_uri_for("s3://b/a", RUN_ID, "train", "s3://ckpt/") == f"s3://ckpt/{RUN_ID}/train"
    with pytest.raises(G2RPOError, match="run_id='': give the KFP run id"):
        checkpoint_uri_for("s3://b/a", "", "train")


def test_a_retried_train_task_resumes_from_the_runs_s3_checkpoints(tiny_flux_dir, s3_env, tmp_path):
    store = f"{s3_env.uri}/artifacts"
    uri = checkpoint_uri_for(store, RUN_ID, "train")
    # The first attempt's pod is lost in iteration 2 (SIGKILL), after checkpoints 1 and 2 reached S3.
    attempt = (
        "import json, sys; from g2rpo.steps.train_task import train_task; "
        "train_task(*json.loads(sys.argv[1]), **json.loads(sys.argv[2]))"
    )
    args = [CONFIG, {"iterations": 3}, OVERRIDES]
    kwargs = dict(prompts=PROMPTS, base_model_uri=str(tiny_flux_dir), publish_uri=f"{store}/exports/g2rpo-tiny")
    kwargs.update(record_dir=str(tmp_path / "pod-1" / "record"), work_dir=str(tmp_path / "pod-1" / "work"))
    env = {**subprocess_env(), **fault_env("iteration:2")}
    first = subprocess.run(
        [sys.executable, "-c", attempt, json.dumps(args), json.dumps({**kwargs, "checkpoint_uri": uri})],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    mirror = CheckpointMirror(uri, keep_last=2)
    assert mirror.newest() == 2 and not (tmp_path / "pod-1" / "record" / "record.json").exists()

    # The retry runs on a fresh pod (nothing of the first one's disk) with the same run identity.
    record = _task(tiny_flux_dir, tmp_path / "pod-2", store, 3, checkpoint_uri=uri)
    events = [json.loads(line) for line in (tmp_path / "pod-2" / "work" / "metrics.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in events if e.get("event") == "resumed"] == [2]
    assert [e["iteration"] for e in events if "prompt_indices" in e] == [2]  # only what was left
    assert record.iterations == 3 and mirror.newest() == 3
    assert verify(open_store(record.export_uri), deep=True).metadata["iterations"] == 3


def test_a_multi_node_train_task_launches_the_runs_trainjob(tiny_flux_dir, s3_env, tmp_path):
    # The real launcher talks to a loopback Kubernetes API; the "cluster" reports the job Failed at its
    # first poll (no nodes run here: two DeepSpeed ranks as separate local "nodes" did not rendezvous on
    # this machine), so the task must fail with the job's message, and the TrainJob it created is checked.
    profile = load_profile()
    store = f"{s3_env.uri}/artifacts"
    uri = checkpoint_uri_for(store, RUN_ID, "train")
    launch = trainjob_for(
        image="ghcr.io/g2rpo/g2rpo-trainer:test",
        run_id=RUN_ID,
        task="train",
        gpus_per_node=1,
        node_selector=profile.node_selector,
        tolerations=profile.tolerations,
        shm_size=profile.shm_size,
        s3_secret=profile.s3_secret_name,
        s3_secret_keys=profile.s3_secret_keys,
        service_account=profile.service_account,
        deadline_s=7200,
    )
    failed = {"conditions": [condition("Failed", "node-1 exited with code 137 (OOMKilled)", "TrainingFailed")]}
    # The chart's own runtime: the launcher checks that its pods read the profile's Secret.
    # The chart's own runtime, with the shared volume a multi-node run writes output.dir to.
    runtime = training_runtime({"trainingRuntime": {"sharedVolume": {"claimName": "g2rpo-runs"}}})
    with KubeAPI(TRAINING_RUNTIME, runtime=runtime, script=lambda job, polls: failed) as api:
        # In a pod the SDK reads the in-cluster config and namespace; here they point at the loopback API.
        launch = replace(launch, namespace=NAMESPACE, client_configuration=api.configuration(), poll_interval_s=1)
        with pytest.raises(G2RPOError, match=r"TrainingFailed: node-1 exited with code 137 \(OOMKilled\)"):
            _task(
                tiny_flux_dir,
                tmp_path / "task",
                store,
                2,
                [*OVERRIDES, "deepspeed.enabled=true"],  # data parallelism across ranks is DeepSpeed's
                nodes=2,
                gpus_per_node=1,
                checkpoint_uri=uri,
                trainjob=launch,
                prompts_uri=f"{store}/data/train.jsonl",  # what the job's pods read
            )

    (job,) = [c["body"] for c in api.calls if c["method"] == "POST"]
    name = job_name(RUN_ID, "train")
    assert job["metadata"]["name"] == name and api.jobs[name]["metadata"]["namespace"] == NAMESPACE
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["trainer"]["numNodes"] == 2 and spec["trainer"]["image"] == "ghcr.io/g2rpo/g2rpo-trainer:test"
    assert spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert "exec python -m g2rpo.launch.torchrun --nproc-per-node=1 -m g2rpo train" in spec["trainer"]["command"][2]
    export_base = f"{store}/exports/g2rpo-tiny/{name}"
    shared = f"output.dir=/g2rpo-runs/{name}"  # the runtime's shared volume
    assert spec["trainer"]["command"][4:] == ["--checkpoint-uri", uri, "--publish", export_base, shared]
    config = yaml.safe_load({e["name"]: e["value"] for e in spec["trainer"]["env"]}[CONFIG_ENV])
    assert config["train"]["iterations"] == 2 and config["model"]["path"] == str(tiny_flux_dir)
    # The job's pods read the prompts from S3, not from this task's local copy (no other pod has it).
    assert config["data"]["prompts"] == f"{store}/data/train.jsonl"
    (patch,) = spec["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == profile.node_selector and pod["tolerations"] == profile.tolerations
    assert pod["serviceAccountName"] == profile.service_account
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": profile.shm_size}}]
    (container,) = pod["containers"]
    assert "env" not in container  # the runtime carries the Secret's env (the Trainer refuses env patches)
    assert s3_env.env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(job)  # the Secret's name, never its values


def test_more_than_one_node_needs_a_trainjob_and_is_refused_before_training(tmp_path):
    with pytest.raises(G2RPOError, match="more than one node trains as a Kubeflow TrainJob"):
        _task(
            tmp_path / "tiny-flux",
            tmp_path,
            (tmp_path / "store").as_uri(),
            1,
            nodes=2,
            checkpoint_uri="s3://b/c",
            prompts_uri="s3://b/data/train.jsonl",
        )
    assert not (tmp_path / "tiny-flux").exists() and not (tmp_path / "store").exists()


def test_more_than_one_node_needs_the_prompts_where_the_jobs_pods_read_them(tmp_path):
    # The task's local copy of the prompts exists in its own pod only (seen on the cluster tier: the TrainJob's
    # pods failed with "file not found"); without an s3:// URI the task refuses before anything starts.
    for given in (None, str(PROMPTS)):
        with pytest.raises(G2RPOError, match="with nodes=2 the TrainJob's pods read the prompts"):
            _task(tmp_path / "m", tmp_path, (tmp_path / "s").as_uri(), 1, nodes=2, prompts_uri=given)
    assert not (tmp_path / "record").exists()


def test_the_pipelines_learning_rate_zero_leaves_the_strategys_own(tmp_path):
    # configs/flux-dev-h200.yaml (the pipeline's default config) sets no learning rate of its own.
    from g2rpo.steps.train_task import run_config_for

    base = {"strategy": "dancegrpo", "learning_rate": 0.0}
    config = run_config_for(
        "configs/flux-dev-h200.yaml",
        base,
        base_model_uri=str(tmp_path / "m"),
        prompts="p.txt",
        output_dir=tmp_path / "o",
    )
    assert config.train.learning_rate is None and config.learning_rate == 1e-5  # DanceGRPO's published rate
    config = run_config_for(
        "configs/flux-dev-h200.yaml",
        {**base, "learning_rate": 3e-6},
        base_model_uri=str(tmp_path / "m"),
        prompts="p.txt",
        output_dir=tmp_path / "o",
    )
    assert config.train.learning_rate == 3e-6 and config.learning_rate == 3e-6


def test_the_pipelines_validation_parameters_turn_it_on_and_unset_keep_the_files(tmp_path):
    from g2rpo.steps.train_task import run_config_for

    unset = {
        "validation_every": 0,
        "validation_num_prompts": 0,
        "validation_max_regression": {},
        "validation_stop_after_breaches": 0,
        "validation_patience": 0,
    }
    where = dict(base_model_uri=str(tmp_path / "m"), prompts="p.txt", output_dir=tmp_path / "o")
    # configs/shapes-cpu.yaml has its own validation block: unset parameters leave it as the file has it
    shapes = str(ROOT / "configs" / "shapes-cpu.yaml")
    from_file = run_config_for(shapes, {}, **where).train.validation
    assert from_file.enabled and from_file.max_regression["shapes_background"] == 0.05
    assert run_config_for(shapes, unset, **where).train.validation == from_file
    # the default config has none (off); a positive validation_every turns it on with the other values
    off = run_config_for("configs/flux-dev-h200.yaml", unset, **where).train.validation
    assert off.enabled is False
    chosen = {
        **unset,
        "validation_every": 25,
        "validation_num_prompts": 16,
        "validation_max_regression": {"clip": 0.01},
        "validation_stop_after_breaches": 2,
    }
    config = run_config_for(
        "configs/flux-dev-h200.yaml",
        {**chosen, "rewards": [{"name": "hps_v21"}, {"name": "clip", "weight": 0.0}]},
        **where,
    )
    validation = config.train.validation
    assert (validation.enabled, validation.every, validation.num_prompts) == (True, 25, 16)
    assert validation.max_regression == {"clip": 0.01} and validation.stop_after_breaches == 2
    assert validation.patience is None


def test_the_train_tasks_record_names_the_validated_iteration_it_exported(tiny_flux_dir, tmp_path):
    store = (tmp_path / "store").as_uri()
    record = train_task(
        CONFIG,
        {"iterations": 4, "validation_every": 2, "validation_num_prompts": 2},
        [*OVERRIDES, "train.validation.seeds=[0]"],
        prompts=PROMPTS,
        base_model_uri=str(tiny_flux_dir),
        publish_uri=f"{store}/exports/g2rpo-tiny",
        record_dir=tmp_path / "record",
        work_dir=tmp_path / "work",
    )
    assert [p["iteration"] for p in record.validation_curve] == [0, 2, 4]
    objectives = {p["iteration"]: p["objective"] for p in record.validation_curve[1:]}
    assert record.selected_iteration == max(objectives, key=lambda i: (objectives[i], -i))
    assert record.selection_reason.startswith("highest validated objective") and record.early_stop is None
    published = json.loads(open_store(record.export_uri).get_bytes("base_model.json")[0])
    assert published["selected_iteration"] == record.selected_iteration
