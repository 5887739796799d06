"""The shared config loader: YAML + key=value overrides, every problem reported at once."""

from __future__ import annotations

import socket

import pydantic
import pytest
from pydantic import Field, model_validator

from g2rpo.config import PROBLEM_SEPARATOR, Section, config_hash, deep_merge, describe, load_config, parse_overrides
from g2rpo.errors import ConfigError, G2RPOError, problem


class Inner(Section):
    group_size: int = Field(12, ge=2, description="branches per group (G); at least 2")
    strides: list[int] = Field([1, 2, 3], description="finishing strides (Λ)")

    @model_validator(mode="after")
    def _check(self):
        if not self.strides:
            raise ValueError(problem("inner.strides", self.strides, "give at least one stride, e.g. [1, 2, 3]"))
        return self


class Outer(Section):
    inner: Inner = Field(default_factory=Inner, description="the inner section")
    name: str = Field("run", description="run name")
    steps: int = Field(10, ge=1, description="iterations")


def test_defaults_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("inner:\n  group_size: 4\nname: from-file\n")
    cfg = load_config(Outer, f, ["inner.strides=[1, 2]", "steps=3"])
    assert cfg.inner.group_size == 4
    assert cfg.inner.strides == [1, 2]
    assert cfg.name == "from-file"
    assert cfg.steps == 3
    # frozen: configs are values
    with pytest.raises(pydantic.ValidationError):
        cfg.steps = 5  # type: ignore[misc]


def test_every_problem_reported_at_once(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("inner:\n  group_size: 1\n  strides: []\n  stride: 2\nsteps: 0\nnmae: x\n")
    with pytest.raises(ConfigError) as info:
        load_config(Outer, f)
    text = str(info.value)
    problems = info.value.problems
    # group_size < 2 and steps < 1 (field checks) and the two unknown keys; the cross-field check
    # on strides only runs once field checks pass, so it is not among them.
    assert len(problems) == 4, problems
    assert "inner.group_size=1" in text and "branches per group" in text
    assert "steps=0" in text
    assert "inner.stride: unknown key" in text and "valid keys here: group_size, strides" in text
    assert "nmae: unknown key" in text and "name" in text


def test_cross_field_problem_names_field_value_fix():
    with pytest.raises(ConfigError) as info:
        load_config(Outer, None, {"inner": {"strides": []}})
    assert "inner.strides=[]: give at least one stride" in str(info.value)


class Pair(Section):
    low: int = Field(0, description="lower bound")
    high: int = Field(1, description="upper bound")
    step: int = Field(1, description="step")

    @model_validator(mode="after")
    def _check(self):
        problems = []
        if self.low >= self.high:
            problems.append(problem("high", self.high, f"must exceed low={self.low}"))
        if self.step > self.high - self.low:
            problems.append(problem("step", self.step, f"must fit in high - low = {self.high - self.low}"))
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


def test_two_cross_field_problems_count_as_two():
    # one validator raises both (pydantic keeps one error per validator); the loader lists and counts them apart
    with pytest.raises(ConfigError) as info:
        load_config(Pair, None, {"low": 3, "high": 2, "step": 4})
    assert info.value.problems == ["high=2: must exceed low=3", "step=4: must fit in high - low = -1"]
    assert str(info.value).startswith("2 configuration problem(s)")


def test_bad_override_syntax_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_overrides(["group_size"])
    f = tmp_path / "bad.yaml"
    f.write_text("a: [1, 2\n")
    with pytest.raises(G2RPOError, match="not valid YAML"):
        load_config(Outer, f)
    with pytest.raises(G2RPOError, match="does not exist"):
        load_config(Outer, tmp_path / "missing.yaml")


def test_config_hash_covers_only_chosen_sections():
    a = load_config(Outer, None, ["steps=3"])
    b = load_config(Outer, None, ["steps=7"])
    c = load_config(Outer, None, ["inner.group_size=5"])
    assert config_hash(a, ["inner"]) == config_hash(b, ["inner"])
    assert config_hash(a, ["inner"]) != config_hash(c, ["inner"])
    assert config_hash(a) != config_hash(b)


class Moved(Section):
    """A section that knows where a former key went, and checks its own fields together."""

    low: int = Field(1, description="lower bound")
    high: int = Field(2, description="upper bound")

    @classmethod
    def unknown_key_fix(cls, key: str, path: str) -> str | None:
        return f"{key} moved: write it as {path}.high" if key == "top" else None

    @model_validator(mode="after")
    def _ordered(self):
        if self.low > self.high:
            raise ValueError(problem("low", self.low, f"must be ≤ high ({self.high})"))
        return self


class Holder(Section):
    moved: Moved = Field(default_factory=Moved, description="a section with a moved key")


def test_unknown_key_gets_the_sections_own_fix_and_problems_get_its_path():
    with pytest.raises(ConfigError) as info:
        load_config(Holder, None, ["moved.top=3", "moved.hgih=3"])
    assert info.value.problems == [
        "moved.top: unknown key; remove it or fix the spelling (valid keys here: high, low); top moved: "
        "write it as moved.high",
        "moved.hgih: unknown key; remove it or fix the spelling (valid keys here: high, low); did you mean moved.high?",
    ]
    # A section's own check names its field; the loader puts the section's path in front of it.
    with pytest.raises(ConfigError) as info:
        load_config(Holder, None, ["moved.low=5"])
    assert info.value.problems == ["moved.low=5: must be ≤ high (2)"]
    with pytest.raises(ConfigError) as info:
        load_config(Moved, None, ["low=5"])
    assert info.value.problems == ["low=5: must be ≤ high (2)"]


def test_describe_lists_nested_fields_with_help():
    lines = describe(Outer)
    assert any(line.startswith("inner.group_size (integer ≥ 2; default 12): branches per group") for line in lines)


def test_describe_names_types_in_words_with_their_bounds_and_allowed_values():
    """`g2rpo config describe` on the run config: no validator internals (Annotated, FieldInfo, bare
    Optional or Literal), the allowed values listed, defaults as YAML writes them."""
    from g2rpo.training.run_config import RunConfig

    lines = {line.split(" (", 1)[0]: line for line in describe(RunConfig)}
    assert not [
        line for line in lines.values() if any(w in line for w in ("Annotated", "FieldInfo", "Optional", "Literal"))
    ]
    assert lines["algorithm.g2rpo.branch_steps"].startswith(
        "algorithm.g2rpo.branch_steps (list of integers ≤ 1000, or null; default null): "
    )
    assert lines["algorithm.log_prob_reduce"].startswith(
        'algorithm.log_prob_reduce (one of "mean", "sum"; default "mean")'
    )
    assert lines["algorithm.train_micro_batch"].startswith("algorithm.train_micro_batch (integer ≥ 1, ≤ ")
    assert "or null; default null)" in lines["algorithm.train_micro_batch"]
    assert lines["algorithm.unbiased_std"].startswith("algorithm.unbiased_std (true or false; default true)")
    assert lines["rewards.models"].startswith(
        'rewards.models (list of RewardModelConfig sections, at least 1 item; default [{"name": "hps_v21", "weight": 1.0}'
    )
    assert lines["train.validation.max_regression"].startswith(
        "train.validation.max_regression (mapping of string to number; default {})"
    )


def test_cli_help_and_user_error_exit_code(capsys):
    from g2rpo.cli import main

    assert main([]) == 0
    assert "G²RPO" in capsys.readouterr().out


def test_each_commands_line_in_the_help_names_all_its_verbs():
    from g2rpo.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "model the tiny test model" in text
    for verb in ("init-tiny", "pretrain-shapes", "pretrain-shapes-rewards", "quality-shapes", "check"):
        assert f" {verb}," in text or f" {verb}]" in text or f"[{verb}," in text, verb
    assert "[compile, submit, schedule, run-local]" in text and "[describe, show]" in text


def test_every_options_help_says_its_default_at_most_once_and_never_none():
    import argparse

    from g2rpo.cli import build_parser

    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    said = 0
    for parser in parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS):
                continue
            text = formatter._expand_help(action)
            said += "(default" in text
            assert "(default: None)" not in text and text.count("(default") <= 1, (parser.prog, text)
    assert said > 20  # the check read the options' help


