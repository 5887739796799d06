"""Component **decide**: register the challenger and apply the promotion gates (:func:`g2rpo.steps.gate.decide_challenger`)."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Input, Model, Output

from components.images import G2RPO_IMAGE


@dsl.component(base_image=G2RPO_IMAGE, install_kfp_package=False)
def decide(
    trained: Input[Model],
    evaluation: Input[Artifact],
    registry_uri: str,
    model_name: str,
    gates_uri: str,
    source_run: str,
    pushgateway_url: str,
    decision: Output[Artifact],
    report: Output[HTML],
) -> bool:
    """True when the registered challenger passes the gates (the pipeline then runs **promote**); the
    decision report (gates, paired differences, the same prompts' images side by side) goes to
    ``report``, and the decision to ``pushgateway_url`` when one is given."""
    # KFP ships this function's source alone, so its imports live inside it.
    from g2rpo.steps.gate import decide_challenger
    from g2rpo.steps.records import artifact_metadata

    record = decide_challenger(
        trained.path,
        evaluation.path,
        registry_uri=registry_uri,
        model=model_name,
        gates_uri=gates_uri,
        source_run=source_run,
        output_dir=decision.path,
        report_path=report.path,
        pushgateway_url=pushgateway_url,
    )
    decision.metadata.update(artifact_metadata(record))
    return record.passed
