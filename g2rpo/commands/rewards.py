"""``g2rpo rewards list`` and ``g2rpo rewards score``: the registered reward heads."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.textfile import describe_kind


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    rewards = subparsers.add_parser(
        "rewards",
        help="list the reward models and score images with one",
        description="Reward models (HPS-v2.1, CLIP, PickScore, ImageReward, weight-free scorers). See docs/rewards.md.",
    )
    sub = rewards.add_subparsers(dest="rewards_command", metavar="SUBCOMMAND", required=True)
    lst = sub.add_parser(
        "list",
        help="print every registered reward with what it needs",
        description="Print each registered reward name, its native scale, and the files/config keys it needs.",
    )
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(handler=_list)

    score = sub.add_parser(
        "score",
        help="score image files against a prompt with one reward",
        description=(
            "Load reward NAME (weights from --weights and the other keys given as KEY=VALUE, as in the "
            "rewards.models entries of a run config) and print one score per image. Images are read with "
            "PIL as RGB; consecutive images of one size are scored together, --batch-size at a time."
        ),
    )
    score.add_argument("name", metavar="NAME", help="registered reward name (see `g2rpo rewards list`)")
    score.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG/JPEG)")
    score.add_argument("--prompt", required=True, help="the prompt every image is scored against")
    score.add_argument("--weights", default=None, help="weights location (local path or s3://bucket/prefix)")
    score.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another config key of the reward entry: arch, arch_config, vision_config, tokenizer, backbone, "
        "max_new_tokens, dtype",
    )
    score.add_argument("--device", default="cpu", help="device (default cpu)")
    score.add_argument("--batch-size", type=int, default=16, help="images per call of the reward model (default 16)")
    score.add_argument("--json", action="store_true", help="print JSON")
    score.set_defaults(handler=_score)


def _list(args: argparse.Namespace) -> int:
    from g2rpo.rewards.specs import REWARDS

    rows = [
        {
            "name": s.name,
            "scale": s.scale,
            "needs": s.needs,
            "keys": list(s.keys),
            "summary": s.summary,
            "definition": s.definition,
        }
        for s in sorted(REWARDS.values(), key=lambda s: s.name)
    ]
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for row in rows:
        print(f"{row['name']}  ({row['scale']})")
        print(f"    {row['summary']}")
        print(f"    needs: {row['needs']}")
        print(f"    follows: {row['definition']}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from g2rpo.config import parse_overrides
    from g2rpo.rewards.config import RewardModelConfig

    extra = parse_overrides(args.settings)
    try:
        cfg = RewardModelConfig(name=args.name, weights=args.weights, **extra)
    except Exception as exc:  # pydantic ValidationError: report like every config error
        from pydantic import ValidationError

        if not isinstance(exc, ValidationError):
            raise
        from g2rpo.config import format_validation_error

        raise ConfigError(format_validation_error(RewardModelConfig, exc), source="command line") from None

    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    from g2rpo.rewards.registry import build_reward
    from g2rpo.rewards.scoring import score_rewards

    tensors = []
    for name in args.images:
        path = Path(name)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise G2RPOError(problem("IMAGE", name, "does not exist; pass image files")) from None
        if not stat.S_ISREG(mode):  # checked before opening: a FIFO would block the read
            raise G2RPOError(problem("IMAGE", name, f"is {describe_kind(mode)}, not an image file; pass image files"))
        try:  # PIL refuses an image of more than 2 × Image.MAX_IMAGE_PIXELS pixels before decoding it
            with Image.open(path) as img:
                array = np.asarray(img.convert("RGB"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise G2RPOError(problem("IMAGE", name, f"is not a readable image ({exc})")) from None
        tensors.append(torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0)  # [3, H, W]
    model = build_reward(cfg, device=args.device)
    scores = score_rewards([model], tensors, [args.prompt] * len(tensors), args.batch_size)[0].tolist()
    if args.json:
        print(
            json.dumps({"reward": args.name, "prompt": args.prompt, "scores": dict(zip(args.images, scores))}, indent=2)
        )
    else:
        for name, value in zip(args.images, scores):
            print(f"{value:.6f}  {name}")
    return 0
