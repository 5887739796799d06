"""A run's parameters are one typed table (g2rpo.steps.parameters): the pipeline's signature, defaults and
input descriptions, the train component's signature, the task's wiring, the run-config mapping and the
checks all agree with it, so a new training choice is a row there plus its parameter in components/train.py
(the last test adds one and follows it end to end)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import g2rpo.steps.parameters as run_parameters
from components.train import train
from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.steps.check import check_arguments
from g2rpo.steps.parameters import (
    RUN_PARAMETERS,
    TRAIN_PARAMETERS,
    TrainParameter,
    pipeline_defaults,
    train_choices,
    train_parameter_defaults,
)
from g2rpo.steps.placement import load_profile
from g2rpo.steps.train_task import run_config_for
from pipelines.alignment import build_pipeline, compile_pipeline

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
        assert parameters[row.name].default == row.default == pipeline_defaults()[row.name], row.name
    for row in RUN_PARAMETERS:  # the run's other parameters: written out in the DAG, typed and defaulted here
        assert parameters[row.name].annotation is row.type, row.name
        assert parameters[row.name].default == row.default, row.name
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
        assert inputs[row.name]["description"] == row.help, row.name  # the KFP UI's description
        assert component[row.name] == {"parameterType": kind}, row.name
        assert wired[row.name] == {"componentInputParameter": f"pipelinechannel--{row.name}"}, row.name
    for row in RUN_PARAMETERS:
        assert inputs[row.name]["description"] == row.help, row.name


def test_the_run_config_mapping_and_the_unset_rules_come_from_the_table(tmp_path):
    assert list(train_choices({name: 0 for name in reversed(NAMES)} | {"overrides": []})) == NAMES
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


def test_the_choices_reach_the_run_config_as_values_and_problems_name_what_set_them():
    """No text in between: a choice is put into the config's sections as the value it is, and a problem of a
    run-config field names the choice that set it — not when ``overrides`` (applied after) set it again."""
    tree = run_parameters.choice_tree({"group_size": 8, "validation_every": 5, "learning_rate": 0.0})
    assert tree == {"algorithm": {"group_size": 8}, "train": {"validation": {"every": 5, "enabled": True}}}
    choices = {"group_size": 1, "validation_every": 5, "rewards": [{"name": "x"}], "learning_rate": 0.0}
    assert run_parameters.source_of("algorithm.group_size", choices, {}) == "group_size"
    assert run_parameters.source_of("train.validation.enabled", choices, {}) == "validation_every"
    assert run_parameters.source_of("rewards.models.0.name", choices, {}) == "rewards"
    assert run_parameters.source_of("train.learning_rate", choices, {}) is None  # unset: the strategy's own
    assert run_parameters.source_of("algorithm.group_size", choices, {"algorithm": {"group_size": 1}}) is None
    assert run_parameters.source_of("train.seed", choices, {}) is None  # the config file's
    with pytest.raises(G2RPOError) as refused:
        check_arguments({"group_size": 4, "overrides": ["algorithm.group_size=1"]}, load_profile())
    assert "algorithm.group_size=1: Input should be greater" in str(refused.value)
    assert "(parameter group_size)" not in str(refused.value)


def test_submit_help_lists_every_parameter_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["pipeline", "submit", "--help"])
    out = capsys.readouterr().out
    for row in (*RUN_PARAMETERS, *TRAIN_PARAMETERS):
        assert f"  {row.name} = " in out and f": {row.help}\n" in out, row.name
    assert "  group_size = 12: G, images per prompt\n" in out


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


# The two edits of a new training choice, as a maintainer makes them: a row in the table ...
NEW_ROW = TrainParameter("seed", int, 5, "train.seed", "the run's seed (a choice this test adds)")


def _train_component_with(tmp_path: Path, line: str):
    """... and its parameter in components/train.py's signature, after the table's last row (KFP ships the
    function's source, so the edited file is imported from disk)."""
    source = (ROOT / "components" / "train.py").read_text()
    last = f"    {TRAIN_PARAMETERS[-1].name}: {TRAIN_PARAMETERS[-1].type.__name__},\n"
    assert source.count(last) == 1
    edited = tmp_path / "train_with_seed.py"
    edited.write_text(source.replace(last, last + line))
    spec = importlib.util.spec_from_file_location("train_with_seed", edited)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.train


def test_a_new_training_choice_is_two_edits_and_reaches_every_use(tmp_path, monkeypatch, capsys):
    """Edit 1: a row in TRAIN_PARAMETERS. Edit 2: the parameter in the train component's signature. Nothing
    else is named: the pipeline's signature, default and description, the compiled spec and the train task's
    wiring, the component's choices, the run config, the checks before a run is sent and the parameters'
    listing in `g2rpo pipeline submit --help` all follow."""
    monkeypatch.setattr(run_parameters, "TRAIN_PARAMETERS", (*TRAIN_PARAMETERS, NEW_ROW))
    monkeypatch.setattr("pipelines.alignment.train", _train_component_with(tmp_path, "    seed: int,\n"))

    # The pipeline: its signature, and the compiled spec's input, description and the train task's wiring.
    signature = inspect.signature(build_pipeline(load_profile()).pipeline_func).parameters
    assert signature["seed"].annotation is int and signature["seed"].default == 5
    spec = next(yaml.safe_load_all(compile_pipeline(tmp_path / "pipeline.yaml").read_text()))
    root = spec["root"]["inputDefinitions"]["parameters"]["seed"]
    assert root == {
        "defaultValue": 5,
        "description": NEW_ROW.help,
        "isOptional": True,
        "parameterType": "NUMBER_INTEGER",
    }
    assert spec["components"]["comp-train"]["inputDefinitions"]["parameters"]["seed"] == {
        "parameterType": "NUMBER_INTEGER"
    }
    wired = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["train"]["inputs"]["parameters"]["seed"]
    assert wired == {"componentInputParameter": "pipelinechannel--seed"}

    # The defaults and the run config.
    assert pipeline_defaults()["seed"] == 5
    where = dict(base_model_uri=str(tmp_path / "m"), prompts="p.txt", output_dir=tmp_path / "o")
    assert run_config_for("configs/flux-dev-h200.yaml", {"seed": 7}, **where).train.seed == 7

    # The checks before a run is sent name the parameter.
    with pytest.raises(G2RPOError, match=re.escape("train.seed=-1 (parameter seed): Input should be greater")):
        check_arguments({"seed": -1}, load_profile())

    # The parameters' listing: `g2rpo pipeline submit --help`.
    with pytest.raises(SystemExit):
        main(["pipeline", "submit", "--help"])
    assert f"  seed = 5: {NEW_ROW.help}\n" in capsys.readouterr().out

    # The train component hands it to the train task with the other choices.
    given = {}

    def train_task(config_uri, choices, overrides, **kwargs):
        given.update(choices)
        raise _Stop

    monkeypatch.setattr("g2rpo.steps.train_task.train_task", train_task)
    edited = _train_component_with(tmp_path, "    seed: int,\n").python_func
    arguments = {name: p.default for name, p in signature.items() if p.default is not inspect.Parameter.empty}
    arguments = {k: v for k, v in arguments.items() if k in inspect.signature(edited).parameters}
    folder = SimpleNamespace(path=str(tmp_path), uri=(tmp_path / "data").as_uri())
    extra = dict(run_id="run", task_name="train", trainer_image="img", shm_size="1Gi", s3_secret_name="s3",
                 s3_secret_keys={}, service_account="", trainjob_deadline_s=3600, gpus_per_node="1",
                 train_pod_gpus="1", node_selector={}, tolerations=[])  # fmt: skip
    with pytest.raises(_Stop):
        edited(data=folder, **{**arguments, **extra}, model=folder, metrics=folder)
    assert given == {**train_parameter_defaults(), "seed": 5}


class _Stop(Exception):
    """Ends the train component once the train task has its choices (nothing is trained)."""


def test_the_validation_choices_are_named_only_in_the_table_and_the_train_components_signature():
    """What the two-edits test shows for a new choice holds for the table's own rows: a name that is no
    run-config word (validation_*) appears in the library, the components and the DAG only in those two."""
    sources = [p for folder in ("g2rpo", "pipelines", "components") for p in (ROOT / folder).rglob("*.py")]
    for row in TRAIN_PARAMETERS:
        if not row.name.startswith("validation_"):
            continue
        files = {str(p.relative_to(ROOT)) for p in sources if re.search(rf"\b{row.name}\b", p.read_text())}
        assert files == {"g2rpo/steps/parameters.py", "components/train.py"}, row.name
