"""``g2rpo demo``: the main job — the pipeline through kfp.local, exactly ``g2rpo pipeline run-local``
(what ``make demo`` runs); ``--toy`` sketches G²RPO's core on a toy velocity model instead."""

from __future__ import annotations

import argparse

from g2rpo.commands.pipeline import RUN_LOCAL_ITERATIONS, DefaultsOnceFormatter, add_run_local_args, run_local_command
from g2rpo.errors import G2RPOError

TOY_ITERATIONS = 30  # the toy sketch's default (docs/core.md)


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job: the whole pipeline here through kfp.local, as `g2rpo pipeline run-local` (minutes on a CPU)",
        description=(
            "The same command as `g2rpo pipeline run-local` (and `make demo`): prepare → train → evaluate → "
            "decide → promote through kfp.local on the shapes model, ending with the decision report's path and "
            "one verdict line (PROMOTED vN or REFUSED vN: why); see `g2rpo pipeline run-local --help`. "
            "--toy instead runs G²RPO's rollout and updates on a small toy velocity model with an exact reward "
            "(no pipeline; its options are --set, --seed, --lr, --prompts, --no-progress)."
        ),
        formatter_class=DefaultsOnceFormatter,
    )
    add_run_local_args(parser)
    # One flag, two defaults: the pipeline's recipe, or the toy sketch's (docs/core.md).
    (iterations,) = [action for action in parser._actions if action.dest == "iterations"]
    iterations.default = None
    iterations.help = (
        f"training iterations (default {RUN_LOCAL_ITERATIONS}: the shapes recipe, docs/demo.md; "
        f"with --toy {TOY_ITERATIONS}, docs/core.md)"
    )
    toy = parser.add_argument_group("--toy")
    toy.add_argument("--toy", action="store_true", help="run G²RPO on the toy velocity model instead of the pipeline")
    toy.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--toy only: an algorithm setting, e.g. --set g2rpo.granularities=[1,2] (repeatable)",
    )
    toy.add_argument("--seed", type=int, default=None, help="--toy only: seed of the toy problem (default 0)")
    toy.add_argument("--lr", type=float, default=None, help="--toy only: AdamW learning rate (default 1e-2)")
    toy.add_argument("--prompts", type=int, default=None, help="--toy only: number of toy prompts (default 4)")
    toy.add_argument("--no-progress", action="store_true", help="--toy only: hide the progress bar")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.iterations is None:
        args.iterations = TOY_ITERATIONS if args.toy else RUN_LOCAL_ITERATIONS
    if args.iterations < 1:
        raise G2RPOError(f"--iterations={args.iterations}: run at least one iteration, e.g. --iterations 30")
    if not args.toy:
        toy_only = [
            flag
            for flag, value in (
                ("--set", args.overrides),
                ("--seed", args.seed),
                ("--lr", args.lr),
                ("--prompts", args.prompts),
                ("--no-progress", args.no_progress or None),
            )
            if value
        ]
        if toy_only:
            raise G2RPOError(
                f"{', '.join(toy_only)}: only with --toy; the pipeline takes NAME=VALUE parameters, e.g. "
                "`g2rpo demo learning_rate=3e-3 overrides='[\"train.seed=1\"]'` (see `g2rpo pipeline run-local --help`)"
            )
        return run_local_command(args)
    if args.parameters:
        raise G2RPOError(f"{' '.join(args.parameters)}: pipeline parameters; with --toy use --set KEY=VALUE")
    from g2rpo.demo import run_toy_demo

    if args.prompts is not None and args.prompts < 1:
        raise G2RPOError(f"--prompts={args.prompts}: use at least one prompt")
    run_toy_demo(
        iterations=args.iterations,
        out_root=args.out,
        overrides=args.overrides,
        lr=1e-2 if args.lr is None else args.lr,
        num_prompts=4 if args.prompts is None else args.prompts,
        seed=0 if args.seed is None else args.seed,
        progress=not args.no_progress,
    )
    return 0
