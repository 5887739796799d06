"""Component **train**: the prepared prompts in, the published export's record out (:func:`g2rpo.steps.train_task.train_task`).

Checkpoints are mirrored under the run's checkpoint store, named by the KFP run id and the task name, so a
retried task resumes. With ``nodes > 1`` the task launches the run's TrainJob in the trainer image on the
task's own placement (node selector, tolerations, /dev/shm, the S3 Secret by name, service account), and
this task's pod, sized by the ``train_pod_*`` parameters, holds no GPU (checked here).
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train(
    data: Input[Dataset],
    config_uri: str,
    base_model_uri: str,
    strategy: str,
    num_steps: int,
    group_size: int,
    granularities: list,
    rewards: list,
    iterations: int,
    learning_rate: float,
    validation_every: int,
    validation_num_prompts: int,
    validation_max_regression: dict,
    validation_stop_after_breaches: int,
    validation_patience: int,
    overrides: list,
    store_uri: str,
    model_name: str,
    nodes: int,
    gpus_per_node: str,
    checkpoint_store_uri: str,
    run_id: str,
    task_name: str,
    trainer_image: str,
    node_selector: dict,
    tolerations: list,
    shm_size: str,
    s3_secret_name: str,
    s3_secret_keys: dict,
    service_account: str,
    trainjob_deadline_s: int,
    train_pod_gpus: str,
    train_pod_cpu: str,
    train_pod_memory: str,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Train on ``data``'s train split; ``model`` receives the record of the export published under ``store_uri``."""
    # The training choices (strategy ... validation_patience) are the rows of g2rpo.steps.parameters'
    # TRAIN_PARAMETERS, in its order (tests/pipeline/test_pipeline_parameters.py); taken from the parameters
    # before any other name is bound here.
    given = dict(locals())
    # KFP ships this function's source alone, so its imports live inside it.
    import os

    from g2rpo.progress import quiet_library_bars_in_logs

    quiet_library_bars_in_logs()  # a pod's log: no loading bars of carriage returns (before transformers loads)
    from g2rpo.errors import G2RPOError
    from g2rpo.launch.trainjob import gpus_per_node_from, train_pod_problems
    from g2rpo.steps.parameters import train_choices
    from g2rpo.steps.train_task import checkpoint_uri_for, train_task, trainjob_for

    gpus = gpus_per_node_from(gpus_per_node)  # a string parameter: the driver reads accelerator counts as strings
    # This pod's own size (the train_pod_* parameters, g2rpo/steps/train_pod.py): no idle GPUs while a TrainJob trains.
    problems = train_pod_problems(nodes, gpus_per_node, train_pod_gpus)
    if problems:
        raise G2RPOError(f"train pod ({train_pod_cpu} CPU, {train_pod_memory}): " + "; ".join(problems))

    record = train_task(
        config_uri,
        train_choices(given),
        overrides,
        prompts=os.path.join(data.path, "train.jsonl"),
        prompts_uri=data.uri.rstrip("/") + "/train.jsonl",  # what a TrainJob's pods read (nodes > 1)
        base_model_uri=base_model_uri,
        publish_uri=f"{store_uri.rstrip('/')}/exports/{model_name}",
        record_dir=model.path,
        nodes=nodes,
        gpus_per_node=gpus,
        checkpoint_uri=checkpoint_uri_for(store_uri, run_id, task_name, checkpoint_store_uri),
        trainjob=trainjob_for(
            image=trainer_image,
            run_id=run_id,
            task=task_name,
            gpus_per_node=gpus,
            node_selector=node_selector,
            tolerations=tolerations,
            shm_size=shm_size,
            s3_secret=s3_secret_name,
            s3_secret_keys=s3_secret_keys,
            service_account=service_account,
            deadline_s=trainjob_deadline_s,
        )
        if nodes > 1
        else None,
    )
    model.metadata.update({"export_uri": record.export_uri, "config_hash": record.config_hash})
    metrics.log_metric("iterations", record.iterations)
    for name in ("first_reward", "last_reward"):
        if getattr(record, name) is not None:
            metrics.log_metric(name, getattr(record, name))
    # The validation curve and the chosen iteration, in the run's metrics tab.
    for point in record.validation_curve:
        metrics.log_metric(f"validation.objective.iter-{point['iteration']:06d}", point["objective"])
    if record.selected_iteration is not None:
        metrics.log_metric("validation.selected_iteration", record.selected_iteration)
    if record.validation_curve:
        metrics.log_metric("validation.early_stopped", 0 if record.early_stop is None else 1)
