"""``g2rpo model``: make the tiny Flux pipeline, pretrain it on the shapes task, check a model directory."""

from __future__ import annotations

import argparse
import json
import json as _json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from g2rpo.errors import G2RPOError, problem

if TYPE_CHECKING:  # the shapes module imports torch: the CLI loads it only when a command needs it
    from g2rpo.models.shapes import ShapesPretraining

OVERWRITE_HELP = (
    "replace the directory whole when it is a g2rpo model folder (its g2rpo_tiny.json marker and the model's "
    "files only); any other non-empty directory is refused, naming what it holds"
)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser(
        "model",
        help="the tiny test model, the shapes task's models and learned rewards, their quality, model checks",
        description="Model utilities. See docs/models.md.",
    )
    sub = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")

    init = sub.add_parser(
        "init-tiny",
        help="write a tiny random-weight FluxPipeline (real classes) for tests and demos",
        description=(
            "Build a complete tiny FluxPipeline — FluxTransformer2DModel, AutoencoderKL, CLIP and T5 "
            "text encoders with tokenizers made offline, FlowMatchEulerDiscreteScheduler — with weights "
            "seeded by --seed, and save it with save_pretrained. It loads like FLUX.1-dev: "
            "FluxPipeline.from_pretrained(DIR, local_files_only=True). 64×64 images, T5 length 32, ~1.4 MB."
        ),
    )
    init.add_argument("--output", required=True, metavar="DIR", help="directory to write (must be new or empty)")
    init.add_argument("--seed", type=int, default=0, help="weight seed (default 0); same seed, same weights")
    init.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    init.set_defaults(handler=_init_tiny)

    shapes = sub.add_parser(
        "pretrain-shapes",
        help="pretrain the tiny FluxPipeline on the shapes task (CPU, minutes) and save it",
        description=(
            "Pretrain the tiny FluxPipeline (real classes, VAE included) on the 360 scenes of the shapes task "
            "(g2rpo.tasks.shapes): the VAE as an autoencoder, then the transformer by flow matching, seeded by "
            "--seed so the same settings give the same weights; save it with save_pretrained. Its prompts are "
            "the task's ('a small red circle at the top left on a black background'), scored exactly by the "
            "shapes_* rewards. See docs/models.md."
        ),
    )
    shapes.add_argument("--output", required=True, metavar="DIR", help="directory to write (must be new or empty)")
    shapes.add_argument("--seed", type=int, default=0, help="seed of the weights and of every draw (default 0)")
    add_pretraining_args(shapes, prefix="")
    shapes.add_argument("--prompts", metavar="FILE", help="also write the task's 360 prompts to FILE, one a line")
    shapes.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    shapes.set_defaults(handler=_pretrain_shapes)

    rewards = sub.add_parser(
        "pretrain-shapes-rewards",
        help="train the shapes task's learned rewards (a tiny CLIP and a preference model; CPU, ~15 min)",
        description=(
            "Train the testbed's analogues of CLIP and HPS-v2.1 (g2rpo.rewards.shapes_learned): shapes_clip, "
            "a tiny open_clip CLIP trained contrastively on augmented renders of the pretraining scenes, and "
            "shapes_pref, shapes_clip fine-tuned on pairs of the base model's samples ranked by the exact "
            "utility (shapes_colour + shapes_shape) / 2. The unseen scenes are left out of both. Writes "
            "OUTPUT/shapes_clip and OUTPUT/shapes_pref (open_clip local-dir folders, sealed by a manifest), "
            "loaded by the clip and hps_v21 reward heads. See docs/models.md."
        ),
    )
    rewards.add_argument("--output", required=True, metavar="DIR", help="folder to write the two models into")
    rewards.add_argument(
        "--base-model",
        metavar="DIR",
        help="the shapes model whose samples the preferences rank (default: the shipped unseen-scenes model)",
    )
    rewards.add_argument("--seed", type=int, default=0, help="seed of the weights and of every draw (default 0)")
    rewards.add_argument("--clip-steps", type=int, default=2500, help="contrastive steps (default 2500)")
    rewards.add_argument("--pref-steps", type=int, default=1200, help="preference steps (default 1200)")
    rewards.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTPUT/shapes_clip and shapes_pref when they are learned rewards",
    )
    rewards.set_defaults(handler=_pretrain_shapes_rewards)

    quality = sub.add_parser(
        "quality-shapes",
        help="score a shapes model's samples on the held-out prompts (asked colour drawn, per colour and shape)",
        description=(
            "Sample a shapes model on the 64 prompts the pipeline's prepare step holds out of the task's 360 "
            "(split seed 0) at each --seeds with the deterministic ODE sampler, and score them with the task's "
            "exact rewards: every metric's mean, the fraction drawn in the asked colour per colour, the shape "
            "score per shape, and the fraction of prompts whose samples all agree in colour (they give GRPO no "
            "colour signal). See docs/models.md."
        ),
    )
    quality.add_argument(
        "model",
        nargs="?",
        default=None,
        help="the model folder (default: g2rpo/models/shapes_flux_unseen, the demo's base model; "
        "g2rpo/models/shapes_flux for the model that saw every scene)",
    )
    quality.add_argument("--seeds", default="0,1,2,3", help="comma-separated sampling seeds (default 0,1,2,3)")
    quality.add_argument(
        "--num-steps", type=int, default=6, help="Euler steps on Flux's grid (default 6, the demo's T)"
    )
    quality.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    quality.set_defaults(handler=_quality_shapes)

    check = sub.add_parser(
        "check",
        help="check that a model location holds a complete FluxPipeline",
        description=(
            "Check a model location (local directory or s3:// URI of a published model) for "
            "model_index.json and every component's folder, config and weights; print the base "
            "model's licence. Exit status 2 and a list of what is missing otherwise."
        ),
    )
    check.add_argument("location", help="model directory or s3://bucket/prefix")
    check.add_argument(
        "--components",
        default="all",
        help="comma-separated components to require (default all; training needs transformer,vae,scheduler)",
    )
    check.set_defaults(handler=_check)


