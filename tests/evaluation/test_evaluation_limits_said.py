"""``eval`` says the limits it applies to a prompt file (issue 43): duplicate prompts were dropped
and ``num_prompts=5`` on a 2-prompt set evaluated 2, without a word."""

from __future__ import annotations

import json

import pytest

from g2rpo.artifacts.storage import open_store
from g2rpo.config import load_config
from g2rpo.evaluation.artifact import read_prompt_set
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.steps.evaluate import evaluate


def _config(prompts, num_prompts):
    values = {
        "prompts": str(prompts),
        "num_prompts": num_prompts,
        "seeds": [0],
        "num_steps": 2,
        "rewards": {"models": [{"name": "jpeg_compressibility"}]},
        "device": "cpu",
    }
    return load_config(EvaluationConfig, None, values)


def test_duplicates_and_a_num_prompts_beyond_the_set_are_said(tiny_flux_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na red circle\n")
    output = tmp_path / "eval"
    evaluate(str(tiny_flux_dir), _config(prompts, 5), str(output))
    err = capsys.readouterr().err
    line = (
        f"g2rpo eval: 1 duplicate prompt(s) in {prompts} dropped (2 unique of 3); "
        "num_prompts=5 is more than the 2 unique prompt(s) there; evaluating 2 prompt(s)"
    )
    assert line in err, err
    document = json.loads(open_store(str(output)).get_bytes("prompts.json")[0])
    assert [p["prompt"] for p in document["prompts"]] == ["a red circle", "a blue square"]


@pytest.mark.parametrize(
    ("text", "num_prompts", "notice"),
    [
        ("a\nb\nc\n", 2, None),  # fewer than the set: asked for, nothing to say
        ("a\nb\nc\n", None, None),
        ("a\nb\n", 3, "num_prompts=3 is more than the 2 unique prompt(s) there; evaluating 2 prompt(s)"),
        ("a\na\nb\n", 1, "1 duplicate prompt(s) in {uri} dropped (2 unique of 3); evaluating 1 prompt(s)"),
    ],
)
def test_the_notice_names_each_limit(tmp_path, text, num_prompts, notice):
    path = tmp_path / "p.txt"
    path.write_text(text)
    said = read_prompt_set(str(path), num_prompts).notice()
    assert said == (notice.format(uri=path) if notice else None)