def test_network_outside_loopback_is_refused():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(RuntimeError, match="only use loopback"):
            s.connect(("192.0.2.1", 80))  # TEST-NET-1: never routed; refused before any packet
    finally:
        s.close()


def test_cli_closed_pipe_is_not_a_traceback():
    import subprocess
    import sys

    # `g2rpo rewards list | head -0`: the reader is gone before the command prints anything.
    proc = subprocess.Popen(
        [sys.executable, "-m", "g2rpo", "rewards", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err.decode(), err.decode()
    assert proc.returncode == 141


def test_deep_merge_merges_sections_and_replaces_everything_else():
    base = {"model": {"path": "m", "lora": {"rank": 8, "alpha": 16}}, "strides": [1, 2, 3], "name": "run"}
    over = {"model": {"lora": {"rank": 4}}, "strides": [5], "name": {"new": 1}, "extra": None}
    merged = deep_merge(base, over)
    assert merged == {
        "model": {"path": "m", "lora": {"rank": 4, "alpha": 16}},  # nested dicts merge key by key
        "strides": [5],  # a list replaces, it is not concatenated or merged by position
        "name": {"new": 1},  # a section over a value replaces it
        "extra": None,
    }
    assert deep_merge(over, {"model": "flat"})["model"] == "flat"  # a value over a section replaces it too
    # neither input changes
    assert base["model"]["lora"] == {"rank": 8, "alpha": 16} and base["strides"] == [1, 2, 3]
    assert over["model"] == {"lora": {"rank": 4}}
