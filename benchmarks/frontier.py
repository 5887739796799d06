"""Reward against cost over every method of a finished ablation: the figure a team chooses a method by.

Reads an ``ablation.json`` (``benchmarks/ablation.py``; its runs carry ``flops`` — every phase counted
by ``FlopCounterMode`` — and ``quiet_seconds`` — iterations × the method's seconds per iteration
measured alone) and, for one reward setting, draws each method's held-out curve against

- full FLOPs (transformer forwards and backwards, VAE decodes, reward scoring), and
- wall time (``quiet_seconds``, this CPU),

on two rewards: the **exact utility** u = (``shapes_colour`` + ``shapes_shape``) / 2, the ground truth
that nobody trains on when the setting is ``learned`` (the same u the preference model was fitted to,
docs/models.md), and the mean of the rewards the setting trains on. A curve is the mean over seeds of
each run's piecewise-linear eval curve, drawn up to the least cost any of the method's seeds reached,
with its 95 % Student-t band.

The table reads every method at four budgets — a quarter, a half, three quarters and all of the
least cost any run reached (so every method is read on its own curve, none extrapolated) — and names
the best method there by mean exact utility. Against each other method its gap is paired per seed
(:func:`benchmarks.stats.paired`), Holm-corrected over that budget's comparisons; methods whose gap to
the best is not called are listed as *not separated* from it. That is the recommendation per budget:
the best mean, and how sure.

Writes ``frontier.png``, ``frontier.md`` and ``frontier.json`` beside the input. Usage:
``python -m benchmarks.frontier benchmarks/results/ablation-frontier/ablation.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.ablation import IN_DOMAIN, REWARD_SETTINGS, interpolate, mean_ci
from benchmarks.stats import holm, paired

AXES = {
    "flops": ("full cost (GFLOP: transformer, VAE decodes, reward scoring)", 1e-9),
    "quiet_seconds": ("wall time on this CPU (s, measured alone)", 1.0),
}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def utility(point: dict[str, Any]) -> float:
    """The exact utility of an eval point: the mean of the exact in-domain rewards."""
    return statistics.fmean(point[m] for m in IN_DOMAIN)


def with_scores(run: dict[str, Any], trained: list[str]) -> list[dict[str, Any]]:
    """The run's eval points with ``utility`` (exact) and ``trained`` (mean of the trained rewards) added."""
    return [{**p, "utility": utility(p), "trained": statistics.fmean(p[m] for m in trained)} for p in run["evals"]]


def band(values: list[float]) -> tuple[float, float]:
    """Mean and 95 % Student-t half-width over seeds (:func:`benchmarks.ablation.mean_ci`; 0 for one seed)."""
    out = mean_ci(values)
    return out["mean"], out["ci95"]


