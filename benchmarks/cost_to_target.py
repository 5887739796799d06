"""What does each method pay to reach a reference method's reward? (issue 41 §1: "the full FLOPs and the measured
wall time to reach that target, with paired bootstrap intervals".)

Reads an ``ablation.json`` (``benchmarks/ablation.py``; its eval points carry ``flops`` — every phase counted by
``FlopCounterMode`` — and ``quiet_seconds`` — iterations × the method's seconds per iteration from its probe) and,
for one reward setting and each metric asked:

- the **target** is the reference method's held-out mean at the end of its runs (the least cost all its seeds
  reached), fixed before the other methods are read;
- each method's **cost to target** is where its mean curve over seeds (each seed's piecewise-linear eval curve,
  averaged at every reading point of any seed) first reaches the target, linear between points; "never" when it
  does not within its runs;
- the **ratio** is that cost over the reference's cost at its end (the cost at which the target was read): the
  fraction of the reference's run that buys the same reward.

Intervals: a seeded percentile bootstrap over seeds, paired — each resample draws seed indices with replacement
once and uses them for every method (a seed gives every method the same prompts and noise), recomputes the target,
every mean curve, cost and ratio; the 95 % interval is the 2.5 and 97.5 percentiles (the resample values at or
just outside them, not interpolated), with "never" counted as infinite (an upper end of "never" means more than 2.5 % of resamples never reach the target). With n seeds there
are only C(2n − 1, n) distinct resamples (10 for 3 seeds): read such intervals as rough.

The reference from another file (``--reference-from OTHER/ablation.json``): the reference's runs are taken from
there, the other methods' from the input — e.g. a method re-run over the first part of the reference's budget with
denser readings, against the reference's long runs. The two files must have trained and evaluated alike (the same
model weights, algorithm, prompts per iteration, held-out prompts, evaluation seeds and reward settings:
``benchmarks.join.ALIKE``), so that a seed means the same in both; the pairing is by seed. Readings are never merged
across runs: a re-run is bit-identical at the same commit on this machine (MixGRPO, T = 16, seed 2: every reading
equal), but the same seeds re-trained at a later commit drifted from the long runs by up to 9e-3 by iteration 67
(the code changed in between), so a re-run is its own measurement.

Writes ``cost_to_target.md`` and ``cost_to_target.json`` beside the input. Usage:
``python -m benchmarks.cost_to_target benchmarks/results/ablation-t16-plateau/ablation.json --reference g2rpo``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ablation import IN_DOMAIN, interpolate
from benchmarks.join import ALIKE, JoinError, check_comparable

AXES = ("flops", "quiet_seconds")
RESAMPLES = 2000


def mean_curve(runs: list[dict[str, Any]], axis: str, metric: str) -> list[tuple[float, float]]:
    """The mean over ``runs`` of their piecewise-linear curves of ``metric`` against ``axis``, at every reading
    point of any run up to the least end any run reached (no run extrapolated)."""
    end = min(max(p[axis] for p in r["evals"]) for r in runs)
    xs = sorted({p[axis] for r in runs for p in r["evals"] if p[axis] <= end})
    return [(x, statistics.fmean(interpolate(r["evals"], axis, x, metric) for r in runs)) for x in xs]


def first_reach(curve: list[tuple[float, float]], level: float) -> float:
    """The least x at which the curve reaches ``level`` (linear between points); ``inf`` if it never does."""
    if curve and curve[0][1] >= level:
        return curve[0][0]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if y1 >= level:
            return x0 + (x1 - x0) * (level - y0) / (y1 - y0)
    return math.inf


def point(by_method: dict[str, list[dict[str, Any]]], reference: str, axis: str, metric: str) -> dict[str, Any]:
    """The target (the reference's mean at its end), and each method's cost to reach it and ratio to the
    reference's end cost, for one set of runs per method."""
    ref = mean_curve(by_method[reference], axis, metric)
    end_cost, target = ref[-1]
    costs = {m: first_reach(mean_curve(runs, axis, metric), target) for m, runs in by_method.items()}
    return {
        "target": target,
        "reference_cost": end_cost,
        "cost": costs,
        "ratio": {m: c / end_cost for m, c in costs.items()},
    }


def _percentiles(values: list[float]) -> tuple[float, float]:
    """2.5 and 97.5 percentiles, ``inf`` ("never") ranked above every finite value."""
    finite = [v for v in values if math.isfinite(v)]
    sentinel = 10.0 * max(finite, default=1.0) + 1.0  # interpolation between inf and inf would be nan
    array = np.asarray([v if math.isfinite(v) else sentinel for v in values], dtype=np.float64)
    # the sample values at or just outside the percentiles (no interpolation: "never" stays "never")
    low, high = float(np.percentile(array, 2.5, method="lower")), float(np.percentile(array, 97.5, method="higher"))
    return (math.inf if low == sentinel else low), (math.inf if high == sentinel else high)


def cost_to_target(
    result: dict[str, Any],
    setting: str,
    reference: str,
    metrics: list[str],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Per axis and metric: the point estimate and the paired bootstrap interval of every method's cost and ratio."""
    runs = [r for r in result["runs"] if r["rewards"] == setting]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    seeds = sorted({r["seed"] for r in runs if r["method"] == reference})
    # paired: only seeds every method has
    seeds = [s for s in seeds if all(any(r["seed"] == s and r["method"] == m for r in runs) for m in methods)]
    by_seed = {(r["method"], r["seed"]): r for r in runs}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(seeds), size=(resamples, len(seeds)))  # [B, n]: the same draw for every method
    axes = [a for a in AXES if all(a in p for r in runs for p in r["evals"])]
    out: dict[str, Any] = {
        "setting": setting,
        "reference": reference,
        "seeds": seeds,
        "resamples": resamples,
        "axes": {},
    }
    for axis in axes:
        block: dict[str, Any] = {}
        for metric in metrics:
            full = point({m: [by_seed[(m, s)] for s in seeds] for m in methods}, reference, axis, metric)
            boot = [
                point({m: [by_seed[(m, seeds[i])] for i in draw] for m in methods}, reference, axis, metric)
                for draw in draws
            ]
            rows = {}
            for m in methods:
                costs = [b["cost"][m] for b in boot]
                ratios = [b["ratio"][m] for b in boot]
                rows[m] = {
                    "cost": full["cost"][m],
                    "cost_ci95": _percentiles(costs),
                    "ratio": full["ratio"][m],
                    "ratio_ci95": _percentiles(ratios),
                    "reached_share": sum(math.isfinite(c) for c in costs) / len(costs),
                }
            block[metric] = {"target": full["target"], "reference_cost": full["reference_cost"], "methods": rows}
        out["axes"][axis] = block
    return out


def _fmt(x: float, scale: float = 1.0, digits: int = 2) -> str:
    return "never" if not math.isfinite(x) else f"{x * scale:.{digits}f}"


def markdown(table: dict[str, Any], command: str) -> str:
    units = {"flops": ("GFLOP", 1e-9, 0), "quiet_seconds": ("s", 1.0, 0)}
    lines = [
        f"# Cost to reach {table['reference']}'s final reward (`{command}`)\n",
        f"Setting `{table['setting']}`, {len(table['seeds'])} paired seeds {table['seeds']}; target = "
        f"{table['reference']}'s held-out mean at the end of its runs; cost = where a method's mean curve first "
        "reaches it; ratio = that cost / the reference's cost at its end; [95 % paired bootstrap over seeds, "
        f"{table['resamples']} resamples; 'never' = not reached within the runs].\n",
    ]
    if table.get("reference_from"):
        lines.append(f"The reference's runs are those of `{table['reference_from']}`.\n")
    for axis, block in table["axes"].items():
        unit, scale, digits = units[axis]
        for metric, entry in block.items():
            lines.append(
                f"## {metric} on {axis}: target {entry['target']:.4f}, read at {_fmt(entry['reference_cost'], scale, digits)} {unit}\n"
            )
            lines.append(
                f"| method | cost to target ({unit}) [95 %] | ratio to the reference's cost [95 %] | resamples reaching |"
            )
            lines.append("|---|---|---|---|")
            for m, row in entry["methods"].items():
                lo, hi = row["cost_ci95"]
                rlo, rhi = row["ratio_ci95"]
                lines.append(
                    f"| {m} | {_fmt(row['cost'], scale, digits)} [{_fmt(lo, scale, digits)}, {_fmt(hi, scale, digits)}] | "
                    f"{_fmt(row['ratio'])} [{_fmt(rlo)}, {_fmt(rhi)}] | {row['reached_share']:.0%} |"
                )
            lines.append("")
    return "\n".join(lines)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # "never"
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation_json", type=Path, help="an ablation.json written by benchmarks.ablation")
    parser.add_argument("--reference", default="g2rpo", help="the method whose final reward is the target")
    parser.add_argument("--setting", default=None, help="reward setting (default: the first in the file)")
    parser.add_argument("--metrics", default=",".join(IN_DOMAIN), help="comma-separated (default: exact colour, shape)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--name", default="cost_to_target", help="output file stem beside the input")
    parser.add_argument(
        "--reference-from",
        type=Path,
        default=None,
        help="take the reference's runs from this ablation.json (trained and evaluated alike; see the module doc)",
    )
    args = parser.parse_args(argv)
    result = json.loads(args.ablation_json.read_text())
    setting = args.setting or next(iter(result["summary"]))
    metrics = args.metrics.split(",")
    if args.reference_from is not None:
        other = json.loads(args.reference_from.read_text())
        try:
            check_comparable([result, other], [str(args.ablation_json), str(args.reference_from)], ALIKE)
        except JoinError as error:
            print(f"error: --reference-from: {error}", file=sys.stderr)
            return 2
        ours = [r for r in result["runs"] if r["method"] != args.reference]
        theirs = [r for r in other["runs"] if r["method"] == args.reference]
        if not theirs:
            print(f"error: --reference-from {args.reference_from}: no {args.reference} runs there", file=sys.stderr)
            return 2
        result = {**result, "runs": ours + theirs}
    table = cost_to_target(result, setting, args.reference, metrics, args.resamples)
    if args.reference_from is not None:
        table["reference_from"] = str(args.reference_from)
    command = " ".join(["python -m benchmarks.cost_to_target", *(argv if argv is not None else sys.argv[1:])])
    folder = args.ablation_json.parent
    (folder / f"{args.name}.json").write_text(json.dumps(_json_safe(table), indent=1) + "\n")
    text = markdown(table, command)
    (folder / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
