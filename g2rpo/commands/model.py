"""``g2rpo model``: make the tiny Flux pipeline, check a model directory."""

from __future__ import annotations

import argparse
import json


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser(
        "model",
        help="make the tiny test model, check a model directory",
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
    init.add_argument("--overwrite", action="store_true", help="write into a non-empty directory")
    init.set_defaults(handler=_init_tiny)

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


def _check(args: argparse.Namespace) -> int:
    from g2rpo.models.loading import ALL_COMPONENTS, base_model_record, check_model_dir, resolve_model_location

    components = (
        ALL_COMPONENTS
        if args.components == "all"
        else tuple(c.strip() for c in args.components.split(",") if c.strip())
    )
    root = resolve_model_location(args.location)
    check_model_dir(root, components)
    print(f"ok: {root} has {', '.join(components)}")
    print(json.dumps(base_model_record(args.location), indent=2))
    return 0
