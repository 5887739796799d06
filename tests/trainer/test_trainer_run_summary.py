"""The run summary is a typed record whose JSON (``g2rpo train`` prints it, ``--summary-json`` writes it, the
train task reads a torchrun's back) keeps the keys, their order and their nesting the trainer's dict had."""

from __future__ import annotations

import json

from g2rpo.training.trainer import RunSummary
from g2rpo.training.validation import CurvePoint, ValidationCost, ValidationSummary

VALIDATION = ValidationSummary(
    curve=[
        CurvePoint(iteration=0, objective=-7.05, breached=[], means={"jpeg_compressibility": -7.05, "sharpness": 0.02}),
        CurvePoint(iteration=2, objective=-7.04, breached=["sharpness"], means={"jpeg_compressibility": -7.04}),
    ],
    selected_iteration=2,
    selection_reason="every validation breached the out-of-domain tolerance",
    within_tolerance=False,
    early_stop=None,
    exported_best=True,
    cost=ValidationCost(validation_forwards=24, validation_seconds=0.5, training_forwards=168, training_seconds=2.5),
)


def _summary(validation: ValidationSummary | None) -> RunSummary:
    return RunSummary(
        iterations=3,
        resumed_at=1,
        first_reward=-7.3,
        last_reward=None,
        output_dir="/runs/a",
        export="/runs/a/export",
        world_size=2,
        backend="torch",
        prompts={"read": 8, "unique": 7, "duplicates": 1},
        validation=validation,
    )


def test_the_summary_json_has_the_keys_of_the_trainers_dict_in_its_order():
    data = json.loads(json.dumps(_summary(VALIDATION).to_json()))
    assert list(data) == [
        "iterations", "resumed_at", "first_reward", "last_reward", "output_dir", "export", "world_size", "backend",
        "prompts", "validation",
    ]  # fmt: skip
    block = data["validation"]
    assert list(block) == [
        "curve", "selected_iteration", "selection_reason", "within_tolerance", "early_stop", "exported_best", "cost",
    ]  # fmt: skip
    assert block["curve"][1] == {
        "iteration": 2, "objective": -7.04, "breached": ["sharpness"], "means": {"jpeg_compressibility": -7.04}
    }  # fmt: skip
    assert list(block["cost"]) == ["validation_forwards", "validation_seconds", "training_forwards", "training_seconds"]
    assert data["prompts"] == {"read": 8, "unique": 7, "duplicates": 1} and data["last_reward"] is None
    assert json.loads(json.dumps(_summary(None).to_json()))["validation"] is None


def test_a_summary_read_back_from_its_json_is_the_same_summary():
    for summary in (_summary(VALIDATION), _summary(None)):
        assert RunSummary.from_json(json.loads(json.dumps(summary.to_json()))) == summary
