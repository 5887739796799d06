"""``g2rpo data prep``: validate, dedupe and split a prompt file; optionally precompute text embeddings."""

from __future__ import annotations

import argparse
import json


def _test_size(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a count (400) or a fraction (0.05)") from None


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser(
        "data",
        help="prepare prompt sets and their text-embedding caches",
        description="Prompt data. See docs/models.md.",
    )
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    prep = sub.add_parser(
        "prep",
        help="validate, dedupe and split a prompt file; precompute text embeddings with --model",
        description=(
            "Read PROMPTS (.txt: one prompt per line; .jsonl: a 'prompt' field per line), reject empty "
            "or non-UTF-8 lines (listing each line number), drop duplicates, split deterministically and "
            "write OUTPUT/train.jsonl, OUTPUT/test.jsonl and OUTPUT/manifest.json. With --model, also "
            "encode both splits with the model's T5 and CLIP text encoders into sharded, memory-mapped "
            "caches OUTPUT/embeddings/{train,test}/ (each with its manifest, written last)."
        ),
    )
    prep.add_argument(
        "--prompts", required=True, metavar="FILE", help="prompt file (.txt or .jsonl): a path or s3://bucket/key"
    )
    prep.add_argument("--output", required=True, metavar="DIR", help="output directory")
    prep.add_argument(
        "--test-size", type=_test_size, default=400, help="test prompts: a count or a fraction (default 400)"
    )
    prep.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    prep.add_argument(
        "--model", metavar="LOCATION", help="Flux model (directory or s3://) whose text encoders fill the cache"
    )
    prep.add_argument("--dtype", default="bfloat16", help="text-encoder dtype: bfloat16 (default) or float32")
    prep.add_argument("--device", default="cpu", help="device for the text encoders (e.g. cuda)")
    prep.add_argument(
        "--max-sequence-length", type=int, default=None, help="T5 tokens (default: the tokenizer's, ≤ 512)"
    )
    prep.add_argument("--batch-size", type=int, default=8, help="prompts per encoder call (default 8)")
    prep.add_argument(
        "--shard-rows", type=int, default=256, help="prompts per shard (default 256 ≈ 1 GiB at Flux scale)"
    )
    prep.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    prep.set_defaults(handler=_prep)


def _prep(args: argparse.Namespace) -> int:
    from g2rpo.steps.prepare import prepare_data

    result = prepare_data(
        args.prompts,
        args.output,
        model_uri=args.model,
        test_size=args.test_size,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        max_sequence_length=args.max_sequence_length,
        batch_size=args.batch_size,
        shard_rows=args.shard_rows,
        overwrite=args.overwrite,
        progress=True,
    )
    print(
        f"{result.read} prompts read, {result.duplicates} duplicate(s) dropped: "
        f"{result.train} train, {result.test} test -> {result.output_dir}"
    )
    for split, cache in result.embeddings.items():
        shapes = {name: list(shape) for name, shape in cache.shapes.items()}
        print(
            f"{split}: {cache.count} embeddings in {cache.shards} shard(s), "
            f"{cache.total_bytes / 2**20:.1f} MiB, {cache.dtype}, shapes {json.dumps(shapes)}"
        )
    return 0
