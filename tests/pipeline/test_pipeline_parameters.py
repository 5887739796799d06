"""The pipeline's training choices are one table (g2rpo.steps.parameters.TRAIN_PARAMETERS): the pipeline's
signature and defaults, the train component's signature, the task's wiring and the run-config mapping all
agree with it, so a new knob is a row there plus its parameter in components/train.py."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from components.train import train
from g2rpo.errors import G2RPOError
from g2rpo.steps.parameters import PARAMETER_KEYS, TRAIN_PARAMETERS, train_parameter_defaults
from g2rpo.steps.train_task import run_config_for
from pipelines.alignment import DEFAULTS, build_pipeline
from pipelines.placement import load_profile

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "pipelines" / "compiled" / "alignment.yaml"
NAMES = [p.name for p in TRAIN_PARAMETERS]
KFP_TYPES = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", list: "LIST", dict: "STRUCT"}


def test_the_train_components_signature_takes_every_choice_in_the_tables_order_and_type():
    # KFP ships the component's source and calls it by its own signature, so the signature is written out:
    # it must list the table's rows, in order, one after the other, each with the table's type.
    parameters = list(inspect.signature(train.python_func).parameters.values())
    names = [p.name for p in parameters]
    start = names.index(NAMES[0])
    assert names[start : start + len(NAMES)] == NAMES
    for row, parameter in zip(TRAIN_PARAMETERS, parameters[start:], strict=False):
        assert parameter.annotation in (row.type, row.type.__name__), row.name
        assert parameter.default is inspect.Parameter.empty, row.name  # the pipeline gives every value


def test_the_pipeline_signature_is_read_off_the_table():
    pipeline = build_pipeline(load_profile())
    parameters = inspect.signature(pipeline.pipeline_func).parameters
    for row in TRAIN_PARAMETERS:
        assert parameters[row.name].annotation is row.type, row.name
        assert parameters[row.name].default == row.default == DEFAULTS[row.name], row.name
    listed = list(parameters)
    assert listed[listed.index("model_name") + 1 : listed.index("overrides")] == NAMES
    assert train_parameter_defaults() == {row.name: row.default for row in TRAIN_PARAMETERS}
    copies = train_parameter_defaults()
    copies["granularities"].append(9)  # fresh copies: the table's defaults stay as written
    assert TRAIN_PARAMETERS[NAMES.index("granularities")].default == [1, 2, 3]


def test_the_compiled_pipeline_takes_each_choice_and_passes_it_to_the_train_task():
    spec = next(yaml.safe_load_all(COMPILED.read_text()))
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    component = spec["components"]["comp-train"]["inputDefinitions"]["parameters"]
    wired = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    for row in TRAIN_PARAMETERS:
        kind = KFP_TYPES[row.type]
        assert inputs[row.name]["parameterType"] == kind and inputs[row.name]["defaultValue"] == row.default
        assert component[row.name] == {"parameterType": kind}, row.name
        assert wired[row.name] == {"componentInputParameter": f"pipelinechannel--{row.name}"}, row.name


def test_the_run_config_mapping_and_the_unset_rules_come_from_the_table(tmp_path):
    assert list(PARAMETER_KEYS) == NAMES
    assert {p.name for p in TRAIN_PARAMETERS if p.unset == "strategy"} == {"learning_rate"}
    assert {p.name for p in TRAIN_PARAMETERS if p.unset == "file"} == {n for n in NAMES if n.startswith("validation_")}
    where = dict(base_model_uri=str(tmp_path / "m"), prompts="p.txt", output_dir=tmp_path / "o")
    config = run_config_for("configs/flux-dev-h200.yaml", train_parameter_defaults(), **where)
    for row in TRAIN_PARAMETERS:  # every key exists in the run config; an unset default leaves it to the file
        value = config.model_dump()
        for part in row.key.split("."):
            value = value[part]
        if row.name == "rewards":  # the run config fills in each reward's other fields
            value = [{k: v for k, v in spec.items() if k in ("name", "weight", "weights")} for spec in value]
        if row.unset is None:
            assert value == row.default, row.name
    assert config.train.validation.enabled is False  # validation_every 0: the file's (off)
    on = run_config_for("configs/flux-dev-h200.yaml", {"validation_every": 5}, **where).train.validation
    assert on.enabled and on.every == 5  # when_set turns it on
    with pytest.raises(G2RPOError, match="validation_patiense.*did you mean"):
        run_config_for("configs/flux-dev-h200.yaml", {"validation_patiense": 2}, **where)


def test_the_tables_help_names_no_list_a_registry_holds():
    """The strategies and their learning rates live in their registry and sections; a help text that listed
    them went stale (it named 4 of 6 strategies and 3 of 6 rates): it points at `g2rpo config describe`."""
    from g2rpo.strategies.registry import STRATEGIES
    from g2rpo.strategies.settings import PRESETS

    for row in TRAIN_PARAMETERS:
        named = [name for name in (*STRATEGIES, *PRESETS) if f"{name}," in row.help or f" {name} " in row.help]
        assert not named, (row.name, named)


def test_compiling_or_checking_the_pipeline_loads_no_torch():
    """The parameters table and the DAG import no torch (compile took seconds more while they did)."""
    import subprocess
    import sys

    code = "import sys, pipelines.alignment, g2rpo.steps.parameters; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
