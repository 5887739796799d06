"""The whole pipeline through kfp.local, twice, on the shapes task: the first run pretrains the shapes
model (here with a few steps), trains on the learned shapes rewards and ends with a champion; the second reuses
the model and is gated against the champion. The issue's proof, so it stays in the default tier (one
training iteration per run)."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from g2rpo.artifacts.registry import Registry
from g2rpo.cli import main
from g2rpo.commands.model import pretraining_settings, shapes_model_path
from g2rpo.commands.pipeline import RUN_LOCAL_LIBRARIES, add_run_local_args
from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import SHIPPED_UNSEEN_MODEL, UNSEEN_PRETRAINING, check_shapes_model
from g2rpo.models.tiny import TINY_MARKER
from g2rpo.rewards.shapes import IN_DOMAIN, IN_DOMAIN_CHECKS, OUT_OF_DOMAIN
from g2rpo.steps.gate import decide_challenger
from g2rpo.steps.train_task import train_task
from g2rpo.tasks.shapes import all_scenes
from pipelines.local import LEARNED_REWARDS, LocalRun, _QuietConsole, _TrainingWatch, verdict
from tests.tiny_flux_fixture import QUICK_SHAPES_FLAGS

ROOT = Path(__file__).resolve().parents[2]
MODEL = "g2rpo-shapes"


def _run(out: Path, shared: Path, name: str, *extra: str, command: tuple[str, ...] = ("pipeline", "run-local")) -> int:
    return main(
        [
            *command,
            "--out",
            str(out),
            "--shared",
            str(shared),
            "--model",
            str(shared.parent / "shapes-flux"),
            *QUICK_SHAPES_FLAGS,
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

    # The first run with the shapes gates as they are (no floors: a first version is not gated).
    assert _run(out, shared, "first", f"gates_uri={ROOT / 'configs' / 'shapes-gates.yaml'}") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("g2rpo pipeline run-local: loading its libraries …\n")  # before the imports
    assert "pretraining the shapes model into" in printed
    assert "base model on the held-out prompts" not in printed and not (out / "first" / "gates.yaml").exists()
    assert json.loads((tmp_path / "shapes-flux" / TINY_MARKER).read_text())["task"] == "shapes"
    # The run's state and the model's verdict worded apart; the verdict once, as the last line.
    assert "g2rpo pipeline run-local: run SUCCEEDED (every task ran;" in printed
    assert printed.splitlines()[-1] == "PROMOTED v1"
    assert [line for line in printed.splitlines() if line.startswith(("PROMOTED", "REFUSED"))] == ["PROMOTED v1"]
    assert "PASSED" not in printed and "FAILED" not in printed
    assert registry.read_state(MODEL)[0].aliases == {"champion": 1}
    # Quiet by default: a line per task and the tasks' own lines; kfp.local's all go to the log.
    assert "[KFP Executor" not in printed and "executor_input" not in printed and " - INFO - " not in printed
    assert "train: SUCCESS" in printed and "evaluate: SUCCESS" in printed
    assert "train 1/1: hps_v21 " in printed  # the training record, read while the task ran
    # the train task says what it loads before its first record
    assert printed.index("    training g2rpo for 1 iteration(s) from ") < printed.index("train 1/1: hps_v21 ")
    assert printed.index("train 1/1: hps_v21 ") < printed.index("train: SUCCESS") < printed.index("evaluate …")
    # the decision report, at a path a browser opens as a page
    report_path = out / "first" / "decision-report.html"
    assert f"  decision report        {report_path.as_uri()}\n" in printed  # a link, as the other outputs
    # The evaluate task says how far it is: a line per chunk of each evaluation, under its label.
    assert "[evaluate base model " in printed and "[evaluate challenger " in printed
    assert "(8/8 on this rank); 256/256 images" in printed
    # The README's table: the trained rewards first, a column per model, the paired Δ with its interval.
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("  held-out means (256 samples)"))
    assert "base model    challenger   Δ vs base model (95 % CI)" in lines[head]
    rows = [line.split() for line in lines[head + 1 : head + 9]]
    assert [row[0] for row in rows[:2]] == list(LEARNED_REWARDS) and rows[0][1] == "(trained)"
    assert {row[0] for row in rows[2:]} == set(IN_DOMAIN + IN_DOMAIN_CHECKS + OUT_OF_DOMAIN)
    assert all(row[-3].startswith(("+", "-")) and row[-2].startswith("[") for row in rows)  # Δ [low, high]
    assert "v1: gates met — promoted to champion" in report_path.read_text()
    assert "<img id='curves'" in report_path.read_text()  # the training's reward curves
    log = (out / "first" / "pipeline.log").read_text()
    assert "[KFP Executor" in log and "Executing task" in log and "Got executor_input" in log
    root = out / "first" / "pipeline-root"
    (run_root,) = [p for p in root.iterdir() if p.is_dir()]
    report = (run_root / "evaluate" / "report").read_text()
    assert "challenger" in report and "data:image/png;base64," in report
    # configs/shapes-cpu.yaml validates during training: at 0 and at the end of this 1-iteration run
    assert "<h2>Validation during training</h2>" in report and "<td>0 (baseline)</td>" in report
    # kfp.local keeps a Metrics artifact's values in the task's executor output.
    executor = json.loads((run_root / "train" / "executor_output.json").read_text())
    assert executor["artifacts"]["metrics"]["artifacts"][0]["metadata"]["iterations"] == 1
    # trained on the learned rewards only (their shipped weights); the exact shapes metrics scored as ground truth
    record = json.loads((run_root / "train" / "model" / "record.json").read_text())
    assert record["base_model_uri"] == str(tmp_path / "shapes-flux")
    run_config = yaml.safe_load((run_root / "train" / "model" / "run-config.yaml").read_text())
    weights = {spec["name"]: spec["weight"] for spec in run_config["rewards"]["models"]}
    exact = IN_DOMAIN + IN_DOMAIN_CHECKS + OUT_OF_DOMAIN
    assert weights == {**dict.fromkeys(LEARNED_REWARDS, 1.0), **dict.fromkeys(exact, 0.0)}
    learned = {spec["name"]: spec["weights"] for spec in run_config["rewards"]["models"] if spec["weight"]}
    assert learned == {name: str(path) for name, path in LEARNED_REWARDS.items()}
    evaluation = json.loads((run_root / "evaluate" / "evaluation" / "record.json").read_text())
    first_evaluation = evaluation
    assert evaluation["champion_version"] is None
    assert evaluation["baseline_label"] == "base model"  # a first version is compared with its base model
    assert sorted(evaluation["trained_metrics"]) == sorted(LEARNED_REWARDS)
    assert sorted(evaluation["challenger_means"]) == sorted((*LEARNED_REWARDS, *exact))
    images = sorted((Path(evaluation["challenger_eval_uri"].removeprefix("file://")) / "images").glob("*.png"))
    assert len(images) == 64 * 4  # the 64 prompts the prepare task holds out (of 360) × seeds 0–3
    assert Image.open(images[0]).size == (64, 64)
    prompts = (shared / "shapes-prompts.txt").read_text().splitlines()
    assert prompts == [s.prompt for s in all_scenes()]
    train = (run_root / "prepare-data" / "data" / "train.jsonl").read_text().splitlines()
    assert sum(1 for line in train if line.strip()) == 360 - 64
    status = json.loads((run_root / "report-status" / "record").read_text())
    assert status["state"] == "SUCCEEDED" and status["failed_task"] == ""
    assert not list(Path(shared).glob("*.tmp"))

    # The same settings again train the same weights: no improvement over the champion, so the
    # challenger is registered, evaluated against the champion on the same items, and refused.
    # --verbose prints all of kfp.local's output.
    # `g2rpo demo` is the same command (the one main job).
    assert _run(out, shared, "second", "--verbose", command=("demo",)) == 0
    printed = capsys.readouterr().out
    assert "pretrained before; its settings match" in printed and "pretraining the shapes" not in printed
    assert "Executing task" in printed and "[KFP Executor" in printed
    assert f"{MODEL} v2 vs champion v1: " in printed and "gate(s) not met" in printed
    verdict = printed.splitlines()[-1]
    assert verdict.startswith("REFUSED v2: ") and "improvement +0.0000 < required 0.005" in verdict
    # By default the base model is evaluated on the same held-out items first; its means are the
    # floors a first version would need (with a champion, the champion is the bar).
    gates = yaml.safe_load((out / "second" / "gates.yaml").read_text())["metrics"]
    # Each model scored once per settings: the base model (scored by the first run's evaluate task) and the
    # champion (the first run's challenger) are read back from the store, verified, not sampled again.
    base_uri = first_evaluation["baseline_eval_uri"]
    assert f"[evaluate base model] scored before with the same model bytes, prompts, seeds and settings: " \
        f"reusing {base_uri}" in printed  # fmt: skip
    assert f"reusing {first_evaluation['challenger_eval_uri']}" in printed and "[evaluate champion v1 " not in printed
    assert "[evaluate champion v1] scored before" in printed
    # the same settings trained the same bytes: the challenger's images and scores are champion v1's, copied
    assert f"copied from {first_evaluation['challenger_eval_uri']}, not sampled again" in printed
    base = json.loads((Path(base_uri.removeprefix("file://")) / "metrics.json").read_text())
    assert "base model on the held-out prompts: " in printed
    assert "  promote                skipped: v2 did not pass the gates" in printed
    for name in LEARNED_REWARDS:  # a trained reward must beat the base model by min_improvement (0.005)
        assert gates[name]["floor"] == pytest.approx(base["by_steps"]["6"][name]["mean"] + 0.005)
    for name in IN_DOMAIN + OUT_OF_DOMAIN:  # the exact ground truth, held out: may fall at most its tolerance
        allowed = 0.25 if name == "jpeg_compressibility" else 0.05
        assert gates[name]["floor"] == pytest.approx(base["by_steps"]["6"][name]["mean"] - allowed)
    assert "improvement +0.0000 < required 0.005" in printed
    assert registry.read_state(MODEL)[0].aliases == {"champion": 1, "challenger": 2}
    assert registry.decisions(MODEL, 2)[0]["passed"] is False
    (run_root,) = [p for p in (out / "second" / "pipeline-root").iterdir() if p.is_dir()]
    assert not (run_root / "promote").exists()  # dsl.If skipped it
    evaluation = json.loads((run_root / "evaluate" / "evaluation" / "record.json").read_text())
    assert evaluation["champion_version"] == 1 and evaluation["baseline_label"] == "champion v1"
    assert "v2: REFUSED" in (out / "second" / "decision-report.html").read_text()
    assert evaluation["champion_means"] == evaluation["challenger_means"]

    # A model folder made with other pretraining settings is refused before anything runs.
    assert main(["pipeline", "run-local", "--out", str(out), "--shared", str(shared), "--name", "other",
                 "--model", str(tmp_path / "shapes-flux")]) == 2  # fmt: skip
    assert "was pretrained with other settings: vae_steps=2 (wanted 1500)" in capsys.readouterr().err
    assert not (out / "other").exists()

    # A gates file naming a metric the run did not evaluate: refused before anything is registered.
    bad_gates = tmp_path / "gates.yaml"
    bad_gates.write_text("metrics:\n  hps:\n    direction: higher\n    domain: in\n    min_improvement: 0\n")
    with pytest.raises(G2RPOError, match=r"gates metrics \['hps'\] were not evaluated"):
        decide_challenger(
            run_root / "train" / "model",
            run_root / "evaluate" / "evaluation",
            registry_uri=registry.uri,
            model=MODEL,
            gates_uri=str(bad_gates),
            source_run="test",
            output_dir=tmp_path / "decision",
        )
    assert registry.version_numbers(MODEL) == [1, 2]

    # A run folder whose pipeline root an interrupted run left behind is refused; nothing is lost.
    (out / "third" / "pipeline-root").mkdir(parents=True)
    assert _run(out, shared, "third") == 2
    assert "partial pipeline root" in capsys.readouterr().err
    assert _run(out, shared, "first") == 2
    assert "holds a finished run" in capsys.readouterr().err
    assert registry.version_numbers(MODEL) == [1, 2]


def test_a_fresh_run_local_says_each_library_it_loads_before_its_first_check(tmp_path):
    """In a new process the imports take 5-10 s (more on a busy CPU): a line before each, none silent."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "g2rpo", "pipeline", "run-local", "--out", str(tmp_path)]
    done = subprocess.run([*command, "nope=1"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and "parameter='nope': unknown" in done.stderr  # refused after the imports
    labels = [f"  {label} …" for label, _ in RUN_LOCAL_LIBRARIES]
    assert done.stdout.splitlines() == ["g2rpo pipeline run-local: loading its libraries …", *labels]
    # a bad count is refused before any of it
    done = subprocess.run([*command, "--iterations", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and done.stdout == "" and "--iterations=0" in done.stderr


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


def test_by_default_the_demo_trains_the_shipped_model_that_never_saw_the_held_out_scenes():
    args = argparse.ArgumentParser()
    add_run_local_args(args)
    parsed = args.parse_args([])
    assert shapes_model_path(parsed) == SHIPPED_UNSEEN_MODEL
    # The pretraining flags default to its settings, so the default run's check passes (manifest and
    # marker: unseen=96, the held-out scenes left out; tests/models/test_models_shapes_unseen.py).
    settings = pretraining_settings(parsed, base=UNSEEN_PRETRAINING)
    assert settings.unseen == 96 and check_shapes_model(SHIPPED_UNSEEN_MODEL, settings) == SHIPPED_UNSEEN_MODEL
    # --pretrain-* still overrides them one by one
    assert pretraining_settings(args.parse_args(["--pretrain-unseen", "0"]), base=UNSEEN_PRETRAINING).unseen == 0


def test_bad_values_are_refused_before_pretraining_and_leave_no_folder(tmp_path, capsys):
    out, shared = tmp_path / "runs", tmp_path / "shared"
    for _ in range(2):  # and the same command again gets the same answer
        assert _run(out, shared, "bad", "group_size=1", "eval_seeds=[-1]") == 2
        err = capsys.readouterr().err
        assert "2 problem(s) in the pipeline's parameters" in err and "(parameter group_size)" in err
        assert "(parameter eval_seeds)" in err
    # Zero expensive work: the shapes model was not pretrained, nothing was written.
    assert not (shared.parent / "shapes-flux").exists() and not out.exists() and not shared.exists()


def test_a_run_that_fails_before_its_pipeline_can_simply_be_run_again(tmp_path, quick_shapes_dir, capsys):
    # A prompt file that is not there passes the value checks (the tasks read it) and fails in the base
    # model's evaluation, before the pipeline starts: the run folder it made is removed, so the same
    # command again gets the same clean error (on main: a FileExistsError traceback on its tmp folder).
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "shapes-flux").symlink_to(quick_shapes_dir)
    for _ in range(2):
        assert _run(tmp_path / "runs", shared, "again", f"prompts_uri={tmp_path / 'missing.txt'}") == 2
        assert "missing.txt" in capsys.readouterr().err
        assert not (tmp_path / "runs" / "again").exists()


def test_the_last_training_records_are_printed_before_the_line_that_says_training_ended(tmp_path):
    """The quiet console reads the train task's records every few seconds; the records written since
    its last look must come out before "train: SUCCESS", not after "evaluate …"."""
    (tmp_path / "g2rpo-train-x").mkdir()
    record = {"iteration": 0, "reward_names": ["shapes_colour"], "reward_mean": [[0.5, 0.7]], "seconds": {"step": 1.0}}
    (tmp_path / "g2rpo-train-x" / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    console_out, log = io.StringIO(), io.StringIO()
    console = _QuietConsole(log, console_out)
    console.before_task_end = _TrainingWatch(tmp_path, console, iterations=1).catch_up  # the watch never polled
    console.write("x - INFO - Executing task 'train'\n")
    console.write("x - INFO - Task 'train' finished with status SUCCESS\n")
    console.write("x - INFO - Executing task 'evaluate'\n")
    lines = console_out.getvalue().splitlines()
    assert lines[0].endswith("train …") and lines[1] == "    train 1/1: colour 0.600 (1.0 s)"
    assert lines[2].endswith("train: SUCCESS (0 s)") and lines[3].endswith("evaluate …")


def test_a_task_quiet_for_a_while_is_said_to_be_still_running():
    """On a busy CPU a task's start (its imports) or one figure outlasts the gap between its own lines."""
    console_out = io.StringIO()
    console = _QuietConsole(io.StringIO(), console_out)
    console.still_running(quiet_s=0.0)  # no task yet: nothing to say
    console.write("x - INFO - Executing task 'train'\n")
    console.still_running(quiet_s=3600.0)  # it printed its start just now
    console.still_running(quiet_s=0.0)
    console.write("x - INFO - Task 'train' finished with status SUCCESS\n")
    console.still_running(quiet_s=0.0)  # between tasks: kfp.local's own seconds
    lines = console_out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].endswith("train …") and lines[2].endswith("train: SUCCESS (0 s)")
    assert lines[1] == "    (train: 0 s, still running)"


def test_the_verdict_is_one_line_worded_apart_from_the_runs_state(tmp_path):
    def run(state: str, decision: dict, champion: int | None) -> LocalRun:
        return LocalRun(tmp_path, tmp_path, state, {}, decision, champion, tmp_path / "pipeline.log", {})

    refused = {"version": 2, "passed": False, "reasons": ["a: pass: fine", "b: FAIL: mean 1 misses the floor (≥ 2)"]}
    assert verdict(run("SUCCEEDED", refused, 1)) == "REFUSED v2: b: mean 1 misses the floor (≥ 2)"
    assert verdict(run("SUCCEEDED", {"version": 1, "passed": True, "reasons": []}, 1)) == "PROMOTED v1"
    assert verdict(run("FAILED", {"version": 3, "passed": True, "reasons": []}, 1)).startswith(
        "REFUSED v3: the promote task did not make it champion (the run FAILED"
    )
    assert verdict(run("FAILED", {}, None)).startswith("NO VERDICT: the run FAILED before its decision")


def test_the_summary_reads_the_evaluations_record_as_a_record_and_names_a_damaged_one(tmp_path, capsys):
    from g2rpo.commands.pipeline import print_summary
    from g2rpo.steps.records import CandidatesRecord, write_record

    evaluation = tmp_path / "evaluation"
    record = CandidatesRecord(
        challenger_eval_uri="s3://b/eval/v1",
        challenger_means={"shapes_colour": 0.9, "clip": 0.5, "hps_v21": 0.7},
        champion_means={},
        baseline_label="base model",
        trained_metrics=["hps_v21", "clip"],
        paired={"hps_v21": {"delta": 0.2104, "ci_low": 0.1736, "ci_high": 0.2441, "n": 256}},
    )
    write_record(record, evaluation)
    run = LocalRun(
        tmp_path, tmp_path, "SUCCEEDED", {"evaluate/evaluation": evaluation},
        {"version": 1, "passed": True, "reasons": []}, 1, tmp_path / "pipeline.log", {"shapes_colour": 0.8},
    )  # fmt: skip
    print_summary(run, 12.0)
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    head = next(i for i, row in enumerate(rows) if row[:4] == ["held-out", "means", "(256", "samples)"])
    # the trained rewards first, in the run's order; Δ with its interval where the evaluation paired it
    assert rows[head + 1] == ["hps_v21", "(trained)", "—", "0.7000", "+0.210", "[+0.174,", "+0.244]"]
    assert rows[head + 2] == ["clip", "(trained)", "—", "0.5000", "—"]
    assert rows[head + 3] == ["shapes_colour", "0.8000", "0.9000", "—"]
    assert out.rstrip().endswith("PROMOTED v1")

    (evaluation / "record.json").write_text('{"challenger_eval_uri": "s3://b/eval/v1"', encoding="utf-8")  # torn
    with pytest.raises(
        G2RPOError, match=r"evaluate/evaluation=.*record\.json: line 1.*ends early.*run the task that makes it again"
    ):
        print_summary(run, 12.0)
