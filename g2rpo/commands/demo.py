"""``g2rpo demo``: the main job end to end on the shapes task as plain step calls (``make demo`` runs it
through kfp.local); ``--toy`` runs G²RPO on the toy velocity model instead."""

from __future__ import annotations

import argparse

from g2rpo.commands.model import add_shapes_model_args, pretraining_settings, shapes_model_path


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train the shapes model with G²RPO, evaluate before/after, register and promote it (minutes on a CPU)",
        description=(
            "Pretrains the shapes model (a tiny Flux pipeline of real diffusers classes, 64×64 images of one "
            "shape on a background; minutes, once: reused from --model after), trains it with the G²RPO trainer "
            "(configs/shapes-cpu.yaml) on the exact rewards shapes_colour + shapes_shape, evaluates deterministic "
            "ODE samples of held-out prompts and fixed seeds before and after on those and on the out-of-domain "
            "metrics shapes_position, shapes_background and jpeg_compressibility, writes a before|after image grid "
            "and a reward plot, publishes the export to a local file:// store, registers it in a local registry, "
            "runs the promotion gates and prints a summary. Everything else goes under OUT/demo-<timestamp>/. "
            "--toy runs the earlier demo on a small toy velocity model with an exact reward."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--iterations", type=int, default=30, help="training iterations")
    parser.add_argument("--out", default="runs", help="folder that receives the demo-<timestamp> run folder")
    add_shapes_model_args(parser)
    parser.add_argument("--seed", type=int, default=0, help="run seed (train.seed: prompts and every random draw)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run-config setting, e.g. --set algorithm.group_size=6 --set train.learning_rate=3e-3 "
        "(repeatable; with --toy an algorithm setting, e.g. --set g2rpo.granularities=[1,2])",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also show the libraries' own log lines and loading bars (DeepSpeed, diffusers, transformers)",
    )
    parser.add_argument(
        "--toy", action="store_true", help="run G²RPO on the toy velocity model instead of the tiny Flux"
    )
    parser.add_argument("--lr", type=float, default=None, help="--toy only: AdamW learning rate (default 1e-2)")
    parser.add_argument("--prompts", type=int, default=None, help="--toy only: number of toy prompts (default 4)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from g2rpo.errors import G2RPOError

    if args.iterations < 1:
        raise G2RPOError(f"--iterations={args.iterations}: run at least one iteration, e.g. --iterations 30")
    if not args.verbose:
        quiet_libraries()
    if args.toy:
        from g2rpo.demo import run_toy_demo

        if args.prompts is not None and args.prompts < 1:
            raise G2RPOError(f"--prompts={args.prompts}: use at least one prompt")
        run_toy_demo(
            iterations=args.iterations,
            out_root=args.out,
            overrides=args.overrides,
            lr=1e-2 if args.lr is None else args.lr,
            num_prompts=4 if args.prompts is None else args.prompts,
            seed=args.seed,
            progress=not args.no_progress,
        )
        return 0
    for flag, value, key in (
        ("--lr", args.lr, "train.learning_rate"),
        ("--prompts", args.prompts, "train.prompts_per_iteration"),
    ):
        if value is not None:
            raise G2RPOError(f"{flag}={value}: only for --toy; for the Flux demo pass --set {key}={value}")
    from g2rpo.demo import run_demo

    run_demo(
        iterations=args.iterations,
        out_root=args.out,
        overrides=args.overrides,
        seed=args.seed,
        progress=not args.no_progress,
        model=str(shapes_model_path(args)),
        pretraining=pretraining_settings(args),
    )
    return 0


def quiet_libraries() -> None:
    """The demo prints its own steps: hide the libraries' loading bars and their below-error log lines.

    DeepSpeed logs (to stdout) a warning when it finds no GPU, on its first import; a filter on its
    logger outlives the level that its import sets.
    """
    import logging

    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    logging.getLogger("DeepSpeed").addFilter(lambda record: record.levelno >= logging.ERROR)
