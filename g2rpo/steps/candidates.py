"""Step **evaluate**, as the pipeline runs it: the challenger, and the champion on the same prompts and seeds.

:func:`champion_of` resolves the registry's champion to its published export. :func:`evaluate_candidates`
evaluates the trained export (the train task's :class:`~g2rpo.steps.records.TrainRecord`) with the
evaluation that samples as the run did (:func:`~g2rpo.steps.train.matching_evaluation`), then — when the
model has a champion — the champion's export on exactly the same prompts, seeds and sampler, so the
promotion gates compare paired items. The challenger's evaluation always has a baseline, evaluated
first: the champion, else the base model it was trained from, so that its report (and the decision
report) shows the paired differences and the same prompts' images side by side. The evaluations are
published under the run's store; the task's
folder receives a :class:`~g2rpo.steps.records.CandidatesRecord` and a self-contained ``report.html``,
and with a Pushgateway URL both summaries are pushed there (:func:`g2rpo.observability.push_evaluations`).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.storage import S3Settings, open_store
from g2rpo.config import load_config
from g2rpo.evaluation.artifact import grid_page_files
from g2rpo.observability.push import PushTarget, push_evaluations
from g2rpo.steps.evaluate import EvaluateResult, evaluate_once
from g2rpo.steps.records import CandidatesRecord, TrainRecord, read_record, write_record
from g2rpo.steps.train import matching_evaluation
from g2rpo.training.run_config import RunConfig

__all__ = ["ChampionRef", "champion_of", "evaluate_candidates", "report_html", "validation_html"]


@dataclass(frozen=True)
class ChampionRef:
    """The registry's champion of a model."""

    model: str
    version: int
    export_uri: str


def champion_of(registry_uri: str, model: str, settings: S3Settings | None = None) -> ChampionRef | None:
    """The champion of ``model`` and its export's URI; None when the model has none (or no versions yet)."""
    registry = Registry(registry_uri, settings)
    state, _ = registry.read_state(model)
    version = state.aliases.get("champion")
    if version is None:
        return None
    return ChampionRef(model=model, version=version, export_uri=registry.get_version(model, version).export.uri)


def evaluate_candidates(
    train_dir: str | Path,
    prompts: str,
    *,
    registry_uri: str,
    model: str,
    store_uri: str,
    output_dir: str | Path,
    report_path: str | Path,
    num_prompts: int | None = None,
    seeds: list[int] | tuple[int, ...] = (0, 1, 2),
    settings: S3Settings | None = None,
    pushgateway_url: str = "",
    pipeline: str = "g2rpo-alignment",
    progress: bool = True,
) -> CandidatesRecord:
    """Evaluate the challenger of ``train_dir`` (and the champion, if any) on ``prompts`` × ``seeds``;
    with ``progress`` (the pipeline's task: its log then says how far each evaluation is) a line per
    chunk on stderr.

    With ``pushgateway_url`` both summaries go there in one push, labelled ``version="challenger"`` and
    ``version="v<champion>"``, under ``pipeline`` (a gateway that is down is a warning)."""
    trained = read_record(TrainRecord, train_dir, field="train")
    config = load_config(RunConfig, Path(train_dir) / trained.run_config)
    evaluation = matching_evaluation(config, prompts, num_prompts=num_prompts, seeds=seeds)
    base = f"{store_uri.rstrip('/')}/evaluations"
    champion_ref = champion_of(registry_uri, model, settings)
    champion = None
    # Each model scored once per settings (evaluate_once): the base model evaluated before the DAG, and a
    # champion that was a challenger before, are read back from the store, verified, not sampled again.
    if champion_ref is not None:
        # The champion on the pipeline's base model: a retraining run keeps its model's base.
        champion = evaluate_once(
            champion_ref.export_uri,
            evaluation,
            base,
            label=f"champion v{champion_ref.version}",
            base_model_uri=trained.base_model_uri,
            settings=settings,
            progress=progress,
        )
        baseline, baseline_label = champion, f"champion v{champion_ref.version}"
    else:  # a first version: the base model is what it must be compared with
        baseline = evaluate_once(
            trained.base_model_uri, evaluation, base, label="base model", settings=settings, progress=progress
        )
        baseline_label = "base model"
    challenger = evaluate_once(
        trained.export_uri,
        evaluation,
        base,
        label="challenger",
        base_model_uri=trained.base_model_uri,
        baseline_uri=baseline.output_uri,
        settings=settings,
        baseline_label=baseline_label,
        progress=progress,
    )
    record = CandidatesRecord(
        challenger_eval_uri=challenger.output_uri,
        champion_eval_uri=None if champion is None else champion.output_uri,
        champion_version=None if champion_ref is None else champion_ref.version,
        challenger_means=challenger.means,
        champion_means={} if champion is None else champion.means,
        baseline_label=baseline_label,
        baseline_eval_uri=baseline.output_uri,
        baseline_means=baseline.means,
        trained_metrics=evaluation.trained_metrics or [],
        paired={
            metric: {key: float(summary[key]) for key in ("delta", "ci_low", "ci_high", "n")}
            for metric, summary in challenger.paired.get(evaluation.num_steps, {}).items()
        },
    )
    if pushgateway_url:
        # One push for both: a second push of the job would replace the first.
        by_version = {"challenger": challenger.by_steps}
        if champion is not None:
            by_version[f"v{champion_ref.version}"] = champion.by_steps
        push_evaluations(PushTarget(pushgateway_url, pipeline=pipeline), by_version)
    write_record(record, output_dir)
    Path(report_path).parent.mkdir(parents=True, exist_ok=True)
    Path(report_path).write_text(report_html(record, challenger, baseline, settings, trained), encoding="utf-8")
    return record


