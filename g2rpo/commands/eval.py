"""``g2rpo eval``: evaluate a model URI on a prompt set and publish the scores (g2rpo.steps.evaluate)."""

from __future__ import annotations

import argparse
import textwrap

from g2rpo.errors import G2RPOError


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser(
        "eval",
        help="score a model (Flux pipeline or trainer export) on fixed prompts × seeds; publish the result",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "ODE-sample every (prompt, seed) of a prompt set with the model at --model (a FluxPipeline folder "
            "or a training run's export, local or s3://), decode, score with the reward models, and publish "
            "one artifact at --output: report.html, scores.json (per prompt and seed), scores.jsonl, metrics.json "
            "(mean, std, n, 95% CI per step count), prompts.json, images/, plots/, grid/ (the images in pages of 8 prompts, with an index; grid.png is its first page) and manifest.json (last). "
            "An interrupted evaluation continues when run again with the same arguments. The same (prompt, seed) gives the same "
            "image for the same weights, so two evaluations compare paired. Config: --config FILE, then "
            "key=value overrides, then the flags below. `g2rpo eval --describe` lists every key. "
            "See docs/evaluation.md.",
            width=88,
        ),
        epilog=(
            "example:\n"
            "  g2rpo eval --model runs/tiny-cpu/export --prompts configs/tiny-prompts.txt \\\n"
            "      --output runs/eval-1 --seeds 0,1 --steps 4 --metrics jpeg_compressibility \\\n"
            "      num_prompts=4 device=cpu"
        ),
    )
    ev.add_argument("--model", metavar="URI", help="FluxPipeline folder or trainer export (path, file:// or s3://)")
    ev.add_argument("--prompts", metavar="URI", help="prompt file, .txt (one per line) or .jsonl (sets `prompts`)")
    ev.add_argument("--output", metavar="URI", help="where to publish the evaluation (a new path or s3:// prefix)")
    ev.add_argument(
        "--base-model",
        metavar="URI",
        help="the FluxPipeline an export was trained from (VAE, text encoders); default: the local folder the "
        "export's base_model.json records",
    )
    ev.add_argument("--config", metavar="FILE", help="evaluation config (YAML); see --describe")
    ev.add_argument("--seeds", metavar="S,S,...", help="sampling seeds, comma-separated (sets `seeds`; default 0,1,2)")
    ev.add_argument(
        "--steps",
        metavar="T,T,...",
        help="ODE sampler steps, comma-separated: the first sets `num_steps` (scores.json, what the registry and "
        "the promotion gates read), the rest `extra_steps` (reported beside it), e.g. 16,10,20; default 16",
    )
    ev.add_argument(
        "--baseline",
        metavar="URI",
        help="a published evaluation of another model on the same prompts and seeds (e.g. the champion's): the "
        "report pairs the two (side by side, differences with CIs)",
    )
    ev.add_argument(
        "--metrics",
        metavar="NAME,...",
        help="reward models by name, comma-separated (sets `rewards.models`; `g2rpo rewards list`)",
    )
    ev.add_argument("--pushgateway", metavar="URL", help="push the metric summaries to this Prometheus Pushgateway")
    ev.add_argument("--pipeline", default="local", help="the pushed series' `pipeline` label (default: local)")
    ev.add_argument("--version-label", default="", metavar="V", help="the pushed series' `version` label, e.g. v3")
    ev.add_argument("--describe", action="store_true", help="list every config key (type, default, help) and exit")
    ev.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, values parsed as YAML (e.g. num_prompts=8 device=cpu grid=static_shift)",
    )
    ev.set_defaults(handler=_eval)


def _eval(args: argparse.Namespace) -> int:
    from g2rpo.config import describe, load_config, parse_overrides
    from g2rpo.evaluation.config import EvaluationConfig

    if args.describe:
        print("\n".join(describe(EvaluationConfig)))
        return 0
    missing = [flag for flag, value in (("--model", args.model), ("--output", args.output)) if not value]
    if missing:
        raise G2RPOError(f"g2rpo eval needs {' and '.join(missing)}: see `g2rpo eval --help`")
    overrides = parse_overrides(args.overrides)
    if args.prompts:
        overrides["prompts"] = args.prompts
    if args.seeds is not None:
        overrides["seeds"] = [part.strip() for part in args.seeds.split(",") if part.strip()]
    if args.steps is not None:
        steps = [part.strip() for part in args.steps.split(",") if part.strip()]
        if not steps:
            raise G2RPOError(f"--steps={args.steps!r}: give one or more step counts, e.g. --steps 16 or 16,10,20")
        overrides["num_steps"], overrides["extra_steps"] = steps[0], steps[1:]
    if args.metrics:
        rewards = overrides.setdefault("rewards", {})
        rewards["models"] = [{"name": name.strip()} for name in args.metrics.split(",") if name.strip()]
    config = load_config(EvaluationConfig, args.config, overrides)

    from g2rpo.observability.push import PushTarget
    from g2rpo.steps.evaluate import evaluate

    result = evaluate(
        args.model,
        config,
        args.output,
        base_model_uri=args.base_model,
        baseline_uri=args.baseline,
        progress=True,
        pushgateway=PushTarget(args.pushgateway, pipeline=args.pipeline) if args.pushgateway else None,
        version_label=args.version_label,
    )
    print(
        f"evaluated {args.model}: {len(result.evaluation.prompts)} prompts × seeds {config.seeds}, "
        f"T={config.step_counts} (gated: T={config.num_steps}); {result.generated} image(s) sampled by this run"
    )
    for steps, table in result.by_steps.items():
        for name, s in table.items():
            print(
                f"  T={steps:<3} {name:<24} mean {s['mean']:.4f}  std {s['std']:.4f}  n {s['n']}  "
                f"95% CI [{s['ci_low']:.4f}, {s['ci_high']:.4f}]"
            )
    for steps, table in result.paired.items():
        for name, s in table.items():
            print(
                f"  vs baseline T={steps:<3} {name:<24} Δ {s['delta']:+.4f}  95% CI [{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]"
            )
    print(f"published {result.output_uri} (report.html, metrics.json, scores.json, scores.jsonl, images/, plots/)")
    print(f"report: {result.report_uri}")
    return 0
