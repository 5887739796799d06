"""The decision report: one self-contained HTML page that says whether a challenger was promoted and why.

The decide task writes it (a KFP ``HTML`` artifact, so the KFP UI shows it; ``run-local`` copies it
to ``decision-report.html`` in the run folder). It joins what the reader would otherwise find in
three places: the gates' decision (:class:`~g2rpo.artifacts.promotion.Decision`: each gate's numbers,
pass or fail, and its reason), the challenger's evaluation paired with its baseline (the champion,
else the base model: :func:`g2rpo.steps.candidates.evaluate_candidates`), and the same prompts'
images side by side — first, for each check scored 0 or 1 on every item (``shapes_colour_match``),
every item's image of each side framed by it, at a glance. Every metric is labelled trained (a
reward the run optimised) or held-out (a check it was not trained on). Images are embedded as data
URIs: the page needs no other file.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from g2rpo.artifacts.cache import fetch_to_cache
from g2rpo.artifacts.promotion import Decision
from g2rpo.artifacts.storage import S3Settings
from g2rpo.evaluation.artifact import MetricsDocument, PromptsDocument, read_document, read_scores
from g2rpo.steps.records import CandidatesRecord
from g2rpo.training.metrics import read_iteration_records

__all__ = ["binary_checks", "curve_title", "reward_curves_png", "write_decision_report"]

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 80em; }
.verdict { font-size: 1.4em; font-weight: bold; padding: 0.4em 0.6em; display: inline-block; }
.promoted { background: #e3f4e5; color: #067d17; } .refused { background: #fbe5e3; color: #b3261e; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #f3f3f3; }
td.text { text-align: left; max-width: 28em; }
td.pass { color: #067d17; font-weight: bold; } td.fail { color: #b3261e; font-weight: bold; }
figure { display: inline-block; margin: 0.2em; text-align: center; font-size: 0.75em; }
figure img { display: block; width: 128px; height: auto; image-rendering: pixelated; }
#curves { max-width: 100%; height: auto; }
.glance { display: flex; gap: 2em; flex-wrap: wrap; }
.glance h3 { margin: 0.2em 0; font-size: 1em; }
.grid { display: grid; grid-template-columns: repeat(16, 34px); gap: 2px; }
.grid img { width: 30px; height: 30px; border: 2px solid; image-rendering: pixelated; }
.grid img.holds { border-color: #1a9e2f; } .grid img.fails { border-color: #d93025; }
"""


