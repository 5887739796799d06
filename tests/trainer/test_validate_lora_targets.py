"""``validate`` checks LoRA target modules against the model's module names (issue 43): ``[to_qq]``
and ``[norm1]`` passed, and ``train`` failed later at set-up — on a cluster, after the pods started."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from g2rpo.cli import main

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _validate(model: Path, *overrides: str) -> int:
    return main(["validate", "--config", str(CONFIG), f"model.path={model}", "model.create_tiny=false", *overrides])


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (
            "[to_qq]",
            "train.lora.target_modules=['to_qq']: no module of the transformer matches 'to_qq' (close: to_q",
        ),
        (
            "[to_q, norm1]",
            "train.lora.target_modules=['to_q', 'norm1']: LoRA adapts Linear layers only: 'norm1' matches "
            "AdaLayerNormZero",
        ),
    ],
)
def test_validate_refuses_targets_the_model_lacks(tiny_flux_dir, targets, message, capsys):
    assert _validate(tiny_flux_dir, "train.lora.enabled=true", f"train.lora.target_modules={targets}") == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_validate_passes_the_default_targets_and_ignores_them_without_lora(tiny_flux_dir, capsys):
    started = time.monotonic()
    assert _validate(tiny_flux_dir, "train.lora.enabled=true") == 0, capsys.readouterr().err
    assert time.monotonic() - started < 60  # the skeleton is built on the meta device: no weights are read
    assert _validate(tiny_flux_dir, "train.lora.target_modules=[to_qq]") == 0  # LoRA off: the targets are unused