def report_html(
    record: CandidatesRecord,
    challenger: EvaluateResult,
    baseline: EvaluateResult | None,
    settings: S3Settings | None = None,
    trained: TrainRecord | None = None,
) -> str:
    """One self-contained HTML page (what the KFP UI shows): the metrics of the challenger and its
    baseline side by side, each labelled trained or held-out, each grid image, and, when the run
    validated during training (``trained``), its validation curve and the iteration the challenger's
    export holds."""
    metrics = sorted(set(record.challenger_means) | set(record.baseline_means))
    trained_metrics = set(record.trained_metrics)
    rows = "".join(
        f"<tr><td>{html.escape(m)}</td><td>{'trained' if m in trained_metrics else 'held-out'}</td>"
        f"<td>{record.challenger_means.get(m, float('nan')):.4f}</td><td>{_cell(record.baseline_means.get(m))}</td></tr>"
        for m in metrics
    )
    baseline_head = record.baseline_label or "—"
    parts = [
        "<!doctype html><meta charset='utf-8'><title>g2rpo evaluation</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}</style>",
        f"<h1>Evaluation: challenger vs {html.escape(baseline_head)}</h1>",
        f"<p>{len(challenger.scores.seeds)} seeds, prompt set {html.escape(challenger.scores.prompt_set)}; the "
        "decide task's decision report has the gates, the paired differences and the images side by side</p>",
        f"<table><tr><th>metric (mean)</th><th>role</th><th>challenger</th><th>{html.escape(baseline_head)}</th></tr>"
        f"{rows}</table>",
    ]
    for label, result in (("challenger", challenger), (baseline_head, baseline)):
        if result is None:
            continue
        store = open_store(result.output_uri, settings)
        pages = grid_page_files(store)
        if pages:
            parts.append(f"<h2>{html.escape(label)}</h2>")
        for number, page in enumerate(pages, start=1):
            png = base64.b64encode(store.get_bytes(page)[0]).decode("ascii")
            parts.append(
                f"<img alt='{html.escape(label)} samples, grid page {number}' src='data:image/png;base64,{png}'>"
            )
        parts.append(f"<p><code>{html.escape(result.output_uri)}</code></p>")
    if trained is not None and trained.validation_curve:
        parts.append(validation_html(trained))
    return "\n".join(parts) + "\n"


def validation_html(trained: TrainRecord) -> str:
    """The run's validation curve as a table (one row per validation; the exported one marked) with
    the chosen iteration, why, and the early stop if there was one."""
    curve = trained.validation_curve
    metrics = list(curve[0]["means"])
    head = "".join(f"<th>{html.escape(m)}</th>" for m in metrics)
    rows = []
    for point in curve:
        chosen = point["iteration"] == trained.selected_iteration
        cells = "".join(f"<td>{point['means'][m]:.4f}</td>" for m in metrics)
        beyond = html.escape(", ".join(point["breached"])) or "—"
        mark = " style='font-weight:bold'" if chosen else ""
        label = f"{point['iteration']}{' (exported)' if chosen else ''}{' (baseline)' if point is curve[0] else ''}"
        rows.append(f"<tr{mark}><td>{label}</td><td>{point['objective']:.4f}</td>{cells}<td>{beyond}</td></tr>")
    if trained.selected_iteration is None:
        chosen_text = f"The export holds the last iteration ({trained.iterations})."
    else:
        chosen_text = (
            f"The export holds iteration {trained.selected_iteration} of {trained.iterations}: "
            f"{html.escape(trained.selection_reason or '')}."
        )
    stop = "" if trained.early_stop is None else f"<p>Stopped early: {html.escape(trained.early_stop)}.</p>"
    return (
        "<h2>Validation during training</h2>"
        f"<p>{chosen_text}</p>{stop}"
        "<table><tr><th>iteration</th><th>objective</th>"
        f"{head}<th>beyond tolerance</th></tr>{''.join(rows)}</table>"
    )


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"
