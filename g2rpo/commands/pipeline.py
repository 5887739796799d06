"""``g2rpo pipeline compile | submit | schedule | run-local``: the Kubeflow pipeline from the command line.

The only module of ``g2rpo`` that imports ``pipelines`` (an exception the import contract names): the
handlers parse arguments and call :mod:`pipelines.alignment`, :mod:`pipelines.submit` or
:mod:`pipelines.local`, imported inside them so that ``g2rpo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import g2rpo
from g2rpo.commands.model import add_shapes_model_args, pretraining_settings, shapes_model_path
from g2rpo.errors import G2RPOError, problem
from g2rpo.progress import import_saying
from g2rpo.steps.parameters import describe_parameters

_PARAMS_HELP = (
    "pipeline parameters as name=value (values are YAML: iterations=100, granularities=[1,2], "
    "node_selector='{pool: h200-spot}'); unknown names are refused with the valid ones listed, and every value "
    "is checked as the tasks will use it before anything is sent. node_selector is MERGED over the profile's "
    "labels ({pool: h200-spot} keeps nvidia.com/gpu.product); a label set to null is removed. "
    "`g2rpo pipeline submit --help` lists every parameter with its default"
)
RUN_LOCAL_ITERATIONS = 40  # the shapes recipe's (docs/demo.md)
# What run-local loads before its first check, in the order its imports reach them, each said as it starts.
RUN_LOCAL_LIBRARIES = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("diffusers", "diffusers"),
    ("kfp", "kfp"),
    ("the pipeline and its tasks", "pipelines.local"),
)
_CRON_HELP = (
    "KFP cron: SIX fields, seconds first — 'sec min hour day-of-month month day-of-week' — evaluated in UTC "
    "by the KFP scheduler, e.g. '0 0 3 * * *' = 03:00 UTC every day, '0 30 2 * * MON' = Mondays 02:30 UTC"
)


class DefaultsOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default said once: argparse's ``(default: X)``, unless the help already says it or
    there is none to say (``None``: the help says what is used instead)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="compile, submit, schedule or locally run the Kubeflow alignment pipeline",
        description="The alignment pipeline (prepare → train → evaluate → decide → promote if the gates pass) on "
        "Kubeflow Pipelines v2: compile it to YAML, submit a run or a recurring run to a KFP host, or run the whole "
        "DAG on this machine through kfp.local on the shapes model.",
    )
    sub = parser.add_subparsers(dest="pipeline_command", metavar="VERB", required=True)

    comp = sub.add_parser("compile", help="write the pipeline's YAML (pipeline spec + Kubernetes platform spec)")
    comp.add_argument("--output", default="pipelines/compiled/alignment.yaml", metavar="FILE", help="YAML to write")
    _profile_arg(comp)
    comp.set_defaults(handler=_compile)

    run = sub.add_parser(
        "submit",
        help="start one run on a KFP cluster",
        epilog=describe_parameters(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _cluster_args(run)
    run.add_argument("--run-name", default=None, help="display name of the run (default: the pipeline's name)")
    run.set_defaults(handler=_submit)

    sched = sub.add_parser(
        "schedule",
        help="create a recurring run (cron in UTC, six fields, seconds first; one at a time; no catch-up)",
        description="Creates a KFP recurring run of the pipeline with max_concurrency=1 (runs never overlap) and "
        "no_catchup (a paused schedule does not back-fill missed slots). " + _CRON_HELP + ".",
    )
    _cluster_args(sched)
    sched.add_argument("--cron", required=True, help=_CRON_HELP)
    sched.add_argument(
        "--name",
        default=None,
        help="name of the recurring run (default g2rpo-alignment-schedule; at most 255 characters). One per name "
        "and experiment: the same name with the same settings changes nothing; with other settings it is refused",
    )
    sched.add_argument(
        "--replace",
        action="store_true",
        help="replace the recurring run of this name: create the new one, then disable and delete the old one",
    )
    sched.set_defaults(handler=_schedule)

    local = sub.add_parser(
        "run-local",
        help="run the whole DAG here through kfp.local on the shapes model (what `make demo` runs)",
        description="Runs prepare → train → evaluate → decide → promote through kfp.local (SubprocessRunner, no "
        "containers) on the shapes task: the shapes model that never saw the 64 held-out scenes (shipped; another "
        "--model is pretrained there on first use, minutes, and reused after), its 360 prompts, "
        "configs/shapes-cpu.yaml (trained on the learned rewards hps_v21 + clip, g2rpo/models/shapes_pref and "
        "shapes_clip, as production trains on HPS + CLIP; the exact shapes_* scores and jpeg_compressibility are "
        "never trained on and gated as held-out ground truth) and configs/shapes-gates.yaml. The run folder "
        "OUT/NAME holds the pipeline root, the tasks' temp files and pipeline.log (all of kfp.local's output); the store (exports, evaluations) and the registry live in "
        "--shared and are reused, so a second run evaluates its challenger against the first run's champion and "
        "promotes or refuses it, with the reason.",
        formatter_class=DefaultsOnceFormatter,
    )
    add_run_local_args(local)
    local.set_defaults(handler=run_local_command)


def add_run_local_args(local: argparse.ArgumentParser) -> None:
    """The options of ``run-local`` (``g2rpo demo`` takes the same: it runs the same command)."""
    local.add_argument("--out", default="runs", help="folder of the run folders")
    local.add_argument("--name", default=None, help="run folder name (default pipeline-<UTC timestamp>)")
    local.add_argument("--shared", default="runs/pipeline-shared", help="prompts, store and registry of every run")
    add_shapes_model_args(local)
    local.add_argument(
        "--iterations",
        type=int,
        default=RUN_LOCAL_ITERATIONS,
        help=f"training iterations (default {RUN_LOCAL_ITERATIONS}: the shapes recipe, docs/demo.md)",
    )
    local.add_argument(
        "--verbose",
        action="store_true",
        help="print all of kfp.local's output (its INFO lines, executor inputs, warnings); always in OUT/NAME/pipeline.log",
    )
    local.add_argument(
        "--s3-endpoint",
        default=None,
        help="S3 endpoint for s3:// store_uri/registry_uri parameters (sets AWS_ENDPOINT_URL_S3 for the tasks)",
    )
    local.add_argument("parameters", nargs="*", metavar="NAME=VALUE", help=_PARAMS_HELP)


def _profile_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="placement profile (default g2rpo/steps/profiles/h200.yaml): GPUs, node pool, /dev/shm, S3 secret name",
    )


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="KFP API URL, e.g. http://localhost:8888 (a port-forward)")
    parser.add_argument("--experiment", default="g2rpo", help="KFP experiment (made when missing)")
    parser.add_argument("--pipeline-root", default=None, help="where KFP stores task outputs (default: the cluster's)")
    parser.add_argument(
        "--service-account", default=None, help="Kubernetes service account of the runs (default: the profile's)"
    )
    _profile_arg(parser)
    parser.add_argument("parameters", nargs="*", metavar="NAME=VALUE", help=_PARAMS_HELP)


def _use_source_tree() -> None:
    """``components/`` and ``pipelines/`` are loaded from the g2rpo checkout, never installed as
    top-level packages (docs/architecture.md): put the checkout that holds this g2rpo on the path."""
    root = Path(g2rpo.__file__).resolve().parents[1]
    if not (root / "pipelines" / "__init__.py").is_file() or not (root / "components" / "__init__.py").is_file():
        raise G2RPOError(
            problem(
                "g2rpo",
                str(root),
                "the pipeline verbs need g2rpo installed from its source checkout (pip install -e <checkout>), "
                "which holds components/ and pipelines/",
            )
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _compile(args: argparse.Namespace) -> int:
    _use_source_tree()
    # The first line before the imports (kfp, the components, the train step's parameters: seconds).
    print(f"compiling the alignment pipeline into {args.output} (loading kfp and the components) …", file=sys.stderr)
    from pipelines.alignment import compile_pipeline

    print(f"wrote {compile_pipeline(args.output, args.profile)}")
    return 0


def _submit(args: argparse.Namespace) -> int:
    _use_source_tree()
    from g2rpo.commands.reachability import check_reachable

    check_reachable(args.host)  # before the pipeline's imports and checks, which take seconds
    from g2rpo.steps.placement import load_profile
    from pipelines.submit import parse_arguments, submit

    arguments = parse_arguments(args.parameters, load_profile(args.profile))
    done = submit(
        args.host,
        arguments,
        experiment=args.experiment,
        run_name=args.run_name,
        profile_path=args.profile,
        pipeline_root=args.pipeline_root,
        service_account=args.service_account,
    )
    print(f"submitted {done.kind} {done.id} in experiment {args.experiment!r}: {done.url}")
    return 0


def _schedule(args: argparse.Namespace) -> int:
    _use_source_tree()
    from g2rpo.commands.reachability import check_reachable

    check_reachable(args.host)  # before the pipeline's imports and checks, which take seconds
    from g2rpo.steps.placement import load_profile
    from pipelines.submit import check_cron, next_fire_times, parse_arguments, schedule

    cron = check_cron(args.cron)
    arguments = parse_arguments(args.parameters, load_profile(args.profile))
    fires = ", ".join(t.strftime("%Y-%m-%d %H:%M:%S") for t in next_fire_times(cron, datetime.now(UTC)))
    done = schedule(
        args.host,
        cron,
        arguments,
        experiment=args.experiment,
        name=args.name,
        profile_path=args.profile,
        pipeline_root=args.pipeline_root,
        service_account=args.service_account,
        replace=args.replace,
    )
    if done.kind == "existing recurring run":
        print(f"already scheduled with these settings: recurring run {done.id} on '{cron}' (UTC); nothing changed")
    else:
        print(f"scheduled {done.kind} {done.id} on '{cron}' (UTC) in experiment {args.experiment!r}: {done.url}")
        for old in done.replaced:
            print(f"  replaced recurring run {old} (disabled and deleted after the new one was created)")
    print(f"  next fire times (UTC): {fires}")
    return 0


def run_local_command(args: argparse.Namespace) -> int:
    """``g2rpo pipeline run-local`` (and ``g2rpo demo``): the pipeline here, then its summary and verdict."""
    _use_source_tree()
    if args.iterations < 1:  # refused before the seconds of imports
        raise G2RPOError(problem("--iterations", args.iterations, "run at least one iteration"))
    # A line at once, then one per library: together they take 5-10 s on two cores, more on a busy CPU.
    print("g2rpo pipeline run-local: loading its libraries …", flush=True)
    import_saying(RUN_LOCAL_LIBRARIES, lambda label: print(f"  {label} …", flush=True))
    from g2rpo.models.shapes import UNSEEN_PRETRAINING
    from pipelines.local import run_local
    from pipelines.submit import parse_arguments

    arguments = parse_arguments(args.parameters)
    pretraining = pretraining_settings(args, base=UNSEEN_PRETRAINING)  # --model's default is shapes_flux_unseen
    if not args.verbose:
        quiet_libraries()
    if args.s3_endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.s3_endpoint
    name = args.name or f"pipeline-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    started = time.monotonic()
    run = run_local(
        Path(args.out) / name,
        Path(args.shared),
        model=shapes_model_path(args),
        iterations=args.iterations,
        parameters=arguments,
        pretraining=pretraining,
        verbose=args.verbose,
    )
    print_summary(run, time.monotonic() - started)
    return 0 if run.state == "SUCCEEDED" else 1


def print_summary(run: Any, seconds: float) -> None:  # run: pipelines.local.LocalRun
    """What a local run left and where, the held-out means beside the base model's, and the verdict last."""
    from g2rpo.steps.records import CandidatesRecord, read_record
    from pipelines.local import verdict

    # The run's state (did every task run?) and the model's verdict (was it promoted?) are worded apart,
    # and the verdict is the last line, said once: the decide task printed the gates and their reasons.
    ran = "every task ran" if run.state == "SUCCEEDED" else "see the log"
    print(f"\ng2rpo pipeline run-local: run {run.state} ({ran}; {seconds:.0f} s)")
    for label, path in run.outputs.items():
        print(f"  {label:<22} {path}")
    evaluation = run.outputs.get("evaluate/evaluation")
    if evaluation is not None and (evaluation / "record.json").is_file():
        # Read as every consumer of a task's record reads it: a damaged one is named, not a traceback.
        record = read_record(CandidatesRecord, evaluation, field="evaluate/evaluation")
        where = record.challenger_eval_uri
        print(f"  challenger images      {where}/images  (grid pages {where}/grid/, metrics {where}/metrics.json)")
        for line in means_table(record, run.base_means, run.metrics):
            print(f"  {line}")
        print(f"  evaluation report      {where}/report.html")
    for name, path in run.reports.items():
        print(f"  {name.removesuffix('.html').replace('-', ' '):<22} {path.resolve().as_uri()}")
    if run.decision and not run.decision["passed"] and not any(key.startswith("promote/") for key in run.outputs):
        print(f"  {'promote':<22} skipped: v{run.decision['version']} did not pass the gates (the DAG's dsl.If)")
    print(f"  champion now           {'none' if run.champion is None else f'v{run.champion}'}")
    print(f"  log                    {run.log}")
    print(verdict(run))


