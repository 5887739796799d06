"""Component **prepare data**: a prompt file in, the train/test split out (:func:`g2rpo.steps.prepare.prepare_data`)."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components.images import G2RPO_IMAGE


@dsl.component(base_image=G2RPO_IMAGE, install_kfp_package=False)
def prepare_data(prompts_uri: str, test_size: int, seed: int, data: Output[Dataset]):
    """Validate, dedupe and split the prompts at ``prompts_uri`` into ``data`` (train.jsonl, test.jsonl)."""
    # KFP ships this function's source alone, so its imports live inside it.
    from g2rpo.steps.prepare import prepare_data as prepare

    result = prepare(prompts_uri, data.path, test_size=test_size, seed=seed)
    data.metadata.update(
        {"read": result.read, "duplicates": result.duplicates, "train": result.train, "test": result.test}
    )
