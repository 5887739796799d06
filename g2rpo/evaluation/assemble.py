"""Gathering an evaluation's scored chunks into the artifact's files, ready to publish.

:func:`assemble` reads every chunk of the partial state under the output
(:mod:`g2rpo.evaluation.resume`) and writes the artifact's layout (:mod:`g2rpo.evaluation.artifact`)
into a local folder: the images, ``scores.json``, ``scores.jsonl``, ``prompts.json``, ``metrics.json``,
the plots, the grid's pages (``grid/``, with ``grid.png`` its first page) and ``report.html`` (:mod:`g2rpo.evaluation.report`), with a baseline its
paired numbers, scatters and images. It returns the manifest's metadata; the caller publishes the folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.artifacts.storage import Store
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation import report, resume
from g2rpo.evaluation.artifact import Baseline, PromptSet, eval_result_from, save_score_grid_pages, step_image_name
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.rewards.specs import get_spec

__all__ = ["assemble"]


def assemble(
    root: Path,
    model_uri: str,
    config: EvaluationConfig,
    prompt_set: PromptSet,
    chunks: list[resume.Chunk],
    store: Store,
    output_uri: str,
    baseline: Baseline | None,
    paired_steps: list[int],
    baseline_label: str = "",
    say: Callable[[str], None] = lambda _: None,
) -> dict:
    """Gather every chunk from the output's partial state into the artifact's files under ``root``;
    the manifest's metadata. ``say`` gets a line as each part is drawn (the figures take seconds)."""
    prompts, seeds, num_steps = prompt_set.prompts, config.seeds, config.num_steps
    done = resume.done_chunks(store)
    missing = [chunk.name for chunk in chunks if chunk.name not in done]
    if missing:
        raise G2RPOError(
            problem(
                "output_uri", output_uri, f"lacks scored chunks {missing[:3]} after sampling; run the evaluation again"
            )
        )
    lines: list[dict] = []
    items: dict[int, dict[tuple[int, int], dict[str, float]]] = {steps: {} for steps in config.step_counts}
    for chunk in chunks:
        for item in resume.read_chunk(store, chunk.name).items:
            name = step_image_name(item.steps, num_steps, item.prompt_index, item.seed)
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            store.get_file(item.image, root / name)
            items[item.steps][(item.prompt_index, item.seed)] = item.scores
    by_steps: dict[int, EvalScores] = {}
    for steps in config.step_counts:
        by_steps[steps] = EvalScores(
            prompt_set=prompt_set.uri,
            prompt_set_sha256=prompt_set.sha256,
            seeds=list(seeds),
            items=[
                ScoreItem(prompt_id=f"p{p}", seed=seed, scores=items[steps][(p, seed)])
                for p in range(len(prompts))
                for seed in seeds
            ],
            definitions={m.name: get_spec(m.name).definition for m in config.rewards.models},
        )
        lines += [
            {
                "steps": steps,
                "prompt_id": f"p{p}",
                "prompt": prompts[p],
                "seed": seed,
                "image": step_image_name(steps, num_steps, p, seed),
                "scores": items[steps][(p, seed)],
            }
            for p in range(len(prompts))
            for seed in seeds
        ]
    scores = by_steps[num_steps]
    _write_json(root / "scores.json", scores.model_dump(mode="json"))
    (root / "scores.jsonl").write_text(
        "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8"
    )
    _write_json(
        root / "prompts.json",
        {
            "prompt_set": prompt_set.uri,
            "prompt_set_sha256": prompt_set.sha256,
            "seeds": list(seeds),
            "prompts": [{"prompt_id": f"p{i}", "prompt": text} for i, text in enumerate(prompts)],
        },
    )
    summaries = {str(steps): report.summaries(s) for steps, s in by_steps.items()}
    paired: dict[str, dict] = {}
    plots = []
    (root / "plots").mkdir()
    metric_names = scores.metric_names()
    for metric in metric_names:
        plots.append(f"plots/distribution_{metric}.png")
        report.save_distribution_plot(by_steps, metric, root / plots[-1])
    say(f"{len(metric_names)} distribution plot(s) drawn")
    baseline_images = {}
    if baseline is not None:
        for steps in paired_steps:
            # the baseline's records carry its own prompt_set URI: its content was checked equal
            theirs = baseline.by_steps[steps].model_copy(
                update={"prompt_set": prompt_set.uri, "prompt_set_sha256": prompt_set.sha256}
            )
            paired[str(steps)] = report.paired_summaries(by_steps[steps], theirs)
            for metric in paired[str(steps)]:
                plots.append(f"plots/scatter_{metric}_T{steps}.png")
                report.save_scatter_plot(by_steps[steps], theirs, metric, steps, root / plots[-1])
            for p in range(len(prompts)):
                for seed in seeds:
                    name = "baseline/" + step_image_name(steps, num_steps, p, seed)
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes((baseline.root / baseline.images[(steps, p, seed)]).read_bytes())
                    baseline_images[(steps, p, seed)] = name
        say(f"paired with the baseline: {sum(len(v) for v in paired.values())} scatter plot(s) drawn")
    _write_json(
        root / "metrics.json",
        {
            "num_steps": num_steps,
            "step_counts": config.step_counts,
            "confidence": report.CONFIDENCE,
            "bootstrap_resamples": report.BOOTSTRAP_RESAMPLES,
            "bootstrap_seed": report.BOOTSTRAP_SEED,
            "by_steps": summaries,
            "definitions": scores.definitions,
            **({"baseline": {"uri": baseline.uri, "paired": paired}} if baseline is not None else {}),
        },
    )
    primary = eval_result_from(root, prompts, seeds, scores, output_uri)
    pages = save_score_grid_pages(primary, root, say=say)
    report.write_report_html(
        root / "report.html",
        title=f"Evaluation of {model_uri}",
        facts={
            "model": model_uri,
            "prompt set": f"{prompt_set.uri} ({len(prompts)} prompts, sha256 {prompt_set.sha256[:12]}…)",
            "seeds": ", ".join(map(str, seeds)),
            "step counts": ", ".join(f"T={t}" + (" (gated)" if t == num_steps else "") for t in config.step_counts),
            "metrics": ", ".join(metric_names),
            "definitions": "; ".join(f"{m}: {d}" for m, d in scores.definitions.items()),
            **(
                {
                    "trained on": ", ".join(config.trained_metrics) or "none",
                    "held-out checks": ", ".join(m for m in metric_names if m not in config.trained_metrics) or "none",
                }
                if config.trained_metrics is not None
                else {}
            ),
            "baseline": "none"
            if baseline is None
            else f"{baseline_label}: {baseline.uri}"
            if baseline_label
            else baseline.uri,
            "output": output_uri,
        },
        num_steps=num_steps,
        prompts=prompts,
        seeds=list(seeds),
        by_steps=by_steps,
        metrics=summaries,
        image_of=lambda steps, p, seed: step_image_name(steps, num_steps, p, seed),
        plots=plots,
        grid_pages=[(page.file, list(page.prompts)) for page in pages],
        paired=paired or None,
        baseline_by_steps={steps: baseline.by_steps[steps] for steps in paired_steps} if baseline else None,
        baseline_image_of=lambda steps, p, seed: baseline_images[(steps, p, seed)],
        trained_metrics=config.trained_metrics,
    )
    say("report.html written")
    return {
        "kind": "evaluation",
        "model_uri": model_uri,
        **resume.read_policy(store).model_dump(),
        "baseline_uri": baseline.uri if baseline is not None else None,
        "config": config.model_dump(mode="json"),
    }


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
