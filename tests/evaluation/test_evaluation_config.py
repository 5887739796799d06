"""EvaluationConfig: every bad value is reported with its field, the value and the fix."""

from __future__ import annotations

import pytest
import torch

from g2rpo.config import ConfigError, load_config
from g2rpo.core import flux_sigmas, static_shift_sigmas
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.policy import load_policy, sigma_grid


def _load(**values) -> EvaluationConfig:
    return load_config(EvaluationConfig, None, {"prompts": "p.txt", **values})


def test_defaults_are_three_seeds_on_the_flux_grid():
    config = _load()
    assert config.seeds == [0, 1, 2] and config.num_steps == 16 and config.grid == "flux"
    assert config.height is None and config.width is None  # the model's own size
    assert [m.name for m in config.rewards.models] == ["hps_v21", "clip"]  # the run config's default rewards


def test_every_problem_is_reported_at_once_with_field_value_and_fix():
    with pytest.raises(ConfigError) as info:
        _load(height=30, width=40, seeds=[0, 1, 1])
    message = str(info.value)
    assert "height=30: must be a multiple of 16" in message and "width=40: must be a multiple of 16" in message
    assert "seeds=[0, 1, 1]: list each seed once" in message
    # type and range errors come first (pydantic checks fields before the cross-field checks)
    with pytest.raises(ConfigError) as info:
        _load(num_steps=0, micro_batch=0)
    message = str(info.value)
    assert "num_steps=0: Input should be greater than or equal to 1" in message and "micro_batch=0" in message


def test_missing_prompts_and_unknown_keys_name_the_fix():
    with pytest.raises(ConfigError) as info:
        load_config(EvaluationConfig, None, {"num_step": 4})
    message = str(info.value)
    assert "prompts: required but not set" in message
    assert "num_step: unknown key" in message and "num_steps" in message  # the valid keys are listed


def test_rewards_section_is_the_run_configs_own():
    with pytest.raises(ConfigError) as info:
        _load(rewards={"models": [{"name": "jpeg"}]})
    assert "name='jpeg': unknown reward" in str(info.value) and "jpeg_compressibility" in str(info.value)


def test_empty_seed_list_is_refused():
    with pytest.raises(ConfigError, match="seeds"):
        _load(seeds=[])


def test_sigma_grid_is_the_algorithms_grid():
    assert torch.equal(sigma_grid(_load(num_steps=4), 16), flux_sigmas(4, 16))
    assert torch.equal(sigma_grid(_load(num_steps=4, grid="static_shift", shift=2.0), 16), static_shift_sigmas(4, 2.0))


def test_a_folder_that_is_no_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(G2RPOError) as info:
        load_policy(str(tmp_path), _load(device="cpu"))
    assert "neither a FluxPipeline folder" in str(info.value) and "output.dir/export" in str(info.value)
    with pytest.raises(G2RPOError, match="no such folder"):
        load_policy(str(tmp_path / "missing"), _load(device="cpu"))
