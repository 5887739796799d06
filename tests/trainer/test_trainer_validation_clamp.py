"""More validation prompts than the training split holds: every prompt is validated, and the run says so
with both counts (issue 30: limits applied without a word)."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_testlib import PROMPTS, tiny_overrides

from g2rpo.config import load_config
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import Trainer
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("clamp_tiny_flux"))


def test_validation_on_more_prompts_than_exist_is_announced(tiny_model, tmp_path, capsys):
    available = len([line for line in PROMPTS.read_text().splitlines() if line.strip()])
    validation = {"enabled": True, "every": 1, "num_prompts": available + 5, "seeds": [0], "micro_batch": 4}
    config = load_config(
        RunConfig, None, tiny_overrides(tiny_model, tmp_path / "out", **{"train.validation": validation})
    )
    trainer = Trainer(config).setup()
    try:
        assert len(trainer.validator.prompt_indices) == len(trainer.prompt_set.prompts)
        err = capsys.readouterr().err
        assert (
            f"num_prompts = {available + 5} but the training split holds {len(trainer.prompt_set.prompts)} prompts"
            in err
        )
    finally:
        trainer.release_claims()
