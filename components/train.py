"""Component **train**: the prepared prompts in, the published export's record out (:func:`g2rpo.steps.train_task.train_task`)."""

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
    overrides: list,
    store_uri: str,
    model_name: str,
    nodes: int,
    gpus_per_node: int,
    model: Output[Model],
    metrics: Output[Metrics],
):
    """Train on ``data``'s train split; ``model`` receives the record of the export published under ``store_uri``."""
    # KFP ships this function's source alone, so its imports live inside it.
    import os

    from g2rpo.steps.train_task import train_task

    choices = {
        "strategy": strategy,
        "num_steps": num_steps,
        "group_size": group_size,
        "granularities": granularities,
        "rewards": rewards,
        "iterations": iterations,
        "learning_rate": learning_rate,
    }
    record = train_task(
        config_uri,
        choices,
        overrides,
        prompts=os.path.join(data.path, "train.jsonl"),
        base_model_uri=base_model_uri,
        publish_uri=f"{store_uri.rstrip('/')}/exports/{model_name}",
        record_dir=model.path,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
    )
    model.metadata.update({"export_uri": record.export_uri, "config_hash": record.config_hash})
    metrics.log_metric("iterations", record.iterations)
    for name in ("first_reward", "last_reward"):
        if getattr(record, name) is not None:
            metrics.log_metric(name, getattr(record, name))
