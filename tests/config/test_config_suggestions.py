"""Errors that guess: every "unknown" error names the closest valid key or name, and `validate`
reports every problem, unknown keys included, at once."""

from __future__ import annotations

import pytest

from g2rpo.cli import main
from g2rpo.errors import G2RPOError, closest
from g2rpo.rewards.specs import get_spec
from g2rpo.steps.train_task import run_config_for

CONFIG = "configs/tiny-cpu.yaml"


def _validate(capsys, *argv: str) -> str:
    assert main(["validate", *argv]) == 2
    return capsys.readouterr().err


def test_closest_is_difflibs_nearest_and_none_when_nothing_is_near():
    assert closest("gruop_size", ["group_size", "num_steps"]) == "group_size"
    assert closest("zzz", ["group_size", "num_steps"]) is None


def test_an_unknown_key_names_the_closest_valid_key_section_qualified(capsys):
    err = _validate(capsys, "--config", CONFIG, "group_size=abc", "algorithm.gruop_size=3", "train.iteratons=2")
    # a key of another section: the qualified path where it lives
    assert "  - group_size: unknown key" in err and "did you mean algorithm.group_size?" in err
    # a misspelt key of its own section
    assert "  - algorithm.gruop_size: unknown key" in err
    assert err.count("did you mean algorithm.group_size?") == 2
    assert "  - train.iteratons: unknown key" in err and "did you mean train.iterations?" in err


def test_unknown_names_and_choices_name_the_closest(capsys):
    err = _validate(
        capsys, "--config", CONFIG, "rewards.models=[{name: pickscor}]", "algorithm.strategy=g2rop", "train.device=cpuu"
    )
    assert "name='pickscor': unknown reward (did you mean pickscore?); valid names: " in err
    assert "'g2rop' is not a strategy (did you mean g2rpo?)" in err
    assert "train.device='cpuu': Input should be 'auto', 'cpu' or 'cuda'; did you mean 'cpu'?" in err
    with pytest.raises(G2RPOError, match=r"unknown reward \(did you mean jpeg_compressibility\?\)"):
        get_spec("jpeg_compresibility")
    with pytest.raises(G2RPOError, match=r"unknown \(did you mean group_size\?\)"):
        run_config_for(CONFIG, {"gruop_size": 4}, base_model_uri="m", prompts="p.txt", output_dir="o")


def test_validate_reports_unknown_keys_beside_every_other_problem(tmp_path, capsys):
    config = tmp_path / "all-unknown.yaml"
    config.write_text("foo: 1\nbar:\n  baz: 2\n")
    err = _validate(capsys, "--config", str(config))
    # data.prompts' default fails as a whole section, which used to hide the unknown keys beside it
    assert "  - data.prompts='': set a prompt file" in err and "  - model.path='': set the directory" in err
    assert "  - foo: unknown key" in err and "  - bar: unknown key" in err


def test_a_model_path_that_does_not_exist_gets_no_download_hint_but_the_closest_folder(tmp_path, capsys):
    (tmp_path / "shapes-flux").mkdir()
    shapes = ["--config", "configs/shapes-cpu.yaml", "data.prompts=configs/tiny-prompts.txt"]
    err = _validate(capsys, *shapes, f"model.path={tmp_path / 'shapes-flx'}")
    assert f"model directory '{tmp_path / 'shapes-flx'}' does not exist: check the path" in err
    assert "(did you mean shapes-flux?)" in err
    assert "FLUX.1-dev" not in err and "huggingface-cli download" not in err
    err = _validate(capsys, *shapes, f"model.path={tmp_path / 'no' / 'such' / 'model'}")
    assert f"its nearest existing folder is '{tmp_path}'" in err and "FLUX.1-dev" not in err
