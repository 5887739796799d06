"""Method gaps of a finished ablation, paired per seed (issue 27: "statistics that rank methods").

Reads an ``ablation.json`` (``benchmarks/ablation.py``) and, for each reward setting and view (equal
iterations, equal compute, equal wall time) and each trained reward, compares every pair of methods
by the per-seed differences of their held-out means at that view's reading point
(:func:`benchmarks.stats.paired`: a seed gives every method the same prompt order and noise). The
p-values of one table (all pairs × trained rewards of one view) are Holm-corrected; beside each gap
stands the minimum difference the design detects at 80 % power (:func:`benchmarks.stats.minimum_detectable`).
A gap is called only when its Holm-adjusted p < 0.05.

Writes ``paired.json`` and ``paired.md`` next to the input. Usage:
``python -m benchmarks.paired benchmarks/results/ablation/ablation.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.ablation import IN_DOMAIN, REWARD_SETTINGS, interpolate, wall_axis
from benchmarks.stats import holm, minimum_detectable, paired

VIEWS = {
    "equal_iterations": "iteration",
    "equal_compute": "compute",
    "equal_wall_time": "seconds",
    "equal_flops": "flops",  # when the runs carry full FLOPs (benchmarks.ablation.attach_quiet_seconds)
}


def reading_points(result: dict[str, Any], setting: str) -> dict[str, float]:
    """Where each view reads the curves: the summary's own points (iteration N, the budget, the wall time)."""
    table = result["summary"][setting]
    n = result["settings"]["iterations"]
    points = {"equal_iterations": n, "equal_compute": table["budget_compute"], "equal_wall_time": table["wall_seconds"]}
    if "budget_flops" in table:
        points["equal_flops"] = table["budget_flops"]
    return points


def compare(result: dict[str, Any], pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Every pair of methods (or only ``pairs``: the comparisons a question makes, so that Holm corrects
    over those and not over every pair the ablation happens to hold), per setting, view and metric."""
    out: dict[str, Any] = {}
    for setting in result["summary"]:
        runs = [r for r in result["runs"] if r["rewards"] == setting]
        methods = list(dict.fromkeys(r["method"] for r in runs))
        seeds = sorted({r["seed"] for r in runs})
        by = {(r["method"], r["seed"]): r for r in runs}
        seeds = [s for s in seeds if all((m, s) in by for m in methods)]
        points = reading_points(result, setting)
        # The trained rewards, and the exact in-domain ones whatever was trained: on learned rewards the
        # exact ones are the ground truth the ranking is about.
        metrics = list(dict.fromkeys([*REWARD_SETTINGS[setting], *IN_DOMAIN]))
        for view, axis in VIEWS.items():
            if view not in points:
                continue
            axis = wall_axis(runs) if view == "equal_wall_time" else axis
            rows = []
            for metric in metrics:
                values = {
                    m: [interpolate(by[(m, s)]["evals"], axis, points[view], metric) for s in seeds] for m in methods
                }
                chosen = pairs if pairs is not None else list(itertools.combinations(methods, 2))
                for a, b in chosen:
                    if statistics.fmean(values[a]) < statistics.fmean(values[b]):
                        a, b = b, a  # report the leader first: every gap is ≥ 0
                    gap = paired(values[a], values[b])
                    rows.append(
                        {
                            "metric": metric,
                            "leader": a,
                            "other": b,
                            **gap,
                            "mde80": minimum_detectable(gap["sd"], gap["n"]),
                        }
                    )
            for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
                row["p_holm"] = adjusted
                row["significant"] = adjusted < 0.05
                row["powered"] = row["mean"] > row["mde80"]
            out[f"{setting}/{view}"] = {"seeds": seeds, "at": points[view], "comparisons": rows}
    return out


def markdown(table: dict[str, Any]) -> str:
    lines = []
    for key, block in table.items():
        lines.append(f"## {key} (read at {block['at']:.4g}; {len(block['seeds'])} paired seeds)\n")
        lines.append(
            "| reward | leader − other | gap [95 % t-interval] | p | p (Holm, this table) | MDE at 80 % power | called |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for r in sorted(block["comparisons"], key=lambda r: (r["metric"], r["p"])):
            lo, hi = r["mean"] - r["half_width"], r["mean"] + r["half_width"]
            called = "yes" if r["significant"] else "no"
            lines.append(
                f"| {r['metric']} | {r['leader']} − {r['other']} | {r['mean']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                f"{r['p']:.3g} | {r['p_holm']:.3g} | {r['mde80']:.4f} | {called} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation_json", type=Path, help="an ablation.json written by benchmarks.ablation")
    parser.add_argument(
        "--pairs",
        default=None,
        metavar="A:B,C:D,...",
        help="compare only these pairs of methods (Holm then corrects over them); default: every pair",
    )
    parser.add_argument("--name", default="paired", help="output files NAME.json and NAME.md (default paired)")
    args = parser.parse_args(argv)
    result = json.loads(args.ablation_json.read_text())
    pairs = None
    if args.pairs:
        held = {r["method"] for r in result["runs"]}
        pairs = [tuple(item.split(":")) for item in args.pairs.split(",")]
        bad = [":".join(p) for p in pairs if len(p) != 2 or not set(p) <= held]
        if bad:
            parser.error(f"--pairs: {bad} are not METHOD:METHOD pairs of the methods in the file ({sorted(held)})")
    table = compare(result, pairs)
    folder = args.ablation_json.parent
    (folder / f"{args.name}.json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table)
    command = " ".join(["python -m benchmarks.paired", *(argv if argv is not None else sys.argv[1:])])
    (folder / f"{args.name}.md").write_text(
        f"# Paired method gaps of {args.ablation_json.name} (`{command}`)\n\n{text}"
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