def _init_tiny(args: argparse.Namespace) -> int:
    from g2rpo.models.tiny import save_tiny_flux

    out = save_tiny_flux(args.output, seed=args.seed, overwrite=args.overwrite)
    print(f"wrote tiny FluxPipeline (seed {args.seed}) to {out}")
    return 0


def add_shapes_model_args(parser: argparse.ArgumentParser) -> None:
    """``--model`` (the pretrained shapes model; default the shipped one that has never seen the held-out
    scenes) and the pretraining step flags of :func:`add_pretraining_args` with that model's settings as
    their defaults: what ``g2rpo pipeline run-local`` (and ``g2rpo demo``) train."""
    parser.add_argument(
        "--model",
        default=None,
        help="the pretrained shapes model (default: the one shipped in the package that never saw the 64 held-out "
        "nor the 32 validation scenes, g2rpo/models/shapes_flux_unseen, checked against its manifest); a folder "
        "that does not exist is pretrained there first (minutes), one that does must have been made with the "
        "pretraining settings asked for",
    )
    add_pretraining_args(parser, defaults="g2rpo/models/shapes_flux_unseen's")


def shapes_model_path(args: argparse.Namespace) -> Path:
    """``--model``, or the shipped unseen-scenes shapes model (the demo's) when it is not given."""
    from g2rpo.models.shapes import SHIPPED_UNSEEN_MODEL

    return Path(args.model) if args.model else SHIPPED_UNSEEN_MODEL


def add_pretraining_args(
    parser: argparse.ArgumentParser, prefix: str = "pretrain-", defaults: str = "the shipped model's"
) -> None:
    """``--{prefix}vae-steps``, ``--{prefix}flow-steps``, ``--{prefix}colour-noise`` and ``--{prefix}unseen``:
    the shapes model's pretraining settings (read back by :func:`pretraining_settings`); ``defaults`` names
    the model whose settings they default to, as the help says it."""
    of = f"(default: {defaults})"
    parser.add_argument(
        f"--{prefix}vae-steps",
        dest="vae_steps",
        type=int,
        default=None,
        help=f"VAE optimiser steps of the shapes model's pretraining {of}",
    )
    parser.add_argument(
        f"--{prefix}flow-steps",
        dest="flow_steps",
        type=int,
        default=None,
        help=f"flow-matching steps of the shapes model's pretraining {of}",
    )
    parser.add_argument(
        f"--{prefix}colour-noise",
        dest="colour_noise",
        type=float,
        default=None,
        help="probability that a flow-matching caption names another colour, so the model draws the asked "
        f"colour on about 1 − p of its samples {of}",
    )
    parser.add_argument(
        f"--{prefix}unseen",
        dest="unseen",
        type=int,
        default=None,
        metavar="N",
        help="leave the N scenes the prepare split (seed 0) holds out first out of pretraining, never drawn "
        f"nor named: 96 = the 64 held-out + the ablation's 32 validation scenes {of}",
    )


