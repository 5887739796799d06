"""Validation says what it does: more validation prompts than the training split holds are all validated,
and the run says so with both counts (issue 30: limits applied without a word); the baseline validation
is said before its seconds start (issue 42)."""

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


def test_the_baseline_validation_is_said_before_it_starts(tiny_model, tmp_path, capsys):
    """Iteration 0's validation takes seconds on a CPU before the first record: the run says it, with its
    progress bar (before the bar starts) and without one (as make demo's train task runs)."""
    validation = {"enabled": True, "every": 1, "num_prompts": 3, "seeds": [0, 1], "micro_batch": 4}
    said = "g2rpo train: validating iteration 0, the weights before any update: 3 prompt(s) × 2 seed(s) …\n"
    for progress in (True, False):
        overrides = tiny_overrides(tiny_model, tmp_path / f"out-{progress}", **{"train.validation": validation})
        overrides["train"] |= {"iterations": 1, "progress": progress}
        Trainer(load_config(RunConfig, None, overrides)).run()
        err = capsys.readouterr().err
        assert err.count(said) == 1, err
        if progress:
            assert err.index(said) < err.index("g2rpo train:   0%")
    # a run without validation has none to say
    overrides = tiny_overrides(tiny_model, tmp_path / "none", **{"train.iterations": 1})
    Trainer(load_config(RunConfig, None, overrides)).run()
    assert "validating iteration 0" not in capsys.readouterr().err
