"""The whole pipeline through kfp.local, twice: the first run ends with a champion, the second is gated
against it. The issue's proof, so it stays in the default tier (one training iteration per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from g2rpo.artifacts.registry import Registry
from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.steps.gate import decide_challenger
from g2rpo.steps.train_task import train_task

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, shared: Path, name: str, *extra: str) -> int:
    return main(
        [
            "pipeline",
            "run-local",
            "--out",
            str(out),
            "--shared",
            str(shared),
            "--name",
            name,
            "--iterations",
            "1",
            *extra,
        ]
    )


@pytest.mark.integration
def test_run_local_promotes_a_champion_then_gates_the_next_challenger(tmp_path, capsys):
    out, shared = tmp_path / "runs", tmp_path / "shared"
    registry = Registry((shared / "registry").as_uri())

    assert _run(out, shared, "first") == 0
    printed = capsys.readouterr().out
    assert "g2rpo pipeline run-local: SUCCEEDED" in printed
    assert "g2rpo-tiny v1 vs no champion yet: PROMOTED" in printed
    assert registry.read_state("g2rpo-tiny")[0].aliases == {"champion": 1}
    root = out / "first" / "pipeline-root"
    (run_root,) = [p for p in root.iterdir() if p.is_dir()]
    report = (run_root / "evaluate" / "report").read_text()
    assert "challenger" in report and "data:image/png;base64," in report
    # kfp.local keeps a Metrics artifact's values in the task's executor output.
    executor = json.loads((run_root / "train" / "executor_output.json").read_text())
    assert executor["artifacts"]["metrics"]["artifacts"][0]["metadata"]["iterations"] == 1
    evaluation = json.loads((run_root / "evaluate" / "evaluation" / "record.json").read_text())
    assert evaluation["champion_version"] is None
    images = Path(evaluation["challenger_eval_uri"].removeprefix("file://")) / "images"
    assert len(list(images.glob("*.png"))) == 4 * 3  # the 4 test prompts × seeds 0, 1, 2
    status = json.loads((run_root / "report-status" / "record").read_text())
    assert status["state"] == "SUCCEEDED" and status["failed_task"] == ""
    assert not list(Path(shared).glob("*.tmp"))

    # The same settings again train the same weights: no improvement over the champion, so the
    # challenger is registered, evaluated against the champion on the same items, and refused.
    assert _run(out, shared, "second") == 0
    printed = capsys.readouterr().out
    assert "g2rpo-tiny v2 vs champion v1: REFUSED" in printed
    assert "improvement +0.0000 < required 0.01" in printed
    assert registry.read_state("g2rpo-tiny")[0].aliases == {"champion": 1, "challenger": 2}
    assert registry.decisions("g2rpo-tiny", 2)[0]["passed"] is False
    (run_root,) = [p for p in (out / "second" / "pipeline-root").iterdir() if p.is_dir()]
    assert not (run_root / "promote").exists()  # dsl.If skipped it
    evaluation = json.loads((run_root / "evaluate" / "evaluation" / "record.json").read_text())
    assert evaluation["champion_version"] == 1
    assert evaluation["champion_means"] == evaluation["challenger_means"]

    # A gates file naming a metric the run did not evaluate: refused before anything is registered.
    bad_gates = tmp_path / "gates.yaml"
    bad_gates.write_text("metrics:\n  hps:\n    direction: higher\n    domain: in\n    min_improvement: 0\n")
    with pytest.raises(G2RPOError, match=r"gates metrics \['hps'\] were not evaluated"):
        decide_challenger(
            run_root / "train" / "model",
            run_root / "evaluate" / "evaluation",
            registry_uri=registry.uri,
            model="g2rpo-tiny",
            gates_uri=str(bad_gates),
            source_run="test",
            output_dir=tmp_path / "decision",
        )
    assert registry.version_numbers("g2rpo-tiny") == [1, 2]

    # A run folder whose pipeline root an interrupted run left behind is refused; nothing is lost.
    (out / "third" / "pipeline-root").mkdir(parents=True)
    assert _run(out, shared, "third") == 2
    assert "partial pipeline root" in capsys.readouterr().err
    assert _run(out, shared, "first") == 2
    assert "holds a finished run" in capsys.readouterr().err
    assert registry.version_numbers("g2rpo-tiny") == [1, 2]


def test_more_than_one_node_needs_the_trainjob_launcher(tmp_path):
    with pytest.raises(G2RPOError, match="multi-node needs the TrainJob launcher"):
        train_task(
            str(ROOT / "configs" / "tiny-cpu.yaml"),
            {"iterations": 1},
            prompts=str(ROOT / "configs" / "tiny-prompts.txt"),
            base_model_uri=str(tmp_path / "tiny-flux"),
            publish_uri=(tmp_path / "store").as_uri(),
            record_dir=tmp_path / "record",
            work_dir=tmp_path / "work",
            nodes=2,
        )
    assert not (tmp_path / "tiny-flux").exists()  # refused before any training


def test_unknown_choices_are_refused(tmp_path):
    with pytest.raises(G2RPOError, match="valid: strategy, num_steps"):
        train_task(
            str(ROOT / "configs" / "tiny-cpu.yaml"),
            {"iteratons": 1},
            prompts="p.txt",
            base_model_uri="m",
            publish_uri="s",
            record_dir=tmp_path / "r",
            work_dir=tmp_path / "w",
        )
