"""The evaluation's numbers and report: metrics.json, plots and a self-contained report.html.

Every number here comes from the per-image scores through :mod:`g2rpo.artifacts.scores`, the code
the registry and the promotion gates use: a metric's mean and 95 % CI at ``num_steps`` are those of
:func:`~g2rpo.artifacts.scores.summarize` on scores.json, which is what a registered version's eval
record holds, and a paired difference with a baseline is
:func:`~g2rpo.artifacts.scores.paired_differences` with the gates' default bootstrap (2000 resamples,
seed 0, 95 %). ``report.html`` refers only to files inside the artifact (``images/``, ``baseline/``,
``plots/``) by relative paths, so it renders from the artifact's folder alone.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from g2rpo.artifacts.scores import EvalScores, bootstrap_mean_ci, paired_differences, summarize

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "CONFIDENCE",
    "summaries",
    "paired_summaries",
    "save_distribution_plot",
    "save_scatter_plot",
    "write_report_html",
]

# The promotion gates' defaults (g2rpo/gates/default.yaml) and the registry's eval record's.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95

Summary = dict[str, float | int]


def summaries(scores: EvalScores) -> dict[str, Summary]:
    """Per metric: mean, std (sample, ddof 1; 0 for one item), n and the bootstrap CI of the mean."""
    out: dict[str, Summary] = {}
    for metric, summary in summarize(scores, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE).items():
        values = np.array(list(scores.keyed(metric).values()), dtype=np.float64)  # [N]
        std = float(values.std(ddof=1)) if values.size > 1 else 0.0
        out[metric] = {
            "mean": summary.mean,
            "std": std,
            "n": summary.n,
            "ci_low": summary.ci_low,
            "ci_high": summary.ci_high,
        }
    return out


def paired_summaries(ours: EvalScores, baseline: EvalScores) -> dict[str, Summary]:
    """Per metric both scored: this evaluation − the baseline, paired by (prompt, seed): the means,
    the mean difference and its bootstrap CI. The caller has checked that the inputs are the same."""
    out: dict[str, Summary] = {}
    for metric in sorted(set(ours.metric_names()) & set(baseline.metric_names())):
        diff = paired_differences(ours, baseline, metric)  # [N]
        low, high = bootstrap_mean_ci(diff, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE)
        out[metric] = {
            "mean": float(np.mean(list(ours.keyed(metric).values()))),
            "baseline_mean": float(np.mean(list(baseline.keyed(metric).values()))),
            "delta": float(diff.mean()),
            "ci_low": low,
            "ci_high": high,
            "n": int(diff.size),
        }
    return out


def _pyplot():
    import matplotlib  # heavy: only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_distribution_plot(by_steps: Mapping[int, EvalScores], metric: str, path: Path) -> Path:
    """Histogram of one metric's per-image scores, one series per step count."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.0), dpi=100)
    for steps, scores in by_steps.items():
        values = list(scores.keyed(metric).values())
        ax.hist(values, bins=min(30, max(5, len(values))), alpha=0.55, label=f"T={steps} (n={len(values)})")
    ax.set_xlabel(metric)
    ax.set_ylabel("images")
    ax.set_title(f"{metric}: per-image scores", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def save_scatter_plot(ours: EvalScores, baseline: EvalScores, metric: str, steps: int, path: Path) -> Path:
    """Per (prompt, seed): the baseline's score (x) against this evaluation's (y), with y = x."""
    plt = _pyplot()
    a, b = ours.keyed(metric), baseline.keyed(metric)
    keys = sorted(a)
    x, y = [b[k] for k in keys], [a[k] for k in keys]
    fig, ax = plt.subplots(figsize=(3.6, 3.6), dpi=100)
    ax.scatter(x, y, s=12, alpha=0.7)
    low, high = min(x + y), max(x + y)
    ax.plot([low, high], [low, high], "--", color="grey", linewidth=1)
    ax.set_xlabel("baseline", fontsize=8)
    ax.set_ylabel("this model", fontsize=8)
    # two short lines: one long line was cut at the figure's edges
    ax.set_title(f"{metric} (T={steps})\nabove the line: higher here", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #f3f3f3; }
td.prompt { text-align: left; max-width: 18em; }
figure { display: inline-block; margin: 0.2em; text-align: center; font-size: 0.75em; }
figure img { display: block; width: 128px; height: auto; image-rendering: pixelated; }
#grid-index td.prompt { max-width: 48em; }
figure.page { display: block; text-align: left; font-size: 0.9em; }
figure.page img { width: auto; max-width: 100%; image-rendering: auto; }
.pos { color: #067d17; } .neg { color: #b3261e; }
td.trained { text-align: left; font-weight: bold; } td.held-out { text-align: left; color: #555; }
"""


def _grid_pages_html(pages: list[tuple[str, list[int]]], prompts: list[str]) -> list[str]:
    """The grid's pages: an index (each page, the prompts it shows, linked), then every page at full width."""
    e = html.escape
    shown = sum(len(rows) for _, rows in pages)
    parts = [
        "<h2>Grid pages</h2>",
        f"<p>{len(pages)} page(s) of at most {max(len(rows) for _, rows in pages)} prompts (rows) by the seeds "
        f"(columns), each image titled with its scores; {shown} of {len(prompts)} prompts"
        + ("" if shown == len(prompts) else " (every image is in the table below)")
        + ".</p>",
        "<table id='grid-index'><tr><th>page</th><th>prompts</th></tr>",
    ]
    for number, (path, rows) in enumerate(pages, start=1):
        listed = "<br>".join(f"p{p}: {e(prompts[p])}" for p in rows)
        parts.append(
            f"<tr><td><a href='#grid-page-{number}'>{number}</a> (<a href='{e(path)}'>{e(path)}</a>)</td>"
            f"<td class='prompt'>{listed}</td></tr>"
        )
    parts.append("</table>")
    for number, (path, rows) in enumerate(pages, start=1):
        parts.append(
            f"<figure class='page' id='grid-page-{number}'><figcaption>page {number}: p{rows[0]}-p{rows[-1]}"
            f"</figcaption><a href='{e(path)}'><img src='{e(path)}' alt='grid page {number}'></a></figure>"
        )
    return parts


def _num(x: float) -> str:
    return f"{x:.4f}"


def _ci(low: float, high: float) -> str:
    return f"[{low:.4f}, {high:.4f}]"


def _figure(src: str, caption: str) -> str:
    return f'<figure><img src="{html.escape(src)}" alt="{html.escape(caption)}"><figcaption>{caption}</figcaption></figure>'


def write_report_html(
    path: Path,
    *,
    title: str,
    facts: Mapping[str, str],
    num_steps: int,
    prompts: list[str],
    seeds: list[int],
    by_steps: Mapping[int, EvalScores],
    metrics: Mapping[str, Mapping[str, Summary]],
    image_of: Callable[[int, int, int], str],
    plots: list[str],
    grid_pages: list[tuple[str, list[int]]] | None = None,
    paired: Mapping[str, Mapping[str, Summary]] | None = None,
    baseline_by_steps: Mapping[int, EvalScores] | None = None,
    baseline_image_of: Callable[[int, int, int], str] | None = None,
    trained_metrics: list[str] | None = None,
) -> Path:
    """Write the report: facts, the metrics table, plots, the image grid, and with a baseline the
    paired differences and side-by-side pairs. ``image_of(steps, prompt_index, seed)`` is an image's
    path relative to the report; ``metrics``/``paired`` are keyed by step count (as text), then metric.
    With ``trained_metrics`` every metric is labelled trained (the model was optimised for it) or
    held-out (a check it was not trained on). ``grid_pages``: each page of the grid (its path, the
    prompt indices it shows), listed with its prompts (the index: prompt → page) and shown below."""
    e = html.escape

    def role(metric: str) -> str:
        if trained_metrics is None:
            return ""
        label = "trained" if metric in trained_metrics else "held-out"
        return f"<td class='{label}'>{label}</td>"

    role_head = "<th>role</th>" if trained_metrics is not None else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<table id='facts'>"
        + "".join(f"<tr><th>{e(k)}</th><td class='prompt'>{e(v)}</td></tr>" for k, v in facts.items())
        + "</table>",
        "<h2>Scores</h2>",
        f"<p>Mean over every (prompt, seed), sample std, n, and the {CONFIDENCE:.0%} percentile-bootstrap CI of the "
        f"mean ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}). The promotion gates read T={num_steps} "
        "(scores.json); other step counts are reported, not gated.</p>",
        f"<table id='metrics'><tr><th>metric</th>{role_head}<th>T</th><th>mean</th><th>std</th><th>n</th><th>95% CI</th></tr>",
    ]
    for steps, table in metrics.items():
        for metric, s in table.items():
            gated = " (gated)" if int(steps) == num_steps else ""
            parts.append(
                f"<tr><td class='prompt'>{e(metric)}</td>{role(metric)}<td>{e(steps)}{gated}</td><td>{_num(s['mean'])}</td>"
                f"<td>{_num(s['std'])}</td><td>{s['n']}</td><td>{_ci(s['ci_low'], s['ci_high'])}</td></tr>"
            )
    parts.append("</table>")
    if paired:
        parts += [
            "<h2>Against the baseline</h2>",
            "<p>Paired by (prompt, seed): Δ = mean of (this − baseline) per image, with its "
            f"{CONFIDENCE:.0%} bootstrap CI; the gates apply each metric's direction to these numbers.</p>",
            f"<table id='paired'><tr><th>metric</th>{role_head}<th>T</th><th>baseline</th><th>this</th><th>Δ</th>"
            "<th>95% CI of Δ</th><th>n</th></tr>",
        ]
        for steps, table in paired.items():
            for metric, s in table.items():
                sign = "pos" if s["ci_low"] > 0 else "neg" if s["ci_high"] < 0 else ""
                parts.append(
                    f"<tr><td class='prompt'>{e(metric)}</td>{role(metric)}<td>{e(steps)}</td><td>{_num(s['baseline_mean'])}</td>"
                    f"<td>{_num(s['mean'])}</td><td class='{sign}'>{s['delta']:+.4f}</td>"
                    f"<td>{_ci(s['ci_low'], s['ci_high'])}</td><td>{s['n']}</td></tr>"
                )
        parts.append("</table>")
    if plots:
        parts.append("<h2>Plots</h2><div id='plots'>")
        parts += [f'<img src="{e(p)}" alt="{e(p)}">' for p in plots]
        parts.append("</div>")
    if grid_pages:
        parts += _grid_pages_html(grid_pages, prompts)
    parts.append("<h2>Images</h2><table id='images'><tr><th>prompt</th>")
    parts += [f"<th>seed {seed}</th>" for seed in seeds]
    parts.append("</tr>")
    for p, prompt in enumerate(prompts):
        parts.append(f"<tr><td class='prompt'>p{p}: {e(prompt)}</td>")
        for seed in seeds:
            cell = []
            for steps, scores in by_steps.items():
                item = scores.keyed_item(f"p{p}", seed)
                caption = f"T={steps}<br>" + "<br>".join(f"{e(m)} {_num(v)}" for m, v in item.items())
                cell.append(_figure(image_of(steps, p, seed), caption))
            parts.append("<td>" + "".join(cell) + "</td>")
        parts.append("</tr>")
    parts.append("</table>")
    if paired and baseline_by_steps and baseline_image_of:
        parts.append(
            "<h2>Side by side: baseline | this model</h2><table id='pairs'><tr><th>prompt</th><th>seed</th><th>T</th><th>baseline</th><th>this</th><th>Δ</th></tr>"
        )
        for p, prompt in enumerate(prompts):
            for seed in seeds:
                for steps, base in baseline_by_steps.items():
                    ours = by_steps[steps].keyed_item(f"p{p}", seed)
                    theirs = base.keyed_item(f"p{p}", seed)
                    common = [m for m in ours if m in theirs]
                    parts.append(
                        f"<tr><td class='prompt'>p{p}: {e(prompt)}</td><td>{seed}</td><td>{steps}</td>"
                        f"<td>{_figure(baseline_image_of(steps, p, seed), '<br>'.join(f'{e(m)} {_num(theirs[m])}' for m in common))}</td>"
                        f"<td>{_figure(image_of(steps, p, seed), '<br>'.join(f'{e(m)} {_num(ours[m])}' for m in common))}</td>"
                        "<td class='prompt'>"
                        + "<br>".join(f"{e(m)} {ours[m] - theirs[m]:+.4f}" for m in common)
                        + "</td></tr>"
                    )
        parts.append("</table>")
    parts.append("</body></html>\n")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
