"""What early stopping buys a method that peaks and drifts (issue 41 §1: "MixGRPO with validation-based early
stopping"): the trainer's own rule applied to recorded runs.

Reads an ``ablation.json`` whose runs were trained with ``--train-validation N`` (``benchmarks/ablation.py``): at
every reading each run scored N training prompts × seeds 0, 1 on the rewards it trains on — what
``train.validation`` scores — beside the held-out exact rewards. For each patience P, each run is replayed
reading by reading through the library's rule (:func:`g2rpo.training.validation.early_stop_reason`: stop when the
objective, the sum of the trained rewards' means, has not improved for P validations; the untrained weights count
as the first best) and :func:`~g2rpo.training.validation.select_best` (export the best validated checkpoint). Every
reading counts as one validation, so P is in readings (the run's ``--evals`` spacing). The exported model is read
on the held-out exact rewards at its iteration (a reading: no interpolation); the run's **cost** is what it spent
until it stopped: its training FLOPs there plus every validation pass it made (``validation_flops_per_pass``,
counted by ``FlopCounterMode``), and seconds likewise (the probe's seconds per iteration × iterations, plus the
validation passes' measured seconds).

The **target** is the reference method's held-out mean at the end of its runs in ``--target`` (another ablation
file, e.g. G²RPO's plateau), as in ``benchmarks.cost_to_target``; the **ratio** is a stopped run's mean cost over
the reference's cost at its end. Intervals: a seeded, paired percentile bootstrap over the seeds both files hold
(each resample draws seed indices once for the stopped runs and the reference), 2000 resamples.

Writes ``early_stopping.md`` and ``early_stopping.json`` beside the input. Usage:
``python -m benchmarks.early_stopping RUNS/ablation.json --method mixgrpo --target PLATEAU/ablation.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ablation import IN_DOMAIN, REWARD_SETTINGS, mean_ci
from benchmarks.cost_to_target import mean_curve
from benchmarks.join import ALIKE, JoinError, check_comparable
from g2rpo.training.validation import MetricSummary, ValidationRecord, early_stop_reason, objective, select_best

RESAMPLES = 2000


def replay(run: dict[str, Any], trained: list[str], patience: int | None) -> dict[str, Any]:
    """One run under ``train.validation`` with ``patience`` (None: never stop): where it stopped, which reading it
    exported, and what it had spent."""
    if "validation_flops_per_pass" not in run:
        raise ValueError(
            f"run {run['method']} seed {run['seed']} has no validation readings: train it with "
            "`python -m benchmarks.ablation … --train-validation N`"
        )
    history: list[ValidationRecord] = []
    weights = dict.fromkeys(trained, 1.0)  # the ablation's reward entries carry the default weight 1
    for point in run["evals"]:
        means = {name: point["validation"][name] for name in trained}
        history.append(
            ValidationRecord(
                iteration=point["iteration"],
                metrics={name: MetricSummary(value, value, value, 0) for name, value in means.items()},
                objective=objective(means, weights),
                breached=[],
                forwards=0,
                seconds=0.0,
            )
        )
        if early_stop_reason(history, None, patience) is not None:
            break
    selection = select_best(history)
    exported = selection.iteration if selection is not None else 0
    stop = next(p for p in run["evals"] if p["iteration"] == history[-1].iteration)
    read = next(p for p in run["evals"] if p["iteration"] == exported)
    passes = len(history)
    return {
        "seed": run["seed"],
        "stopped_at": stop["iteration"],
        "stopped_early": stop is not run["evals"][-1],
        "exported": exported,
        "scores": {name: read[name] for name in IN_DOMAIN},
        "flops": stop["flops"] + passes * run["validation_flops_per_pass"],
        "seconds": stop["quiet_seconds"] + passes * run.get("validation_seconds_per_pass", 0.0),
        "validations": passes,
    }


def _reference(runs: list[dict[str, Any]], metric: str) -> tuple[float, float, float]:
    """(target, its FLOPs, its seconds): the reference's mean at the least end its seeds reached."""
    flops_end, target = mean_curve(runs, "flops", metric)[-1]
    seconds_end = mean_curve(runs, "quiet_seconds", metric)[-1][0]
    return target, flops_end, seconds_end


