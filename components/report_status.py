"""Component **report status**, the pipeline's exit task (:func:`g2rpo.steps.report_status.report_status`)."""

from kfp import dsl
from kfp.dsl import Artifact, Output

from components.images import G2RPO_IMAGE


@dsl.component(base_image=G2RPO_IMAGE, install_kfp_package=False)
def report_status(status: dsl.PipelineTaskFinalStatus, pushgateway_url: str, record: Output[Artifact]):
    """Record how the run ended (and push it to ``pushgateway_url`` when one is given)."""
    # KFP ships this function's source alone, so its imports live inside it.
    from g2rpo.steps.report_status import report_status as report

    report(
        status.pipeline_job_resource_name,
        status.state,
        record.path,
        error=status.error_message or "",
        task=status.pipeline_task_name or "",
        pushgateway_url=pushgateway_url,
    )
