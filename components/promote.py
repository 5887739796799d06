"""Component **promote**: make the decided challenger champion (:func:`g2rpo.steps.gate.promote_challenger`)."""

from kfp import dsl
from kfp.dsl import Artifact, Input

from components.images import G2RPO_IMAGE


@dsl.component(base_image=G2RPO_IMAGE, install_kfp_package=False)
def promote(
    decision: Input[Artifact],
    evaluation: Input[Artifact],
    registry_uri: str,
    gates_uri: str,
    source_run: str,
    pushgateway_url: str,
) -> int:
    """The champion's version after the alias move (pushed to ``pushgateway_url`` when one is given)."""
    # KFP ships this function's source alone, so its imports live inside it.
    from g2rpo.steps.gate import promote_challenger

    result = promote_challenger(
        decision.path,
        evaluation.path,
        registry_uri=registry_uri,
        gates_uri=gates_uri,
        reason=f"pipeline run {source_run}",
        pushgateway_url=pushgateway_url,
    )
    return result.champion