def early_stopping(
    result: dict[str, Any],
    target_file: dict[str, Any],
    method: str,
    reference: str,
    patiences: list[int | None],
    setting: str,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Per patience: every seed's replay, the means and paired bootstrap intervals against the target."""
    runs = {r["seed"]: r for r in result["runs"] if r["method"] == method and r["rewards"] == setting}
    refs = {r["seed"]: r for r in target_file["runs"] if r["method"] == reference and r["rewards"] == setting}
    seeds = sorted(set(runs) & set(refs))
    if not seeds:
        raise ValueError(f"no seed has both a {method} run and a {reference} run in the target file ({setting})")
    trained = REWARD_SETTINGS[setting]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
    targets = {m: _reference([refs[s] for s in seeds], m) for m in IN_DOMAIN}
    out: dict[str, Any] = {
        "method": method,
        "reference": reference,
        "setting": setting,
        "seeds": seeds,
        "resamples": resamples,
        "targets": {m: {"level": t, "flops": f, "seconds": sec} for m, (t, f, sec) in targets.items()},
        "patience": {},
    }
    for patience in patiences:
        replays = [replay(runs[s], trained, patience) for s in seeds]
        row: dict[str, Any] = {"runs": replays}
        row["scores"] = {m: mean_ci([r["scores"][m] for r in replays]) for m in IN_DOMAIN}
        row["flops"] = mean_ci([r["flops"] for r in replays])
        row["seconds"] = mean_ci([r["seconds"] for r in replays])
        row["stopped_early"] = sum(r["stopped_early"] for r in replays)
        for m in IN_DOMAIN:
            level, ref_flops, ref_seconds = targets[m]
            gaps, ratios, second_ratios = [], [], []
            for draw in draws:
                picked = [seeds[i] for i in draw]
                t, f, sec = _reference([refs[s] for s in picked], m)
                mean_score = statistics.fmean(replays[i]["scores"][m] for i in draw)
                gaps.append(mean_score - t)
                ratios.append(statistics.fmean(replays[i]["flops"] for i in draw) / f)
                second_ratios.append(statistics.fmean(replays[i]["seconds"] for i in draw) / sec)
            row[m] = {
                "gap_to_target": row["scores"][m]["mean"] - level,
                "gap_ci95": _interval(gaps),
                "reaches_share": sum(g >= 0 for g in gaps) / len(gaps),
                "flops_ratio": row["flops"]["mean"] / ref_flops,
                "flops_ratio_ci95": _interval(ratios),
                "seconds_ratio": row["seconds"]["mean"] / ref_seconds,
                "seconds_ratio_ci95": _interval(second_ratios),
            }
        out["patience"]["never" if patience is None else str(patience)] = row
    return out


def _interval(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def markdown(table: dict[str, Any], command: str) -> str:
    m0, m1 = IN_DOMAIN
    t = table["targets"]
    lines = [
        f"# {table['method']} with early stopping against {table['reference']}'s final reward (`{command}`)\n",
        f"{len(table['seeds'])} paired seeds {table['seeds']}; target = {table['reference']}'s held-out mean at the "
        f"end of its runs: {m0} {t[m0]['level']:.4f}, {m1} {t[m1]['level']:.4f}, at {t[m0]['flops'] / 1e9:,.0f} GFLOP "
        f"and {t[m0]['seconds']:.0f} s. Cost = training until the stop + every validation pass. Means ± 95 % t; "
        f"[95 % paired bootstrap, {table['resamples']} resamples]; 'reach' = resamples whose mean exported score is "
        "at or above the resampled target.\n",
        f"| patience (readings) | stopped early | exported iteration (mean) | {m0} − target [95 %] (reach) | "
        f"{m1} − target [95 %] (reach) | GFLOP (× {table['reference']}'s) [95 %] | s (×) [95 %] |",
        "|---|---|---|---|---|---|---|",
    ]
    for patience, row in table["patience"].items():
        n = len(row["runs"])
        exported = statistics.fmean(r["exported"] for r in row["runs"])
        cells = []
        for m in IN_DOMAIN:
            c = row[m]
            lo, hi = c["gap_ci95"]
            cells.append(f"{c['gap_to_target']:+.4f} [{lo:+.4f}, {hi:+.4f}] ({c['reaches_share']:.0%})")
        f = row[m0]
        flo, fhi = f["flops_ratio_ci95"]
        slo, shi = f["seconds_ratio_ci95"]
        lines.append(
            f"| {patience} | {row['stopped_early']} of {n} | {exported:.0f} | {cells[0]} | {cells[1]} | "
            f"{row['flops']['mean'] / 1e9:,.0f} ({f['flops_ratio']:.2f} [{flo:.2f}, {fhi:.2f}]) | "
            f"{row['seconds']['mean']:.0f} ({f['seconds_ratio']:.2f} [{slo:.2f}, {shi:.2f}]) |"
        )
    lines.append("")
    for patience, row in table["patience"].items():
        stops = ", ".join(f"s{r['seed']}: {r['stopped_at']}→{r['exported']}" for r in row["runs"])
        lines.append(f"- patience {patience}: stopped at → exported iteration per seed: {stops}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation_json", type=Path, help="an ablation.json of runs trained with --train-validation")
    parser.add_argument("--method", default="mixgrpo", help="the method to replay with early stopping")
    parser.add_argument("--target", type=Path, default=None, help="the ablation.json holding the reference's runs")
    parser.add_argument("--reference", default="g2rpo", help="the method whose final reward is the target")
    parser.add_argument("--patience", default="1,2,3,5,never", help="comma-separated readings; 'never' = no stop")
    parser.add_argument("--setting", default=None, help="reward setting (default: the first in the file)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    args = parser.parse_args(argv)
    result = json.loads(args.ablation_json.read_text())
    target = json.loads(args.target.read_text()) if args.target else result
    if args.target:
        try:  # a seed must mean the same runs' prompts, noise and held-out set in both files
            check_comparable([result, target], [str(args.ablation_json), str(args.target)], ALIKE)
        except JoinError as error:
            print(f"error: --target: {error}", file=sys.stderr)
            return 2
    setting = args.setting or next(iter(result["summary"]))
    try:
        patiences = [None if p == "never" else int(p) for p in args.patience.split(",")]
    except ValueError:
        parser.error(f"--patience {args.patience!r}: whole numbers of readings or 'never', e.g. 1,2,3,never")
    if any(p is not None and p < 1 for p in patiences):
        parser.error(f"--patience {args.patience!r}: each patience is at least 1 reading")
    try:
        table = early_stopping(result, target, args.method, args.reference, patiences, setting, args.resamples)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = " ".join(["python -m benchmarks.early_stopping", *(argv if argv is not None else sys.argv[1:])])
    folder = args.ablation_json.parent
    (folder / "early_stopping.json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table, command)
    (folder / "early_stopping.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