def means_table(record: Any, base_means: dict[str, float], order: list[str] = ()) -> list[str]:  # CandidatesRecord
    """The held-out means as the README shows them: the trained rewards first, then the others in the run's
    order (``order``: its rewards), a column per model (base model, the champion when there is one, the
    challenger) and the challenger's paired difference to its baseline with the 95 % bootstrap interval."""
    trained = [m for m in record.trained_metrics if m in record.challenger_means]
    rest = [m for m in order if m in record.challenger_means and m not in trained]
    metrics = trained + rest + sorted(set(record.challenger_means) - set(trained) - set(rest))
    # A first version's baseline is the base model: its evaluation stands in when none was made before the DAG.
    columns = {"base model": base_means or (record.baseline_means if record.baseline_label == "base model" else {})}
    if record.champion_means:
        columns[f"champion v{record.champion_version}"] = record.champion_means
    columns["challenger"] = record.challenger_means
    n = next((int(p["n"]) for p in record.paired.values()), None)
    versus = record.baseline_label or "baseline"
    head = f"held-out means ({n} samples)" if n else "held-out means"
    width = max(len(head), *(len(f"{m} (trained)") for m in metrics))
    lines = [f"{head:<{width}} " + "".join(f"{name:>14}" for name in columns) + f"   Δ vs {versus} (95 % CI)"]
    for metric in metrics:
        values = "".join(f"{means[metric]:>14.4f}" if metric in means else f"{'—':>14}" for means in columns.values())
        paired = record.paired.get(metric)
        delta = "—" if paired is None else f"{paired['delta']:+.3f} [{paired['ci_low']:+.3f}, {paired['ci_high']:+.3f}]"
        name = f"{metric} (trained)" if metric in trained else metric
        lines.append(f"{name:<{width}} {values}   {delta}")
    return lines


def quiet_libraries() -> None:
    """The console gets the run's own lines: hide the libraries' loading bars and their below-error
    log lines.

    DeepSpeed logs (to stdout) a warning when it finds no GPU, on its first import; a filter on its
    logger outlives the level that its import sets.
    """
    import logging

    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    logging.getLogger("DeepSpeed").addFilter(lambda record: record.levelno >= logging.ERROR)
