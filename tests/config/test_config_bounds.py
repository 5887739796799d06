"""Every number of every config section is bounded: a property test over the schema.

The schema is walked, not listed: every :class:`~g2rpo.config.Section` subclass the package defines
(records written by the tasks themselves excepted, see ``WRITTEN_BY_THE_CODE``), every field, every
number inside it (``int | None``, ``list[int]``, ``tuple[float, float]``, ``dict[str, float]``). A new
section or field is checked without touching this file. At each number the section must refuse, with
an error located at that field:

- a float that is not finite (``inf``, ``-inf``, ``nan``): the optimiser, the σ grid and the gates
  cannot use one, and it otherwise surfaces much later as "NaN/inf pixels" or a torch traceback;
- an int past 64 bits either way (``2**64``, ``-2**64``): ``torch.Generator.manual_seed`` takes
  ``[-2**63, 2**64 - 1]`` and raises ``ValueError: Overflow`` beyond it — after the model is loaded.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import types
import typing
from typing import Annotated, Any

import pytest
from pydantic import ValidationError

import g2rpo
from g2rpo.config import SEED_MAX, Section
from g2rpo.training.run_config import load_run_config

# Records the tasks write and read back (never typed by a user); their numbers are measured values.
WRITTEN_BY_THE_CODE = {"TrainRecord", "CandidatesRecord", "DecisionRecord", "RunStatus"}
BAD_FLOATS = (math.inf, -math.inf, math.nan)
BAD_INTS = (2**64, -(2**64))


def _sections() -> list[type[Section]]:
    for module in pkgutil.walk_packages(g2rpo.__path__, "g2rpo."):
        if module.name.rpartition(".")[2] not in ("__main__", "cli"):
            importlib.import_module(module.name)
    importlib.import_module("g2rpo.steps.placement")
    found, todo = set(), [Section]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    ours = (c for c in found if c.__module__.startswith(("g2rpo.", "pipelines.")))  # not other tests' sections
    return sorted((c for c in ours if c.__name__ not in WRITTEN_BY_THE_CODE), key=lambda c: c.__qualname__)


def _numbers(annotation: Any) -> list[tuple[type, Any]]:
    """(int or float, a function putting one number where the annotation holds it) for every number inside."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (int, float):
        return [(annotation, lambda v: v)]
    if origin is Annotated:
        return _numbers(args[0])
    if origin in (typing.Union, types.UnionType):
        return [n for arg in args for n in _numbers(arg)]
    if origin is list:
        return [(kind, lambda v, put=put: [put(v)]) for kind, put in _numbers(args[0])]
    if origin is tuple:
        width = len(args)
        return [(kind, lambda v, put=put: tuple(put(v) for _ in range(width))) for kind, put in _numbers(args[0])]
    if origin is dict:
        return [(kind, lambda v, put=put: {"key": put(v)}) for kind, put in _numbers(args[1])]
    return []


def _numeric_fields() -> list[tuple[str, type[Section], str, list[tuple[type, Any]]]]:
    out = []
    for cls in _sections():
        for name, info in cls.model_fields.items():
            numbers = _numbers(info.annotation)
            if numbers:
                out.append((f"{cls.__module__}.{cls.__qualname__}.{name}", cls, name, numbers))
    return out


FIELDS = _numeric_fields()


def test_the_walk_finds_the_sections_and_fields_it_should():
    names = {dotted for dotted, *_ in FIELDS}
    # One field of each kind of container, so a broken walk cannot pass by finding nothing.
    for expected in (
        "g2rpo.training.run_config.TrainSection.learning_rate",  # float | None
        "g2rpo.training.run_config.TrainSection.adam_betas",  # tuple[float, float]
        "g2rpo.evaluation.config.EvaluationConfig.seeds",  # list[int]
        "g2rpo.artifacts.promotion.Gates.bootstrap_seed",
        "g2rpo.steps.placement.Timeouts.train",
    ):
        assert expected in names
    assert len(FIELDS) > 60


def _refused_at(cls: type[Section], name: str, value: Any) -> bool:
    """Whether the section refuses ``value`` for field ``name`` with an error located at that field (the
    section's other required fields, missing here, fail too: those errors do not count)."""
    try:
        cls.model_validate({name: value})
    except ValidationError as err:
        return any(tuple(e["loc"][:1]) == (name,) for e in err.errors())
    return False


@pytest.mark.parametrize("dotted,cls,name,numbers", FIELDS, ids=[f[0].removeprefix("g2rpo.") for f in FIELDS])
def test_every_number_is_finite_and_fits_64_bits(dotted, cls, name, numbers):
    accepted = [
        put(bad)
        for kind, put in numbers
        for bad in (BAD_FLOATS if kind is float else BAD_INTS)
        if not _refused_at(cls, name, put(bad))
    ]
    assert not accepted, f"{dotted} accepts {accepted}: give it explicit bounds (Field(ge=..., le=...))"


def test_seed_max_is_the_generators_own_limit():
    torch = pytest.importorskip("torch")
    torch.Generator().manual_seed(SEED_MAX)
    with pytest.raises((ValueError, OverflowError, RuntimeError)):
        torch.Generator().manual_seed(SEED_MAX + 1)


@pytest.mark.parametrize(
    "override,field",
    [
        ("train.learning_rate=.inf", "train.learning_rate"),
        ("train.weight_decay=.inf", "train.weight_decay"),
        ("train.adam_betas=[0.9, 1.5]", "train.adam_betas.1"),
        ("train.seed=18446744073709551616", "train.seed"),
    ],
)
def test_the_reported_values_are_refused_naming_the_field(tmp_path, override, field):
    from g2rpo.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_run_config(None, [f"model.path={tmp_path}", "data.prompts=p.txt", override])
    assert any(p.startswith(field) for p in caught.value.problems), caught.value.problems


def test_eval_refuses_a_seed_past_the_generator_before_loading_anything(tmp_path, capsys):
    # On main this loaded the model, then ended in "ValueError: Overflow" and a partial folder.
    from g2rpo.cli import main

    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tmp_path / "no-model"), "--output", str(out), "--prompts", "builtin:tiny"]
    assert main([*argv, "--seeds", "0,18446744073709551616"]) == 2
    assert "seeds.1='18446744073709551616': Input should be less than or equal to 18446744073709551615" in (
        capsys.readouterr().err
    )
    assert not out.exists()