def pretraining_settings(
    args: argparse.Namespace, prefix: str = "pretrain-", seed: int = 0, base: ShapesPretraining | None = None
) -> ShapesPretraining:
    """The :class:`~g2rpo.models.shapes.ShapesPretraining` that :func:`add_pretraining_args`' flags ask for,
    on top of ``base`` (default ``ShapesPretraining()``, the settings of ``shapes_flux``) with ``seed``."""
    from g2rpo.models.shapes import ShapesPretraining

    settings = replace(base or ShapesPretraining(), seed=seed)
    for field in ("vae_steps", "flow_steps"):
        value = getattr(args, field)
        if value is not None:
            if value < 1:
                raise G2RPOError(problem(f"--{prefix}{field.replace('_', '-')}", value, "use at least 1 step"))
            settings = replace(settings, **{field: value})
    if args.colour_noise is not None:
        if not 0 <= args.colour_noise < 0.75:
            raise G2RPOError(
                problem(
                    f"--{prefix}colour-noise",
                    args.colour_noise,
                    "use a probability in [0, 0.75): at 0.75 every colour is equally likely whatever the prompt asks",
                )
            )
        settings = replace(settings, colour_noise=args.colour_noise)
    if getattr(args, "unseen", None) is not None:
        if not 0 <= args.unseen <= 180:
            raise G2RPOError(
                problem(f"--{prefix}unseen", args.unseen, "leave out between 0 and 180 of the 360 scenes (96 is usual)")
            )
        settings = replace(settings, unseen=args.unseen)
    return settings


def _pretrain_shapes(args: argparse.Namespace) -> int:
    from g2rpo.models.shapes import pretrain_shapes
    from g2rpo.tasks.shapes import write_prompts

    settings = pretraining_settings(args, prefix="", seed=args.seed)
    out = pretrain_shapes(args.output, settings, overwrite=args.overwrite, log=print, progress=True)
    print(f"wrote the shapes FluxPipeline (seed {args.seed}) to {out}")
    from g2rpo.evaluation.shapes import shapes_quality

    print(shapes_quality(out).table())
    if args.prompts:
        print(f"wrote the task's prompts to {write_prompts(args.prompts)}")
    return 0


def _pretrain_shapes_rewards(args: argparse.Namespace) -> int:
    from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL, ShapesPretraining, check_shapes_model, shapes_sampler
    from g2rpo.rewards.shapes_learned import RewardPretraining, pretrain_shapes_rewards

    for flag, value in (("--clip-steps", args.clip_steps), ("--pref-steps", args.pref_steps)):
        if value < 1:
            raise G2RPOError(problem(flag, value, "give at least 1 step"))
    base = Path(args.base_model) if args.base_model else SHIPPED_SHAPES_MODEL.with_name("shapes_flux_unseen")
    settings = RewardPretraining(seed=args.seed, clip_steps=args.clip_steps, pref_steps=args.pref_steps)
    if (base / "g2rpo_tiny.json").is_file():  # a shapes model: it must be sealed and made without the unseen scenes
        check_shapes_model(base, replace(ShapesPretraining(), unseen=settings.unseen))
    clip, pref = pretrain_shapes_rewards(
        args.output,
        shapes_sampler(base),
        settings,
        base_model=base.name,
        overwrite=args.overwrite,
        log=print,
        progress=True,
    )
    print(f"wrote {clip} (the clip head's weights) and {pref} (the hps_v21 head's weights)")
    return 0


def _quality_shapes(args: argparse.Namespace) -> int:

    from g2rpo.evaluation.shapes import shapes_quality
    from g2rpo.models.shapes import (
        SHIPPED_SHAPES_MODEL,
        SHIPPED_UNSEEN_MODEL,
        UNSEEN_PRETRAINING,
        ShapesPretraining,
        check_shapes_model,
    )

    try:
        seeds = [int(v) for v in args.seeds.split(",")]
    except ValueError:
        raise G2RPOError(problem("--seeds", args.seeds, "give comma-separated integers, e.g. 0,1,2,3")) from None
    if args.num_steps < 1:
        raise G2RPOError(problem("--num-steps", args.num_steps, "use at least 1 step"))
    # The demo's base model by default: the numbers it prints are those `make demo` starts from.
    model = Path(args.model).resolve() if args.model else SHIPPED_UNSEEN_MODEL
    shipped = {SHIPPED_UNSEEN_MODEL: UNSEEN_PRETRAINING, SHIPPED_SHAPES_MODEL: ShapesPretraining()}
    if model in shipped:
        check_shapes_model(model, shipped[model])
    report = shapes_quality(model, seeds=seeds, num_steps=args.num_steps)
    print(f"{model}: {report.table()}")
    if args.json:
        Path(args.json).write_text(_json.dumps(report.as_dict(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from g2rpo.models.loading import ALL_COMPONENTS, base_model_record, check_model_dir, resolve_model_location

    components = (
        ALL_COMPONENTS
        if args.components == "all"
        else tuple(c.strip() for c in args.components.split(",") if c.strip())
    )
    root = resolve_model_location(args.location)
    check_model_dir(root, components)
    verified = (
        "every file matches its manifest.json"
        if (root / "manifest.json").is_file()
        else "no manifest.json, so the bytes are not verified (only the layout and the safetensors headers)"
    )
    print(f"ok: {root} has {', '.join(components)}; {verified}")
    print(json.dumps(base_model_record(args.location), indent=2))
    return 0
