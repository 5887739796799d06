"""``g2rpo demo``: the core rollout and real training updates on a toy model (what `make demo` runs)."""

from __future__ import annotations

import argparse


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run G²RPO updates on a small toy model and report what they did",
        description=(
            "Runs the G²RPO rollout (anchor ODE, G SDE branches per trained step, every branch finished at "
            "every stride) and real AdamW updates on a small velocity model whose reward is computed exactly. "
            "Prints the forward counts, rewards before/after, loss and clip fraction, and writes metrics.jsonl "
            "and reward.png under OUT/demo-<timestamp>/."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--iterations", type=int, default=30, help="training iterations")
    parser.add_argument("--out", default="runs", help="folder that receives the demo-<timestamp> run folder")
    parser.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (toy-scale, not the paper's 2e-6)")
    parser.add_argument("--prompts", type=int, default=4, help="number of toy prompts per iteration")
    parser.add_argument("--seed", type=int, default=0, help="run seed (model init, prompts, every random draw)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an algorithm setting, e.g. --set strategy=dancegrpo --set granularities=[1,2] (repeatable)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from g2rpo.demo import run_demo
    from g2rpo.errors import G2RPOError

    if args.iterations < 1:
        raise G2RPOError(f"--iterations={args.iterations}: run at least one iteration, e.g. --iterations 30")
    if args.prompts < 1:
        raise G2RPOError(f"--prompts={args.prompts}: use at least one prompt")
    run_demo(
        iterations=args.iterations,
        out_root=args.out,
        overrides=args.overrides,
        lr=args.lr,
        num_prompts=args.prompts,
        seed=args.seed,
        progress=not args.no_progress,
    )
    return 0