def binary_checks(*evaluations: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """The metrics scored on every item of every evaluation whose values are all 0 or 1 (checks a
    person can read as right or wrong, such as ``shapes_colour_match``), in the first item's order."""
    items = [scores for evaluation in evaluations for scores in evaluation.values()]
    if not items:
        return []
    return [m for m in items[0] if all(m in scores and scores[m] in (0.0, 1.0) for scores in items)]


def _glance(
    metric: str,
    keys: list[tuple[str, int]],
    sides: list[tuple[str, Path, dict[tuple[str, int], dict[str, float]]]],
) -> list[str]:
    """The "at a glance" section: every item's image per side in the same order, framed green where
    ``metric`` holds and red where it fails, with each side's count."""
    e = html.escape
    counts = []
    grids = []
    for label, folder, values in sides:
        held = sum(values[key][metric] == 1.0 for key in keys)
        counts.append(f"{e(label)}: <b>{held} of {len(keys)}</b> ({held / len(keys):.1%})")
        images = []
        for key in keys:
            image = folder / f"{key[0]}_s{key[1]}.png"
            if image.is_file():
                css = "holds" if values[key][metric] == 1.0 else "fails"
                images.append(f"<img class='{css}' src='{_png(image)}' alt='{e(label)} {key[0]} seed {key[1]}'>")
        grids.append(f"<div><h3>{e(label)}</h3><div class='grid'>{''.join(images)}</div></div>")
    return [
        f"<h2 id='glance'>At a glance: {e(metric)}</h2>",
        f"<p>{e(metric)} scores each item 0 or 1. Every item (prompt × seed, prompts in order) of each side in "
        "the same places; a "
        "<span style='color:#1a9e2f'>green</span> frame: the check holds, <span style='color:#d93025'>red</span>: "
        f"it fails. {'; '.join(counts)}.</p>",
        f"<div class='glance'>{''.join(grids)}</div>",
    ]


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


CURVE_COLUMNS = 4  # panels per row: eight rewards make two rows that keep their labels legible on a page


def curve_title(name: str, trained: set[str]) -> str:
    """A training curve's title: the reward and whether it was trained on (the curves are of training
    prompts, so an untrained reward there is "not trained", not "held-out")."""
    return f"{name} ({'trained' if name in trained else 'not trained'})"


def reward_curves_png(records: list[dict], trained: set[str]) -> bytes:
    """One panel per reward, :data:`CURVE_COLUMNS` to a row: its rollout mean per training iteration (the
    training prompts, before that iteration's update), titled trained or not trained (a weight-0 reward:
    scored on the same training rollouts, never optimised — not the held-out evaluation)."""
    import matplotlib  # heavy: only this figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = records[0]["reward_names"]
    columns = min(CURVE_COLUMNS, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.2 * columns, 2.6 * rows), dpi=100, squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for r, (ax, name) in enumerate(zip(axes.flat, names, strict=False)):
        curve = [sum(rec["reward_mean"][r]) / len(rec["reward_mean"][r]) for rec in records]
        ax.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3)
        ax.set_title(curve_title(name, trained), fontsize=11)
        ax.set_xlabel("iteration", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def write_decision_report(
    path: str | Path,
    decision: Decision,
    candidates: CandidatesRecord,
    settings: S3Settings | None = None,
    train_dir: str | Path | None = None,
) -> Path:
    """Write the decision report of ``decision`` on the challenger that ``candidates`` describes; with
    ``train_dir`` holding the train task's ``metrics.jsonl``, its reward curves too."""
    e = html.escape
    uri = candidates.challenger_eval_uri
    root = Path(fetch_to_cache(uri, settings=settings))
    metrics = read_document(root, "metrics.json", uri, MetricsDocument)
    steps = metrics.num_steps  # the gated step count
    paired = metrics.baseline.paired.get(steps, {}) if metrics.baseline is not None else {}
    prompts = [p.prompt for p in read_document(root, "prompts.json", uri, PromptsDocument).prompts]
    scores = read_scores(root, uri)
    by_item = {(item.prompt_id, item.seed): item.scores for item in scores.items}
    baseline_items: dict[tuple[str, int], dict[str, float]] = {}
    if candidates.baseline_eval_uri:
        theirs = Path(fetch_to_cache(candidates.baseline_eval_uri, settings=settings))
        document = read_scores(theirs, candidates.baseline_eval_uri)
        baseline_items = {(item.prompt_id, item.seed): item.scores for item in document.items}
    trained = set(candidates.trained_metrics)
    baseline = candidates.baseline_label or "baseline"
    against = "absolute floors (no champion yet)" if decision.champion is None else f"champion v{decision.champion}"
    if decision.passed:
        verdict, css = f"v{decision.challenger}: gates met — promoted to champion by the promote task", "promoted"
    else:
        failed = [r for r in decision.results if not r.passed]
        verdict, css = (
            f"v{decision.challenger}: REFUSED — {len(failed)} of {len(decision.results)} gate(s) not met",
            "refused",
        )

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(decision.model)} v{decision.challenger}: decision</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(decision.model)} v{decision.challenger}: promotion decision</h1>",
        f"<p class='verdict {css}' id='verdict'>{e(verdict)}</p>",
        "<table id='facts'>",
        f"<tr><th>gated against</th><td class='text'>{e(against)}</td></tr>",
        f"<tr><th>compared with</th><td class='text'>{e(baseline)}: {e(candidates.baseline_eval_uri or 'none')}</td></tr>",
        f"<tr><th>trained on</th><td class='text'>{e(', '.join(sorted(trained)) or 'unknown')}</td></tr>",
        f"<tr><th>challenger's evaluation</th><td class='text'>{e(candidates.challenger_eval_uri)} "
        f"(report.html there: every image and plot)</td></tr>",
        f"<tr><th>items</th><td class='text'>{len(prompts)} held-out prompts × seeds {e(str(scores.seeds))}, "
        f"T={steps}</td></tr>",
        "</table>",
        "<h2>Gates</h2>",
        f"<p>Each gate's metric: the challenger's mean, the {e(baseline)}'s mean on the same (prompt, seed) items, "
        "the paired difference Δ = mean(challenger − baseline) with its 95 % bootstrap CI, and the gate's "
        "result and reason. <b>trained</b>: a reward the run optimised (it should improve); <b>held-out</b>: a "
        "check it was not trained on (it must not regress).</p>",
        f"<table id='gates'><tr><th>metric</th><th>role</th><th>gate</th><th>challenger</th><th>{e(baseline)}</th>"
        "<th>Δ (paired)</th><th>95% CI of Δ</th><th>result</th><th>reason</th></tr>",
    ]
    for r in decision.results:
        pair = paired.get(r.metric)
        delta = "—" if pair is None else f"{pair.delta:+.4f}"
        ci = "—" if pair is None else f"[{pair.ci_low:+.4f}, {pair.ci_high:+.4f}]"
        base_mean = None if pair is None else pair.baseline_mean
        role = "trained" if r.metric in trained else "held-out"
        parts.append(
            f"<tr><td class='text'>{e(r.metric)}</td><td class='text'>{role}</td><td class='text'>{e(r.kind)}</td>"
            f"<td>{_num(r.challenger_mean)}</td><td>{_num(base_mean)}</td><td>{delta}</td><td>{ci}</td>"
            f"<td class='{'pass' if r.passed else 'fail'}'>{'pass' if r.passed else 'FAIL'}</td>"
            f"<td class='text'>{e(r.reason)}</td></tr>"
        )
    parts.append("</table>")

    records_file = None if train_dir is None else Path(train_dir) / "metrics.jsonl"
    if records_file is not None and records_file.is_file():
        # The iteration records (the last of each, after a resume); events share the file.
        records = read_iteration_records(records_file)
        if records:
            png = base64.b64encode(reward_curves_png(records, trained)).decode("ascii")
            parts += [
                "<h2>Training</h2>",
                f"<p>Each reward's rollout mean over the {len(records)} iteration(s), on the training prompts: "
                "the rewards of weight 0 were scored on the same rollouts but not trained on (the evaluation "
                "above is on held-out prompts).</p>",
                f"<img id='curves' alt='reward curves' src='data:image/png;base64,{png}'>",
            ]

    keys = [(f"p{p}", seed) for p in range(len(prompts)) for seed in scores.seeds]
    paired_items = bool(baseline_items) and by_item.keys() == set(keys) and set(keys) <= baseline_items.keys()
    for check in binary_checks(by_item, baseline_items) if paired_items else []:
        sides = [(baseline, root / "baseline" / "images", baseline_items), ("challenger", root / "images", by_item)]
        parts += _glance(check, keys, sides)

    names = [r.metric for r in decision.results]
    parts += [
        f"<h2>The same prompts: {e(baseline)} | challenger</h2>",
        f"<table id='pairs'><tr><th>prompt</th><th>seed</th><th>{e(baseline)}</th><th>challenger</th></tr>",
    ]
    for p, prompt in enumerate(prompts):
        for seed in scores.seeds:
            ours = by_item.get((f"p{p}", seed), {})
            theirs_path = root / "baseline" / "images" / f"p{p}_s{seed}.png"
            cells = []
            for label, image, values in (
                (baseline, theirs_path, baseline_items.get((f"p{p}", seed), {})),
                ("challenger", root / "images" / f"p{p}_s{seed}.png", ours),
            ):
                if not image.is_file():
                    cells.append("<td>—</td>")
                    continue
                caption = "<br>".join(f"{e(m)} {values[m]:.3f}" for m in names if m in values) if values else ""
                cells.append(
                    f"<td><figure><img src='{_png(image)}' alt='{e(label)} p{p} seed {seed}'>"
                    f"<figcaption>{caption}</figcaption></figure></td>"
                )
            parts.append(f"<tr><td class='text'>p{p}: {e(prompt)}</td><td>{seed}</td>{''.join(cells)}</tr>")
    parts.append("</table></body></html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
