"""Component **evaluate**: the challenger, and the champion on the same prompts and seeds
(:func:`g2rpo.steps.candidates.evaluate_candidates`)."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    data: Input[Dataset],
    trained: Input[Model],
    registry_uri: str,
    model_name: str,
    store_uri: str,
    eval_num_prompts: int,
    eval_seeds: list,
    pushgateway_url: str,
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[HTML],
):
    """Evaluate on ``data``'s test split (its first ``eval_num_prompts``; 0 for all) x ``eval_seeds``
    (and push the summaries to ``pushgateway_url`` when one is given)."""
    # KFP ships this function's source alone, so its imports live inside it.
    import os

    from g2rpo.progress import quiet_library_bars_in_logs

    quiet_library_bars_in_logs()  # a pod's log: no loading bars of carriage returns (before transformers loads)
    from g2rpo.steps.candidates import evaluate_candidates
    from g2rpo.steps.records import artifact_metadata

    record = evaluate_candidates(
        trained.path,
        os.path.join(data.path, "test.jsonl"),
        registry_uri=registry_uri,
        model=model_name,
        store_uri=store_uri,
        output_dir=evaluation.path,
        report_path=report.path,
        num_prompts=eval_num_prompts or None,
        seeds=eval_seeds,
        pushgateway_url=pushgateway_url,
    )
    evaluation.metadata.update(artifact_metadata(record))
    for name, mean in record.challenger_means.items():
        metrics.log_metric(f"challenger.{name}", mean)
    for name, mean in record.champion_means.items():
        metrics.log_metric(f"champion.{name}", mean)
