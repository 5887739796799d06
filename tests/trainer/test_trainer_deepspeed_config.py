"""The generated DeepSpeed config: batch arithmetic, stages, and validation that catches what
DeepSpeed itself lets through (misspelt top-level keys)."""

from __future__ import annotations

import pytest

from g2rpo.errors import ConfigError
from g2rpo.training.deepspeed_config import (
    DeepSpeedSection,
    build_deepspeed_config,
    known_top_level_keys,
    validate_deepspeed_config,
)


def _build(section: DeepSpeedSection, world_size: int = 2, accumulation: int = 4, precision: str = "bf16") -> dict:
    return build_deepspeed_config(
        section, precision=precision, max_grad_norm=1.0, world_size=world_size, accumulation_steps=accumulation
    )


def test_stage2_bf16_config_arithmetic_and_fields():
    config = _build(DeepSpeedSection(enabled=True, zero_stage=2), world_size=2, accumulation=4)
    # 1 group per loss term × 4 terms per optimiser step × 2 ranks = 8
    assert config["train_batch_size"] == 8
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 1.0
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["stage"] == 2
    assert "stage3_gather_16bit_weights_on_model_save" not in config["zero_optimization"]
    assert config["zero_allow_untested_optimizer"] is True
    validate_deepspeed_config(config, world_size=2)


def test_stage3_gathers_16bit_weights_for_export_and_validates():
    config = _build(DeepSpeedSection(enabled=True, zero_stage=3, offload_param=True), world_size=16, accumulation=8)
    assert config["train_batch_size"] == 128
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert config["zero_optimization"]["offload_param"] == {"device": "cpu"}
    validate_deepspeed_config(config, world_size=16)


def test_misspelt_top_level_key_is_reported_with_suggestion():
    section = DeepSpeedSection(enabled=True, extra={"gradient_clippping": 0.5})
    config = _build(section)
    with pytest.raises(ConfigError) as info:
        validate_deepspeed_config(config, world_size=2)
    message = str(info.value)
    assert "gradient_clippping" in message
    assert "did you mean gradient_clipping" in message


def test_known_keys_come_from_deepspeeds_parser():
    keys = known_top_level_keys()
    for key in ("train_batch_size", "gradient_clipping", "bf16", "zero_optimization", "optimizer"):
        assert key in keys
    assert "gradient_clippping" not in keys


def test_batch_arithmetic_mismatch_is_reported():
    config = _build(DeepSpeedSection(enabled=True), world_size=2, accumulation=4)
    with pytest.raises(ConfigError) as info:
        validate_deepspeed_config(config, world_size=3)  # 8 != 1 × 4 × 3
    assert "1 × 4 × 3 = 12" in str(info.value)


def test_deepspeed_parser_rejects_unknown_zero_key_and_bf16_with_fp16():
    bad_zero = _build(DeepSpeedSection(enabled=True, extra={"zero_optimization": {"stagee": 2}}))
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        validate_deepspeed_config(bad_zero, world_size=2)
    both = _build(DeepSpeedSection(enabled=True, extra={"fp16": {"enabled": True}}))
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        validate_deepspeed_config(both, world_size=2)


def test_extra_merges_into_generated_sections():
    config = _build(DeepSpeedSection(enabled=True, extra={"zero_optimization": {"allgather_bucket_size": 1000}}))
    assert config["zero_optimization"]["allgather_bucket_size"] == 1000
    assert config["zero_optimization"]["stage"] == 2
    validate_deepspeed_config(config, world_size=2)


def test_section_cross_checks():
    with pytest.raises(ValueError, match="offload_param"):
        DeepSpeedSection(zero_stage=2, offload_param=True)
    with pytest.raises(ValueError, match="offload_optimizer"):
        DeepSpeedSection(zero_stage=0, offload_optimizer=True)