def frontier(result: dict[str, Any], setting: str) -> dict[str, Any]:
    """Per axis: each method's mean curve with its band, and the table of the four budgets."""
    runs = [r for r in result["runs"] if r["rewards"] == setting]
    if not runs:
        raise SystemExit(
            f"no runs with rewards {setting!r} in the file (it holds {sorted({r['rewards'] for r in result['runs']})})"
        )
    trained = REWARD_SETTINGS[setting]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    curves = {(r["method"], r["seed"]): with_scores(r, trained) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    seeds = [s for s in seeds if all((m, s) in curves for m in methods)]  # paired: seeds every method has
    out: dict[str, Any] = {"setting": setting, "trained": trained, "seeds": seeds, "methods": methods, "axes": {}}
    base = curves[(methods[0], seeds[0])][0]
    out["base"] = {"utility": base["utility"], "trained": base["trained"]}
    for axis in AXES:
        if not all(axis in p for c in curves.values() for p in c):
            continue
        reach = {m: min(curves[(m, s)][-1][axis] for s in seeds) for m in methods}
        common = min(reach.values())
        block: dict[str, Any] = {"common_budget": common, "curves": {}, "budgets": []}
        for m in methods:
            grid = [reach[m] * i / 40 for i in range(41)]
            block["curves"][m] = {
                score: [[x, *band([interpolate(curves[(m, s)], axis, x, score) for s in seeds])] for x in grid]
                for score in ("utility", "trained")
            }
        for fraction in FRACTIONS:
            at = common * fraction
            values = {m: [interpolate(curves[(m, s)], axis, at, "utility") for s in seeds] for m in methods}
            ranked = sorted(methods, key=lambda m: statistics.fmean(values[m]), reverse=True)
            best = ranked[0]
            gaps = [{"other": m, **paired(values[best], values[m])} for m in ranked[1:]]
            for gap, adjusted in zip(gaps, holm([g["p"] for g in gaps])):
                gap["p_holm"] = adjusted
                gap["called"] = adjusted < 0.05
            block["budgets"].append(
                {
                    "fraction": fraction,
                    "at": at,
                    "means": {m: band(values[m]) for m in ranked},
                    "best": best,
                    "gaps": gaps,
                    "not_separated": [g["other"] for g in gaps if not g["called"]],
                }
            )
        out["axes"][axis] = block
    return out


def first_reach(curve: list[list[float]], level: float) -> float | None:
    """The least x at which a mean curve ([x, mean, half-width] points) reaches ``level``, linear between
    points; None if it never does."""
    for (x0, y0, _), (x1, y1, _) in zip(curve, curve[1:]):
        if y0 >= level:
            return x0
        if y1 >= level:
            return x0 + (x1 - x0) * (level - y0) / (y1 - y0)
    return None


def speedups(table: dict[str, Any], pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """For each (fast, slow) pair and axis: the cost at which ``fast``'s mean exact utility first reaches
    the level ``slow`` ends at (its mean at the least cost all its seeds reached), against ``slow``'s cost
    there — the speed-up claims of the papers, read on this task's ground truth."""
    out = []
    for fast, slow in pairs:
        for axis, block in table["axes"].items():
            slow_curve, fast_curve = block["curves"][slow]["utility"], block["curves"][fast]["utility"]
            slow_cost, level = slow_curve[-1][0], slow_curve[-1][1]
            reached = first_reach(fast_curve, level)
            out.append(
                {
                    "fast": fast,
                    "slow": slow,
                    "axis": axis,
                    "level": level,
                    "slow_cost": slow_cost,
                    "fast_cost": reached,
                    "ratio": slow_cost / reached if reached else None,
                    "fast_final": fast_curve[-1][1],
                }
            )
    return out


def markdown(table: dict[str, Any], command: str) -> str:
    lines = [
        f"# Reward against cost (`{command}`)\n",
        f"Rewards trained: {' + '.join(table['trained'])}; read on the exact utility u = mean of "
        f"{', '.join(IN_DOMAIN)} (base model {table['base']['utility']:.3f}), {len(table['seeds'])} paired seeds. "
        "Mean ± 95 % t-interval; the best method's gap to each other one paired per seed, Holm over the "
        "budget's comparisons.\n",
    ]
    for axis, block in table["axes"].items():
        label, scale = AXES[axis]
        lines.append(f"## against {label}\n")
        methods = list(block["budgets"][-1]["means"])
        header = " | ".join(f"{b['fraction']:.0%} ({b['at'] * scale:.0f})" for b in block["budgets"])
        lines.append(f"| method | {header} |")
        lines.append("|---" * (len(block["budgets"]) + 1) + "|")
        for m in sorted(methods):
            cells = []
            for b in block["budgets"]:
                mean, half = b["means"][m]
                cells.append(f"**{mean:.3f}** ± {half:.3f}" if m == b["best"] else f"{mean:.3f} ± {half:.3f}")
            lines.append(f"| {m} | {' | '.join(cells)} |")
        lines.append("")
        for b in block["budgets"]:
            called = [f"{g['other']} (+{g['mean']:.3f}, Holm p {g['p_holm']:.2g})" for g in b["gaps"] if g["called"]]
            lines.append(
                f"- at {b['fraction']:.0%} ({b['at'] * scale:.0f}): best **{b['best']}**; "
                f"not separated from it: {', '.join(b['not_separated']) or 'none'}; ahead of: {', '.join(called) or 'none called'}"
            )
        lines.append("")
    if table.get("speedups"):
        lines.append("## cost to reach another method's final exact utility (means over seeds)\n")
        lines.append("| method | reaches | its level | at | against | speed-up | its own final |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in table["speedups"]:
            _, scale = AXES[r["axis"]]
            unit = "GFLOP" if r["axis"] == "flops" else "s"
            at = f"{r['fast_cost'] * scale:.0f} {unit}" if r["fast_cost"] else "not reached"
            ratio = f"{r['ratio']:.2f}×" if r["ratio"] else "—"
            lines.append(
                f"| {r['fast']} | {r['slow']}'s final | {r['level']:.3f} | {at} | {r['slow_cost'] * scale:.0f} {unit} | "
                f"{ratio} | {r['fast_final']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(table["axes"])
    fig, grid = plt.subplots(2, len(axes_names), figsize=(6.2 * len(axes_names), 8.4), squeeze=False)
    colours = plt.get_cmap("tab10")
    methods = list(next(iter(table["axes"].values()))["curves"])
    for col, axis in enumerate(axes_names):
        label, scale = AXES[axis]
        block = table["axes"][axis]
        for row, (score, title) in enumerate(
            (("utility", "exact utility u (held out, never trained on)"), ("trained", "trained rewards (mean)"))
        ):
            ax = grid[row][col]
            for i, m in enumerate(methods):
                pts = block["curves"][m][score]
                xs = [p[0] * scale for p in pts]
                # tab10 has ten colours: the eleventh method on reuses them dashed, so no two curves look alike
                ax.plot(
                    xs, [p[1] for p in pts], color=colours(i % 10), ls=("-", "--", "-.")[i // 10 % 3], label=m, lw=1.6
                )
                ax.fill_between(
                    xs, [p[1] - p[2] for p in pts], [p[1] + p[2] for p in pts], color=colours(i % 10), alpha=0.12
                )
            ax.axhline(table["base"][score], color="grey", ls="--", lw=1, label="base model")
            for b in block["budgets"]:
                ax.axvline(b["at"] * scale, color="black", lw=0.5, ls=":")
            ax.set_xlabel(label)
            ax.set_ylabel(title)
            ax.grid(alpha=0.3)
    handles, labels = grid[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", lw=0.5, ls=":"))
    labels.append("reading budgets (¼, ½, ¾, all of the least cost any run reached)")
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.suptitle(
        f"Reward against cost, {len(table['seeds'])} seeds per method: mean with its 95 % t-interval band "
        f"(trained on {' + '.join(table['trained'])})",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation_json", type=Path, help="an ablation.json written by benchmarks.ablation")
    parser.add_argument("--rewards", default=None, help="the reward setting to read (default: the file's first)")
    parser.add_argument(
        "--speedups",
        default="",
        metavar="FAST:SLOW,...",
        help="for each pair, the cost at which FAST first reaches SLOW's final exact utility (a paper's speed-up claim)",
    )
    args = parser.parse_args(argv)
    result = json.loads(args.ablation_json.read_text())
    setting = args.rewards or next(iter(result["summary"]))
    table = frontier(result, setting)
    pairs = [tuple(item.split(":")) for item in args.speedups.split(",") if item]
    bad = [":".join(p) for p in pairs if len(p) != 2 or not set(p) <= set(table["methods"])]
    if bad:
        parser.error(f"--speedups: {bad} are not FAST:SLOW pairs of the file's methods ({table['methods']})")
    table["speedups"] = speedups(table, pairs)
    if not table["axes"]:
        parser.error(
            f"{args.ablation_json}: its runs carry neither flops nor quiet_seconds (rerun benchmarks.ablation)"
        )
    folder = args.ablation_json.parent
    command = " ".join(["python -m benchmarks.frontier", *(argv if argv is not None else sys.argv[1:])])
    (folder / "frontier.json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table, command)
    (folder / "frontier.md").write_text(text)
    plot(table, folder / "frontier.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
