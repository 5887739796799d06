"""Have the runs flattened? (issue 27 §3: "budgets long enough that the best method's held-out curve has
flattened — less than one interval half-width of change over the last quarter; curves read at four or
more budgets".)

Reads an ``ablation.json`` (``benchmarks/ablation.py``) and, per reward setting, method and metric (the
trained rewards and the exact in-domain ones), reads every seed's held-out curve on the compute axis at
a quarter, a half, three quarters and all of the budget. At each reading point: the mean over seeds and
its 95 % t-interval. The last quarter's change is the per-seed difference (all − three quarters), paired,
with its own interval. A curve has **flattened** when that mean change is smaller in size than the
half-width of the interval at the budget: the last quarter moved it by less than the seeds disagree.
That test is loose with few seeds (a wide final interval passes a curve that is plainly still climbing), so
each row also says whether it is **still rising**: the last quarter's paired change has a 95 % interval
wholly above zero. A row can be both; read it as "flat within the seeds' spread, but not done".

Writes ``plateau.json`` and ``plateau.md`` next to the input. Usage:
``python -m benchmarks.plateau benchmarks/results/ablation-plateau/ablation.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.ablation import IN_DOMAIN, REWARD_SETTINGS, interpolate, mean_ci
from benchmarks.stats import paired

FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def last_quarter(at_three_quarters: list[float], at_budget: list[float]) -> dict[str, Any]:
    """The last quarter's change of one method and metric from its per-seed values (same seed order):
    the paired change with its interval, the interval of the final mean, whether it has flattened
    (|mean change| < the final mean's half-width) and whether it is still rising (the change's interval
    lies above zero)."""
    change = paired(at_budget, at_three_quarters)
    final = mean_ci(at_budget)
    return {
        "change": change["mean"],
        "change_half_width": change["half_width"],
        "final": final["mean"],
        "final_half_width": final["ci95"],
        "flattened": abs(change["mean"]) < final["ci95"],
        "still_rising": change["mean"] - change["half_width"] > 0.0,
    }


def plateau(result: dict[str, Any]) -> dict[str, Any]:
    """Per setting: the reading points, and per method and metric the means at them and the last quarter."""
    out: dict[str, Any] = {}
    for setting, table in result["summary"].items():
        runs = [r for r in result["runs"] if r["rewards"] == setting]
        budget = table["budget_compute"]
        points = [f * budget for f in FRACTIONS]
        metrics = list(dict.fromkeys([*REWARD_SETTINGS[setting], *IN_DOMAIN]))
        methods: dict[str, Any] = {}
        for method in dict.fromkeys(r["method"] for r in runs):
            own = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
            rows = {}
            for metric in metrics:
                values = [[interpolate(r["evals"], "compute", at, metric) for r in own] for at in points]
                rows[metric] = {
                    "readings": [mean_ci(v) for v in values],
                    **last_quarter(values[-2], values[-1]),
                }
            methods[method] = {"seeds": [r["seed"] for r in own], "metrics": rows}
        out[setting] = {"budget_compute": budget, "points": points, "methods": methods}
    return out


def markdown(table: dict[str, Any]) -> str:
    lines = []
    for setting, block in table.items():
        at = ", ".join(f"{p:.0f}" for p in block["points"])
        lines.append(f"## {setting} (read at {at} compute units)\n")
        lines.append(
            "| method | reward | ¼ | ½ | ¾ | all (± 95 % t) | last-quarter change [95 % t] | flattened | still rising |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for method, entry in block["methods"].items():
            for metric, row in entry["metrics"].items():
                means = [f"{r['mean']:.3f}" for r in row["readings"]]
                lo, hi = row["change"] - row["change_half_width"], row["change"] + row["change_half_width"]
                flat = "yes" if row["flattened"] else "**no**"
                rising = "**yes**" if row.get("still_rising") else "no"
                lines.append(
                    f"| {method} | {metric} | {means[0]} | {means[1]} | {means[2]} | "
                    f"{row['final']:.3f} ± {row['final_half_width']:.3f} | "
                    f"{row['change']:+.4f} [{lo:+.4f}, {hi:+.4f}] | {flat} | {rising} |"
                )
        lines.append("")
    lines.append(
        "Flattened: the last quarter's mean change is smaller in size than the final mean's 95 % half-width "
        f"(seeds per method: {sorted({len(e['seeds']) for b in table.values() for e in b['methods'].values()})}). "
        "Still rising: the last quarter's paired change has a 95 % t-interval wholly above zero."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation_json", type=Path, help="an ablation.json written by benchmarks.ablation")
    args = parser.parse_args(argv)
    table = plateau(json.loads(args.ablation_json.read_text()))
    folder = args.ablation_json.parent
    (folder / "plateau.json").write_text(json.dumps(table, indent=1) + "\n")
    command = " ".join(["python -m benchmarks.plateau", *(argv if argv is not None else sys.argv[1:])])
    text = markdown(table)
    (folder / "plateau.md").write_text(f"# Plateau check of {args.ablation_json.name} (`{command}`)\n\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
