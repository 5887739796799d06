"""The user's own files are never overwritten (issue 9 item 2): ``output.dir`` is written only when it is
new, empty, a marked g2rpo run's, or g2rpo's own unmarked layout; real runs of the tiny Flux model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from trainer_testlib import as_cli, tiny_overrides

from g2rpo.cli import main
from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.training.metrics import read_iteration_records
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.run_dir import _RUN_FILES, MARKER, RunDir, check_run_dir, foreign_entries
from g2rpo.training.trainer import Trainer

pytestmark = pytest.mark.integration

USER_CONFIG = "# my notes on this run, which g2rpo must keep\ntrain:\n  iterations: 2  # short\n"
OTHER_TOOLS_METRICS = '{"step": 1, "loss": 0.5, "tool": "someone else"}\n'


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _config(model: Path, out: Path, **extra) -> RunConfig:
    extra = {"train.iterations": 2, "train.checkpoint_every": 2, "output.export": False, **extra}
    return load_config(RunConfig, None, tiny_overrides(model, out, **extra))


def test_train_refuses_a_folder_holding_the_users_config_and_leaves_it_as_it_was(tiny_flux_dir, tmp_path, capsys):
    # `g2rpo train --config DIR/config.yaml output.dir=DIR`: the config file is the user's, with comments.
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.yaml").write_text(USER_CONFIG)
    overrides = tiny_overrides(tiny_flux_dir, folder, **{"output.export": False})
    before = _snapshot(folder)
    code = main(["train", "--config", str(folder / "config.yaml"), *as_cli(overrides)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"output.dir='{folder}'" in err and "config.yaml" in err and "choose another output.dir" in err
    assert _snapshot(folder) == before  # byte for byte, and nothing added (no marker, no metrics)
    assert (folder / "config.yaml").read_text() == USER_CONFIG


def test_another_tools_metrics_file_is_never_appended_to(tiny_flux_dir, tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(OTHER_TOOLS_METRICS)
    (folder / "notes").mkdir()
    with pytest.raises(G2RPOError, match=r"output\.dir=.*metrics\.jsonl, notes"):
        Trainer(_config(tiny_flux_dir, folder)).setup()
    assert (folder / "metrics.jsonl").read_text() == OTHER_TOOLS_METRICS
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "notes"]


def test_a_run_marks_its_folder_first_and_resumes_there(tiny_flux_dir, tmp_path):
    out = tmp_path / "run"
    config = _config(tiny_flux_dir, out)
    Trainer(config).run()
    marker = json.loads((out / MARKER).read_text())
    assert marker["tool"] == "g2rpo" and marker["config_hash"] == resume_hash(config)
    assert foreign_entries(out) == []
    longer = _config(tiny_flux_dir, out, **{"train.iterations": 3})
    summary = Trainer(longer).run()
    assert summary.resumed_at == 2 and summary.iterations == 3
    assert [r["iteration"] for r in read_iteration_records(out / "metrics.jsonl")] == [0, 1, 2]
    assert json.loads((out / MARKER).read_text()) == marker  # written once, by the fresh run


def test_a_folder_from_before_the_marker_is_adopted_when_it_holds_a_complete_checkpoint(tiny_flux_dir, tmp_path):
    out = tmp_path / "old-run"
    Trainer(_config(tiny_flux_dir, out)).run()
    (out / MARKER).unlink()  # as today's folders were made before the marker existed
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]
    check_run_dir(out)  # adopted: a complete checkpoint says the files beside it are the run's
    summary = Trainer(_config(tiny_flux_dir, out, **{"train.iterations": 3})).run()
    assert summary.resumed_at == 2 and (out / MARKER).exists()


def test_unmarked_folders_without_a_complete_checkpoint_are_not_taken_for_a_run(tmp_path):
    # A pre-marker run killed before its first checkpoint cannot be told from another tool's files.
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.yaml").write_text("train: {}\n")
    (killed / "metrics.jsonl").write_text("")
    assert foreign_entries(killed) == ["config.yaml", "metrics.jsonl"]
    # A restore from a checkpoint URI into a fresh folder leaves only checkpoint directories: g2rpo's own.
    restored = tmp_path / "restored"
    (restored / "checkpoints" / "iter-000004").mkdir(parents=True)
    assert foreign_entries(restored) == []
    # ...but a checkpoints/ folder holding anything else is someone else's.
    (restored / "checkpoints" / "weights.bin").write_bytes(b"x")
    assert foreign_entries(restored) == ["checkpoints"]
    # a file where the folder should be
    target = tmp_path / "a-file"
    target.write_text("x")
    with pytest.raises(G2RPOError, match="is a file"):
        check_run_dir(target)


def test_a_marked_folder_keeps_the_runs_own_checks(tiny_flux_dir, tmp_path):
    # The marker makes the folder the run's; the run's own checks (another config, no checkpoint) still apply.
    out = tmp_path / "run"
    config = _config(tiny_flux_dir, out, **{"train.iterations": 1, "train.checkpoint_every": 5})
    Trainer(config).run()
    shutil.rmtree(out / "checkpoints")
    other = _config(tiny_flux_dir, out, **{"algorithm.group_size": 2})
    with pytest.raises(G2RPOError, match="another config"):
        Trainer(other).setup()
    assert yaml.safe_load((out / "config.yaml").read_text())["algorithm"]["group_size"] == 4


def test_duplicate_prompts_are_reported_and_recorded_in_the_summary(tiny_flux_dir, tmp_path, capsys):
    # issue 9 item 8: the trainer drops duplicates (the draws index unique prompts) and now says so
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\na blue ball\na red cube\na green cone\na blue ball\na red cube\n")
    out = tmp_path / "run"
    config = _config(tiny_flux_dir, out, **{"data.prompts": str(prompts), "train.iterations": 1})
    summary = Trainer(config).run()
    err = capsys.readouterr().err
    assert f"3 duplicate prompt(s) in {prompts} dropped; training on 3 unique prompt(s) of 6" in err
    assert summary.prompts == {"read": 6, "unique": 3, "duplicates": 3}
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    recorded = [{k: v for k, v in e.items() if k != "time"} for e in events if e.get("event") == "prompts"]
    assert recorded == [{"event": "prompts", "source": str(prompts), "read": 6, "unique": 3, "duplicates": 3}]
    # the same counts in the summary of a clean prompt set, and no event or line for it
    clean = Trainer(_config(tiny_flux_dir, tmp_path / "clean", **{"train.iterations": 1})).run()
    assert clean.prompts == {"read": 8, "unique": 8, "duplicates": 0}
    assert "duplicate prompt" not in capsys.readouterr().err


def test_every_file_run_dir_names_is_one_the_folder_check_counts_as_the_runs(tmp_path):
    # RunDir says where the trainer writes; the folder check says which top-level names are a run's
    # (what it adopts from a folder made before the marker). Both spell the layout: they must agree.
    run_dir = RunDir(tmp_path / "run")
    named = [
        run_dir.config_yaml,
        run_dir.resumed_config_yaml(12),
        run_dir.metrics,
        run_dir.checkpoints,
        run_dir.export,
        run_dir.export_beside(1_000_000),
    ]
    assert all(path.parent == run_dir.root for path in named)
    assert [path.name for path in named if not _RUN_FILES.match(path.name)] == []
    assert RunDir.of(_config(tmp_path / "model", tmp_path / "out")).root == tmp_path / "out"
