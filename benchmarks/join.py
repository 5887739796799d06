"""One ablation from several: runs trained apart, read in one table when they were trained and evaluated alike.

An arm added later (the published-settings baselines beside the frontier, issue 41 §3) is trained into its own
folder, so that the first folder's files, and every number quoted from them, stay as they are. To compare the two
under the same statistics — one paired, Holm-corrected table, one frontier figure — the runs must be comparable
seed for seed: the same model weights, compute budget, equal-iteration point, shared algorithm settings, held-out
prompts, evaluation seeds and reading points. :func:`join` checks each of those and refuses, naming the field and both values,
when any differs; a method in two inputs is refused too (its seeds would count twice). The joined
``ablation.json`` holds every run as its own file recorded it (FLOPs and probe seconds already attached), the
summary recomputed over all of them (:func:`benchmarks.ablation.summarise`: the equal-cost reading points are the
least any run of the joined set reached, so they may differ from each input's), and where each run came from.
``benchmarks.paired``, ``benchmarks.frontier`` and ``benchmarks.cost_to_target`` read it as any other.

Usage: ``python -m benchmarks.join A/ablation.json B/ablation.json --out C`` (writes ``C/ablation.json`` and
``C/ablation.md``; no per-run files are copied: they stay in A and B).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.ablation import markdown, power, probe_markdown, summarise

Field = tuple[str, Callable[[dict[str, Any]], Any]]  # (name, where it is in an ablation.json)
# Trained and evaluated alike, seed for seed: the same seed sees the same prompts, noise and held-out set.
ALIKE: tuple[Field, ...] = (
    ("model weights (sha256)", lambda r: r["model"]["sha256_of_weights"]),
    ("shared algorithm settings", lambda r: r["settings"]["algorithm"]),
    ("prompts per iteration", lambda r: r["settings"]["prompts_per_iteration"]),
    ("held-out prompts", lambda r: r["settings"]["heldout_prompts"]),
    ("evaluation seeds (--eval-seeds)", lambda r: r["settings"].get("eval_seeds")),
    ("reward settings", lambda r: r["settings"]["reward_settings"]),
)
# ... and read at the same points, so one summary's equal-cost views hold for all of them.
SAME: tuple[Field, ...] = (
    *ALIKE,
    ("compute budget", lambda r: r["budget_compute"]),
    ("equal-iteration point (--iterations)", lambda r: r["settings"]["iterations"]),
    ("reading points (--evals)", lambda r: r["settings"]["evals"]),
)


class JoinError(ValueError):
    """The inputs cannot be read as one ablation."""


def check_comparable(results: list[dict[str, Any]], names: list[str], fields: tuple[Field, ...]) -> None:
    """Refuse, naming the field and both values, unless every result agrees with the first on ``fields``."""
    first = results[0]
    for result, name in zip(results[1:], names[1:]):
        for field, read in fields:
            if read(result) != read(first):
                raise JoinError(
                    f"{name}: its {field} differ from {names[0]}'s ({str(read(result))[:120]} against "
                    f"{str(read(first))[:120]}), so its runs are not comparable seed for seed; rerun it with "
                    f"{names[0]}'s arguments (its `command`: {first['command']})"
                )


def join(results: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The runs of every input in one ablation result (see the module docstring); ``names`` say which is which."""
    if len(results) < 2:
        raise JoinError("give two or more ablation.json files to join")
    check_comparable(results, names, SAME)
    first = results[0]
    owner: dict[str, str] = {}
    for result, name in zip(results, names):
        for method in dict.fromkeys(r["method"] for r in result["runs"]):
            if method in owner:
                raise JoinError(
                    f"method {method} is in both {owner[method]} and {name}: its seeds would count twice; "
                    "join files with different methods (rerun one without it)"
                )
            owner[method] = name
    runs = [run for result in results for run in result["runs"]]
    for run in runs:
        missing = [axis for axis in ("flops", "quiet_seconds") if axis not in run]
        if missing:
            raise JoinError(
                f"{owner[run['method']]}: run {run['method']} seed {run['seed']} carries no {missing}: it was "
                "written before benchmarks.ablation attached them; rerun that ablation command to rewrite its file"
            )
    iterations = first["settings"]["iterations"]
    summary = summarise(runs, iterations)
    learning_rates: dict[str, dict[str, Any]] = {}
    for result in results:
        for setting, chosen in result["learning_rates"].items():
            learning_rates.setdefault(setting, {}).update(chosen)
    return {
        "benchmark": "ablation",
        "command": "python -m benchmarks.join " + " ".join(names),
        "joined_from": [
            {"file": name, "command": result["command"], "methods": sorted({r["method"] for r in result["runs"]})}
            for result, name in zip(results, names)
        ],
        "settings": {
            **first["settings"],
            "methods": {m: s for r in results for m, s in r["settings"]["methods"].items()},
        },
        "learning_rates": learning_rates,
        "partial": any(result.get("partial") for result in results),
        "seeds_summarised": sorted({r["seed"] for r in runs}),
        "model": first["model"],
        "probe_cost_per_iteration": {m: c for r in results for m, c in r["probe_cost_per_iteration"].items()},
        "budget_compute": first["budget_compute"],
        "summary": summary,
        "power": power(summary),
        "runs": runs,
        "plots": [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "ablation_json", type=Path, nargs="+", help="ablation.json files written by benchmarks.ablation"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the joined ablation.json and ablation.md")
    args = parser.parse_args(argv)
    names = [str(path) for path in args.ablation_json]
    try:
        joined = join([json.loads(path.read_text()) for path in args.ablation_json], names)
    except JoinError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation.json").write_text(json.dumps(joined, indent=1) + "\n")
    sources = "\n".join(f"- `{s['file']}`: {', '.join(s['methods'])}" for s in joined["joined_from"])
    text = (
        f"Joined (`{joined['command']}`):\n\n{sources}\n\n"
        + markdown(joined["summary"], joined["settings"]["iterations"])
        + probe_markdown(joined["probe_cost_per_iteration"])
    )
    (args.out / "ablation.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
