"""The whole alignment pipeline on this machine through ``kfp.local`` (what ``make demo`` runs).

:func:`run_local` runs the compiled DAG's tasks as subprocesses of this interpreter
(``SubprocessRunner(use_venv=False)``: kfp.local ignores the images and drops the cluster placement)
on the shapes task (:mod:`g2rpo.tasks.shapes`) with the settings of :func:`local_arguments`: the
shipped shapes model that never saw the held-out scenes (``g2rpo/models/shapes_flux_unseen``,
:mod:`g2rpo.models.shapes`; another ``model`` folder is pretrained on first use and reused after), all
360 of the task's prompts (296 train, 64 held out by the prepare task's split),
``configs/shapes-cpu.yaml`` (trained on the two learned rewards, every exact shapes metric scored) and
``configs/shapes-gates.yaml``. The run folder holds the KFP pipeline root (every task's
outputs), the tasks' temp files and ``pipeline.log`` (everything kfp.local printed); the store
(exports, evaluations), the registry and the prompt file are shared by every local run, so a second
run evaluates its challenger against the first run's champion.

kfp.local prints its own INFO lines, every task's executor input and outputs and the libraries'
warnings and loading bars: unless ``verbose``, the console gets one line per task (start, end,
status) and the lines the tasks themselves print (the decision), and the train task's progress is
read from its ``metrics.jsonl`` while it runs; the whole log is in ``pipeline.log`` either way.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from kfp import local

from g2rpo.artifacts.registry import Registry
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.shapes import HELD_OUT  # the task's 64 held-out prompts: evaluated, never trained on
from g2rpo.models.shapes import UNSEEN_PRETRAINING, ShapesPretraining, ensure_shapes_model
from g2rpo.rewards.shapes import IN_DOMAIN, IN_DOMAIN_CHECKS, OUT_OF_DOMAIN
from g2rpo.rewards.shapes_learned import SHIPPED_SHAPES_CLIP, SHIPPED_SHAPES_PREF
from g2rpo.steps.check import check_arguments, evaluation_for
from g2rpo.steps.evaluate import EvaluateResult, evaluate_once
from g2rpo.steps.parameters import pipeline_defaults
from g2rpo.steps.placement import load_profile
from g2rpo.steps.prepare import prepare_data
from g2rpo.steps.promote import floor_gates_file
from g2rpo.steps.train_task import train_config
from g2rpo.tasks.shapes import write_prompts
from g2rpo.textfile import read_json_file
from g2rpo.training.metrics import read_metrics_records
from pipelines.alignment import build_pipeline

__all__ = ["LOG_FILE", "LocalRun", "local_arguments", "run_local", "verdict"]

CHECKOUT = Path(__file__).resolve().parents[1]
COMPLETE_MARKER = ".complete"  # written into the pipeline root when the run has finished
LOG_FILE = "pipeline.log"  # in the run folder: everything kfp.local printed
PROMPTS_FILE = "shapes-prompts.txt"  # in the shared folder, rewritten by every run
MODEL_NAME = "g2rpo-shapes"
TRAIN_WATCH_S = 2.0  # how often the quiet console looks for new training records
# A task quiet this long gets a line that it still runs: on a busy CPU a task's start (its imports) or one
# figure can take longer than any of its own lines are apart.
QUIET_TASK_S = 5.0
# The paper's HPS-v2.1 + CLIP, learned on the shapes task (docs/models.md): what the demo trains on, as the
# full-size job trains on HPS + CLIP; the exact shapes rewards stay held-out ground truth (docs/demo.md).
LEARNED_REWARDS = {"hps_v21": SHIPPED_SHAPES_PREF, "clip": SHIPPED_SHAPES_CLIP}


@dataclass(frozen=True)
class LocalRun:
    """Where a local run left its outputs, and what the registry says now."""

    run_dir: Path
    pipeline_root: Path
    state: str  # the final status the exit task recorded
    outputs: dict[str, Path]  # name -> file or folder under the pipeline root
    decision: dict[str, Any]  # the decide task's record
    champion: int | None
    log: Path  # everything kfp.local printed
    base_means: dict[str, float]  # the base model on the evaluation's prompts and seeds; {} if not evaluated
    reports: dict[str, Path] = field(default_factory=dict)  # name -> an HTML report copied to a .html path
    base_eval_uri: str = ""  # the base model's evaluation (content-addressed in the store); "" if not evaluated
    metrics: list[str] = field(default_factory=list)  # the run's rewards, in its order


def local_arguments(shared: Path, iterations: int, model: Path) -> dict[str, Any]:
    """The pipeline's parameters for the shapes run on this CPU; ``shared`` holds the prompt file, the
    store and the registry, ``model`` the pretrained shapes model. Trained on the learned rewards
    (:data:`LEARNED_REWARDS`, weight 1); the task's exact rewards have weight 0, so they are scored
    (every iteration and in the evaluation) and gated as held-out ground truth but never trained on."""
    rewards = [{"name": name, "weight": 1.0, "weights": str(path)} for name, path in LEARNED_REWARDS.items()]
    rewards += [{"name": name, "weight": 0.0} for name in (*IN_DOMAIN, *IN_DOMAIN_CHECKS, *OUT_OF_DOMAIN)]
    return {
        "config_uri": str(CHECKOUT / "configs" / "shapes-cpu.yaml"),
        "base_model_uri": str(model),
        "prompts_uri": str(shared / PROMPTS_FILE),
        "store_uri": (shared / "store").as_uri(),
        "registry_uri": (shared / "registry").as_uri(),
        "model_name": MODEL_NAME,
        "rewards": rewards,
        "num_steps": 6,
        "group_size": 6,
        "granularities": [1, 2],
        "iterations": iterations,
        "learning_rate": 1e-3,
        "overrides": ["train.prompts_per_iteration=8", "train.checkpoint_every=10", "train.progress=false"],
        "test_size": HELD_OUT,
        "eval_seeds": [0, 1, 2, 3],
        "gates_uri": str(CHECKOUT / "configs" / "shapes-gates.yaml"),
        "gpus_per_node": "1",
        "train_pod_gpus": "1",  # the train pod's own GPUs follow (g2rpo/steps/train_pod.py; kfp.local ignores limits)
    }


def run_local(
    run_dir: Path,
    shared: Path,
    *,
    model: Path,
    iterations: int = 40,
    parameters: dict[str, Any] | None = None,
    pretraining: ShapesPretraining | None = None,
    verbose: bool = False,
    echo: Callable[[str], None] = lambda line: print(line, flush=True),
) -> LocalRun:
    """Run the pipeline into ``run_dir`` (its pipeline root must not exist yet) with :func:`local_arguments`
    updated by ``parameters``; pretrain the shapes model into ``model`` first when it is not there
    (``pretraining``'s settings, default those of the shipped ``shapes_flux_unseen``; an existing one must
    have been made with them)."""
    run_dir, shared, model = run_dir.resolve(), shared.resolve(), model.resolve()
    pretraining = pretraining or UNSEEN_PRETRAINING
    root = run_dir / "pipeline-root"
    if root.exists():
        finished = (root / COMPLETE_MARKER).is_file()
        raise G2RPOError(
            problem(
                "run folder",
                str(run_dir),
                "holds a finished run; choose another --name"
                if finished
                else "holds a partial pipeline root left by an interrupted run (nothing registered was lost); "
                f"delete {root} or choose another --name",
            )
        )
    # Every value, as the tasks will build it, before the pretraining (minutes) and the first folder.
    echo("checking the pipeline's parameters as its tasks will read them …")
    check_arguments({**local_arguments(shared, iterations, model), **(parameters or {})}, load_profile())
    # A run that fails before its pipeline starts removes the run folder it made, so the same command
    # again starts clean (a failure inside the pipeline keeps its pipeline root, refused above with the fix).
    made_run_dir = not run_dir.exists()
    try:
        if not model.exists():
            echo(
                f"pretraining the shapes model into {model} ({pretraining.vae_steps} VAE steps, "
                f"{pretraining.flow_steps} flow-matching steps; once, reused by every later run)"
            )
        model, made = ensure_shapes_model(model, pretraining, log=lambda line: echo(f"  {line}"), progress=not verbose)
        if not made:
            echo(f"shapes model: {model} (pretrained before; its settings match)")
        tmp = run_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        shared.mkdir(parents=True, exist_ok=True)
        write_prompts(shared / PROMPTS_FILE)  # every scene; the prepare task holds HELD_OUT of them out
        arguments = {**local_arguments(shared, iterations, model), **(parameters or {})}
        base_means: dict[str, float] = {}
        base_eval_uri = ""
        if "gates_uri" not in (parameters or {}):
            echo("base model: evaluating it on the held-out prompts (the first version's floors)")
            base = _evaluate_base(run_dir / "base", arguments, echo)
            base_means, base_eval_uri = base.means, base.output_uri
            echo("base model on the held-out prompts: " + _means_line(base_means))
            arguments["gates_uri"] = str(floor_gates_file(arguments["gates_uri"], base_means, run_dir / "gates.yaml"))
    except BaseException:
        if made_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    log = run_dir / LOG_FILE
    # Each task leaves a temp file behind, and the train task its checkpoints: keep them in the run folder.
    previous_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    try:
        with (
            log.open("w", encoding="utf-8") as log_file,
            _console(log_file, verbose, tmp, int(arguments["iterations"])),
        ):
            local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=False)
            pipeline = build_pipeline(load_profile())
            pipeline(**arguments)
    finally:
        if previous_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous_tmp
    (root / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    metrics = [str(reward["name"]) for reward in arguments.get("rewards") or []]
    return replace(_collect(run_dir, root, arguments, log, base_means), base_eval_uri=base_eval_uri, metrics=metrics)


# --------------------------------------------------------------------------- the console

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTING = re.compile(r" - INFO - Executing task '([^']+)'")
_FINISHED = re.compile(r" - INFO - Task '([^']+)' finished with status (\w+)")
_PIPELINE_DONE = re.compile(r" - INFO - Pipeline '([^']+)' finished with status (\w+)")
_STREAMED = " - INFO - Streamed logs:"
_PROGRESS_BAR = re.compile(r"\d+%\|.*\|")  # a tqdm line
_LIBRARY_WARNING = re.compile(r"^\[[\d\-: ,]+\] \[(WARNING|INFO)\]")  # DeepSpeed's logger format


class _QuietConsole(io.TextIOBase):
    """A stdout for kfp.local: every line goes to the log; the console gets a line per task and what
    the tasks print themselves (not KFP's executor lines, executor input, outputs, or loading bars)."""

    def __init__(self, log: TextIO, console: TextIO):
        self._log, self._console = log, console
        self._pending = ""
        self._streaming = False  # inside a task's streamed logs
        self._in_executor_input = False
        self._started: dict[str, float] = {}
        self._running: str | None = None  # the task kfp.local runs now
        self._last_echo = time.monotonic()
        self.lock = threading.RLock()  # held by the training watch across its own say() calls
        self.before_task_end: Callable[[], None] | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self.lock:
            self._log.write(text)
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._line(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        self._log.flush()

    def say(self, line: str) -> None:
        """A line of our own, written to the log too."""
        with self.lock:
            self._log.write(line + "\n")
            self._echo(line)

    def note(self, line: str) -> None:
        """A line for the log only."""
        with self.lock:
            self._log.write(line + "\n")

    def still_running(self, quiet_s: float = QUIET_TASK_S) -> None:
        """A line when the running task has printed nothing for ``quiet_s``: which task, and how long it has run."""
        with self.lock:
            now = time.monotonic()
            if self._running is not None and now - self._last_echo >= quiet_s:
                self._echo(f"    ({self._running}: {now - self._started[self._running]:.0f} s, still running)")

    def _echo(self, line: str) -> None:
        self._console.write(line + "\n")
        self._console.flush()
        self._last_echo = time.monotonic()

    def _line(self, line: str) -> None:
        if _FINISHED.search(line) and self.before_task_end is not None:
            self.before_task_end()  # the train task's last records, before the line that says it ended
        if match := _EXECUTING.search(line):
            self._started[match.group(1)] = time.monotonic()
            self._running, self._streaming = match.group(1), False
            self._echo(f"[{time.strftime('%H:%M:%S')}] {match.group(1)} …")
        elif match := _FINISHED.search(line):
            self._running, self._streaming = None, False
            seconds = time.monotonic() - self._started.get(match.group(1), time.monotonic())
            self._echo(f"[{time.strftime('%H:%M:%S')}] {match.group(1)}: {match.group(2)} ({seconds:.0f} s)")
        elif match := _PIPELINE_DONE.search(line):
            self._streaming = False
            self._echo(f"[{time.strftime('%H:%M:%S')}] pipeline {match.group(1)}: {match.group(2)}")
        elif _STREAMED in line:
            self._streaming = True
        elif self._streaming:
            self._task_line(line)

    def _task_line(self, line: str) -> None:
        text = line[4:] if line.startswith("    ") else line  # kfp.local indents a task's lines by 4
        if self._in_executor_input:
            self._in_executor_input = text != "}"  # the executor input is printed as indented JSON
            return
        if text.startswith("[KFP Executor"):
            self._in_executor_input = text.endswith("Got executor_input:")
            return
        last = text.split("\r")[-1]  # a progress bar's updates arrive as one line
        if last.strip() and not _PROGRESS_BAR.search(last) and not _LIBRARY_WARNING.match(last):
            self._echo(f"    {last}")


@contextlib.contextmanager
def _console(log: TextIO, verbose: bool, tmp: Path, iterations: int) -> Iterator[None]:
    """kfp.local's output (printed to stdout) into ``log`` and, unless ``verbose``, only the useful lines
    to this stdout, kfp.local's warnings into the log, and the train task's records as they are written."""
    if verbose:
        tee = _Tee(sys.stdout, log)
        with contextlib.redirect_stdout(tee):
            yield
        return
    console = _QuietConsole(log, sys.stdout)  # the stdout of before the redirection
    watch = _TrainingWatch(tmp, console, iterations)
    console.before_task_end = watch.catch_up
    stop = threading.Event()
    watcher = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(console):
        # kfp.local warns, per task, that the images and the cluster settings have no effect here.
        warnings.showwarning = lambda message, category, *_: console.note(f"{category.__name__}: {message}")
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO):
        self._streams = streams

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


class _TrainingWatch:
    """Print the train task's iteration records (its ``metrics.jsonl`` under the run's temp folder) as
    they appear: the train task itself prints nothing until it ends; and, at each look, that a quiet
    task still runs (:meth:`_QuietConsole.still_running`). The console calls :meth:`catch_up`
    before it prints a task's end, so no record is printed after the line that says training ended."""

    def __init__(self, tmp: Path, console: _QuietConsole, iterations: int):
        self._tmp, self._console, self._iterations = tmp, console, iterations
        self._seen = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(TRAIN_WATCH_S):
            self.catch_up()
            self._console.still_running()
        self.catch_up()  # the records written since the last look

    def catch_up(self) -> None:
        with self._console.lock:  # one reader at a time, and no task line between its records
            files = sorted(self._tmp.glob("g2rpo-train-*/metrics.jsonl"))
            if not files:
                return
            complete = read_metrics_records(files[-1])  # a record being written has no newline yet: left out
            for record in complete[self._seen :]:
                shown = _record_line(record, self._iterations)
                if shown:
                    self._console.say(f"    {shown}")
            self._seen = max(self._seen, len(complete))


def _record_line(record: dict[str, Any], iterations: int) -> str | None:
    """The line of one ``metrics.jsonl`` record: an iteration, a validation, an early stop; other events none."""
    event = record.get("event")
    if event is None:
        return _iteration_line(record, iterations)
    if event == "validation":
        means = " · ".join(f"{_short(name)} {m['mean']:.3f}" for name, m in record["metrics"].items())
        beyond = f", beyond tolerance: {', '.join(record['breached'])}" if record["breached"] else ""
        chosen = record["selected_iteration"]
        return f"validate {record['iteration']}/{iterations}: objective {record['objective']:.4f} ({means}{beyond})" + (
            "" if chosen is None else f"; export would take {chosen}"
        )
    if event == "early_stop":
        return f"early stop at {record['iteration']}/{iterations}: {record['reason']}"
    return None


def _iteration_line(record: dict[str, Any], iterations: int) -> str:
    """``train 3/30: colour 0.812 · shape 0.640 · … (1.2 s)``: the iteration's rollout mean of each reward
    and its time."""
    means = [sum(row) / len(row) for row in record["reward_mean"]]
    rewards = " · ".join(f"{_short(name)} {mean:.3f}" for name, mean in zip(record["reward_names"], means, strict=True))
    seconds = sum(record.get("seconds", {}).values())
    return f"train {record['iteration'] + 1}/{iterations}: {rewards} ({seconds:.1f} s)"


def _evaluate_base(folder: Path, arguments: dict[str, Any], echo: Callable[[str], None]) -> EvaluateResult:
    """The base model's means on what the pipeline's evaluate task will sample: the prepare task's
    held-out split (the same prompts, ``test_size`` and seed give the same split) × ``eval_seeds``,
    sampled as the run config says; published at its content address in the run's store, so that the
    evaluate task (and every later run) reads it back instead of scoring the base model again."""
    values = {**pipeline_defaults(), **arguments}  # the pipeline's defaults where the demo sets none
    data = prepare_data(
        values["prompts_uri"], folder / "data", test_size=values["test_size"], seed=values["split_seed"]
    )
    config = train_config(values, prompts=str(data.train_prompts), output_dir=folder / "unused")
    evaluation = evaluation_for(values, config, str(data.test_prompts))
    evaluations = f"{arguments['store_uri'].rstrip('/')}/evaluations"
    # Scored once per settings: the evaluate task of a first version reads this evaluation back, and a
    # later run reuses it (verified; g2rpo.evaluation.identity).
    return evaluate_once(
        arguments["base_model_uri"],
        evaluation,
        evaluations,
        label="base model",
        progress=True,
        log=lambda line: echo(f"    {line}"),
    )


def _means_line(means: dict[str, float]) -> str:
    return " · ".join(f"{_short(name)} {value:.4f}" for name, value in means.items())


def _short(metric: str) -> str:
    """``shapes_colour`` → ``colour``, ``jpeg_compressibility`` → ``jpeg``: the console's metric names."""
    return metric.removeprefix("shapes_").removesuffix("_compressibility")


def verdict(run: LocalRun) -> str:
    """The run's one closing line: ``PROMOTED vN`` or ``REFUSED vN: <why>`` — the model's verdict, worded
    apart from the run's state (a run that succeeded may well refuse its model)."""
    decision = run.decision
    if not decision:
        return f"NO VERDICT: the run {run.state} before its decision (see {run.log})"
    version = decision["version"]
    if run.champion == version:
        return f"PROMOTED v{version}"
    if decision["passed"]:  # the gates held at decide, but promote did not move the alias
        return f"REFUSED v{version}: the promote task did not make it champion (the run {run.state}; see {run.log})"
    failed = [reason.replace(": FAIL: ", ": ", 1) for reason in decision["reasons"] if ": FAIL: " in reason]
    return f"REFUSED v{version}: " + "; ".join(failed)


def _collect(run_dir: Path, root: Path, arguments: dict[str, Any], log: Path, base_means: dict[str, float]) -> LocalRun:
    """Find each task's outputs under the pipeline root (``<root>/<run>/<task>/<output>``)."""
    outputs: dict[str, Path] = {}
    for path in sorted(root.glob("*/*/*")):
        if path.name != "executor_output.json":
            outputs[f"{path.parent.name}/{path.name}"] = path
    # Each task writes its record whole; one that does not read is named (with where the run's outputs and
    # log are) rather than ending the run's summary in a traceback.
    fix = f"the task was cut short or its output changed; the run's outputs are under {root}, its log is {log}"
    status = outputs.get("report-status/record")
    state = (
        str(read_json_file(status, what="report-status record", fix=fix).get("state", "UNKNOWN"))
        if status is not None and status.is_file()
        else "UNKNOWN"
    )
    decision_file = root.glob("*/decide/decision/record.json")
    decision = next((read_json_file(p, what="decision record", fix=fix) for p in decision_file), {})
    champion = Registry(arguments["registry_uri"]).read_state(arguments["model_name"])[0].aliases.get("champion")
    # A KFP HTML artifact is a file without an extension: a browser opened on it shows its source.
    # Copies with one, in the run folder, open as pages.
    reports = {}
    for output, name in (("decide/report", "decision-report.html"), ("evaluate/report", "evaluation-summary.html")):
        if output in outputs and outputs[output].is_file():
            reports[name] = Path(shutil.copyfile(outputs[output], run_dir / name))
    return LocalRun(
        run_dir=run_dir,
        pipeline_root=root,
        state=state,
        outputs=outputs,
        decision=decision,
        champion=champion,
        log=log,
        base_means=base_means,
        reports=reports,
    )
