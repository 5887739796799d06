"""The run-config commands: validate lists every problem at once; describe/show; the config hash.
(The prepared GPU benchmark's tests are in tests/benchmarks/.)"""

from __future__ import annotations

import pytest
from trainer_testlib import REPO

from g2rpo.cli import main
from g2rpo.config import load_config
from g2rpo.training.run_config import RunConfig, resume_hash

TINY = REPO / "configs" / "tiny-cpu.yaml"


def test_validate_lists_every_problem_at_once(capsys):
    code = main(
        [
            "validate",
            "--world-size",
            "2",
            "--config",
            str(TINY),
            "algorithm.group_size=1",  # schema: G ≥ 2
            "model.lr=3",  # unknown key
            "rewards.models=[{name: jpeg}]",  # unknown reward name
            "train.prompts_per_iteration=3",  # not divisible by 2 ranks
            "deepspeed.enabled=true",
            "deepspeed.extra={gradient_clippping: 1}",  # misspelt top-level DeepSpeed key
            "data.prompts=/nonexistent/prompts.txt",  # missing file
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "6 configuration problem(s)" in err
    for needle in (
        "algorithm.group_size",
        "model.lr",
        "jpeg",
        "train.prompts_per_iteration=3",
        "did you mean gradient_clipping",
        "data.prompts",
    ):
        assert needle in err, needle


def _listed(err: str) -> list[str]:
    """The problem lines of a printed ConfigError, after checking the header counts them."""
    lines = [line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - ")]
    assert f"{len(lines)} configuration problem(s)" in err, err
    return lines


def test_validate_reports_field_and_cross_field_problems_together(capsys):
    # A field problem (G ≥ 2) no longer hides the checks that span sections, and each of those
    # counts once in the header.
    code = main(
        ["validate", "--config", str(TINY), "algorithm.group_size=1", "train.precision=bf16", "output.export_ema=true"]
    )
    listed = _listed(capsys.readouterr().err)
    assert code == 2 and len(listed) == 3, listed
    assert listed[0].startswith("algorithm.group_size=1")
    assert listed[1].startswith("train.precision='bf16'") and "deepspeed.enabled=true" in listed[1]
    assert listed[2] == "output.export_ema=True: needs train.ema.enabled=true"
    # two cross-field problems alone: "2 configuration problem(s)", two lines
    code = main(["validate", "--config", str(TINY), "train.precision=bf16", "output.export_ema=true"])
    assert code == 2 and len(_listed(capsys.readouterr().err)) == 2


def test_an_empty_config_file_says_it_is_empty(tmp_path, capsys):
    for name, text in (("empty.yaml", ""), ("comments.yaml", "# nothing set yet\n")):
        path = tmp_path / name
        path.write_text(text)
        assert main(["validate", "--config", str(path), f"model.path={tmp_path}", "data.prompts=p.txt"]) == 2
        listed = _listed(capsys.readouterr().err)
        assert listed[0].startswith(f"config file {str(path)!r} is empty"), listed
        assert main(["train", "--config", str(path)]) == 2
        assert "is empty" in capsys.readouterr().err
    # `{}` says "every default" on purpose: no such problem
    explicit = tmp_path / "defaults.yaml"
    explicit.write_text("{}\n")
    assert main(["validate", "--config", str(explicit)]) == 2
    assert "is empty" not in capsys.readouterr().err


def test_validate_ok_prints_the_hash(capsys):
    assert main(["validate", "--config", str(TINY)]) == 0
    config = load_config(RunConfig, TINY)
    assert resume_hash(config) in capsys.readouterr().out


def test_bf16_without_deepspeed_is_refused_with_the_fix():
    from g2rpo.errors import ConfigError

    with pytest.raises(ConfigError, match="deepspeed.enabled=true"):
        load_config(RunConfig, TINY, ["train.precision=bf16"])


def test_lora_dropout_is_refused_not_silently_ignored():
    # The policy runs in eval mode (diffusers loads it so), where a LoRA dropout does nothing.
    from g2rpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.lora.dropout=0.1: must be 0: the policy runs in eval mode"):
        load_config(RunConfig, TINY, ["train.lora.enabled=true", "train.lora.dropout=0.1"])
    assert load_config(RunConfig, TINY, ["train.lora.enabled=true"]).train.lora.dropout == 0.0


def test_config_hash_covers_model_algorithm_data_only():
    base = load_config(RunConfig, TINY)
    same = load_config(RunConfig, TINY, ["train.iterations=99", "output.dir=/elsewhere", "train.learning_rate=1"])
    assert resume_hash(base) == resume_hash(same)
    for change in ("algorithm.group_size=3", "model.height=128", "data.max_sequence_length=16"):
        assert resume_hash(load_config(RunConfig, TINY, [change])) != resume_hash(base), change


def test_describe_and_show(capsys):
    assert main(["config", "describe"]) == 0
    text = capsys.readouterr().out
    assert "algorithm.g2rpo.learning_rate (number > 0.0; default 2e-06)" in text and "deepspeed.zero_stage" in text
    assert "algorithm.diffusionnft.beta (number > 0.0; default 1.0)" in text
    assert "algorithm.branchgrpo.branch_factor (integer ≥ 2, ≤ 2147483647; default 2)" in text
    assert main(["config", "show", "--config", str(TINY), "train.iterations=5"]) == 0
    shown = capsys.readouterr().out
    assert "iterations: 5" in shown and "zero_stage: 2" in shown


def test_example_configs_are_valid():
    h200 = load_config(RunConfig, REPO / "configs" / "flux-dev-h200.yaml")
    assert h200.deepspeed.enabled and h200.train.precision == "bf16"
    assert h200.learning_rate == 2e-6 and h200.algorithm.group_size == 12 and h200.algorithm.num_steps == 16


def test_bad_inputs_are_listed_with_fixes(tmp_path, capsys):
    # a partial model directory (model_index.json only) and a prompt file with an empty line and
    # a non-UTF-8 line: validate names each, and nothing is written
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text(
        '{"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}'
    )
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"a cat\n\n\xff\xfe broken\n")
    out = tmp_path / "run"
    code = main(
        [
            "validate",
            "--config",
            str(TINY),
            f"model.path={model}",
            "model.create_tiny=false",
            f"data.prompts={prompts}",
            f"output.dir={out}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "model.path" in err and "transformer" in err
    assert "data.prompts" in err and "prompts.txt:2: empty prompt" in err and "prompts.txt:3: not UTF-8" in err
    assert not out.exists()


def test_cross_section_checks_are_listed_together():
    from g2rpo.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(
            RunConfig,
            TINY,
            [
                "train.lora.enabled=true",
                "deepspeed.enabled=true",
                "deepspeed.zero_stage=3",
                "train.ema.enabled=true",
                "output.export_ema=false",
                "train.precision=fp32",
            ],
        )
    message = str(info.value)
    assert "LoRA" in message and "EMA is kept on full weights" in message
