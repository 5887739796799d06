"""The g2rpo Grafana dashboard, built with grafana-foundation-sdk and checked in as JSON.

``python -m g2rpo.observability.dashboard [PATH]`` writes it (default
``charts/g2rpo/dashboards/g2rpo.json``, which the Helm chart ships); a test regenerates it and
diffs, and runs every panel's PromQL against a live Prometheus. The SDK is a development tool
(the ``test`` extra): nothing at run time imports this module.

Template variables: ``datasource`` (a Prometheus), ``pipeline`` and ``run`` (multi-value, "All" =
``.*``). Every query selects ``pipeline=~"$pipeline"``, and the training ones ``run_id=~"$run"``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

__all__ = ["DEFAULT_PATH", "PANELS", "Panel", "build_dashboard", "dashboard_json", "main"]

DEFAULT_PATH = Path("charts/g2rpo/dashboards/g2rpo.json")
UID = "g2rpo-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN = 'pipeline=~"$pipeline", run_id=~"$run"'  # training series
PIPE = 'pipeline=~"$pipeline"'  # pushed series
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    """One panel: its title, what it tells an operator, its kind and unit, and its (expr, legend) queries."""

    row: str
    title: str
    description: str
    queries: tuple[tuple[str, str], ...]
    kind: str = "timeseries"  # timeseries | stacked | stat | state
    unit: str = "short"


PANELS: tuple[Panel, ...] = (
    Panel(
        "Training",
        "Reward per model and stride",
        "Mean finite reward of each iteration per reward model and stride (and its standard deviation), and "
        "over all rewards and ranks. Should rise; a sudden fall is G2RPORewardCollapse; a std near 0 leaves "
        "the groups nothing to learn from.",
        (
            (f"g2rpo_training_reward_mean{{{RUN}}}", "{{run_id}} {{reward}} stride {{stride}}"),
            (f"g2rpo_training_reward_std{{{RUN}}}", "{{run_id}} {{reward}} stride {{stride}} std"),
            (f"g2rpo_training_reward_global_mean{{{RUN}}}", "{{run_id}} all rewards"),
        ),
    ),
    Panel(
        "Training",
        "Advantages",
        "Mean, standard deviation and largest |value| of the group-normalised advantages. A std near 0 means "
        "the groups' rewards no longer differ (nothing to learn).",
        (
            (f"g2rpo_training_advantage_mean{{{RUN}}}", "{{run_id}} mean"),
            (f"g2rpo_training_advantage_std{{{RUN}}}", "{{run_id}} std"),
            (f"g2rpo_training_advantage_abs_max{{{RUN}}}", "{{run_id}} max |A|"),
        ),
    ),
    Panel(
        "Training",
        "Loss, clipping and importance ratios",
        "Loss (sum of the iteration's terms), fraction of ratios outside the clip range, and the largest ratio. "
        "A clip fraction near 1 means the update moves too far per iteration.",
        (
            (f"g2rpo_training_loss{{{RUN}}}", "{{run_id}} loss"),
            (f"g2rpo_training_clip_fraction{{{RUN}}}", "{{run_id}} clip fraction"),
            (f"g2rpo_training_importance_ratio_max{{{RUN}}}", "{{run_id}} max ratio"),
        ),
    ),
    Panel(
        "Training",
        "Gradient norm and learning rate",
        "Global gradient norm before clipping (G2RPOGradNormExplosion) and the learning rate.",
        (
            (f"g2rpo_training_grad_norm{{{RUN}}}", "{{run_id}} grad norm"),
            (f"g2rpo_training_learning_rate{{{RUN}}}", "{{run_id}} lr"),
        ),
    ),
    Panel(
        "Training",
        "Iterations and dropped groups",
        "Completed iterations against train.iterations, and groups dropped per second for NaN/inf rewards "
        "(G2RPONonFiniteRewards).",
        (
            (f"g2rpo_training_iteration{{{RUN}}}", "{{run_id}} iteration"),
            (f"g2rpo_training_target_iterations{{{RUN}}}", "{{run_id}} target"),
            (f"sum by (run_id) (rate(g2rpo_training_dropped_groups_total{{{RUN}}}[{RATE}]))", "{{run_id}} dropped/s"),
        ),
    ),
    Panel(
        "Training",
        "Throughput",
        "Transformer forwards per second while sampling, forwards/backwards per second while training, and the frozen "
        "reference's forwards (Flow-GRPO's KL; 0 otherwise) (rank 0's).",
        (
            (f"rate(g2rpo_training_sampling_forwards_total{{{RUN}}}[{RATE}])", "{{run_id}} sampling forwards/s"),
            (f"rate(g2rpo_training_forwards_total{{{RUN}}}[{RATE}])", "{{run_id}} training forwards/s"),
            (f"rate(g2rpo_training_backwards_total{{{RUN}}}[{RATE}])", "{{run_id}} backwards/s"),
            (f"rate(g2rpo_training_reference_forwards_total{{{RUN}}}[{RATE}])", "{{run_id}} reference forwards/s"),
        ),
    ),
    Panel(
        "Training",
        "Seconds per iteration by phase",
        "Mean seconds per iteration in sampling, decoding, reward and training, stacked: where the time goes.",
        (
            (
                f"sum by (run_id, phase) (rate(g2rpo_training_phase_seconds_sum{{{RUN}}}[{RATE}]))"
                f" / sum by (run_id, phase) (rate(g2rpo_training_phase_seconds_count{{{RUN}}}[{RATE}]))",
                "{{run_id}} {{phase}}",
            ),
        ),
        kind="stacked",
        unit="s",
    ),
    Panel(
        "Training",
        "Phase time, 90th percentile",
        "90th percentile of each phase's seconds per iteration (histogram buckets): spikes show slow steps.",
        (
            (
                f"histogram_quantile(0.9, sum by (run_id, phase, le) "
                f"(rate(g2rpo_training_phase_seconds_bucket{{{RUN}}}[{RATE}])))",
                "{{run_id}} {{phase}} p90",
            ),
        ),
        unit="s",
    ),
    Panel(
        "Training",
        "Memory",
        "Accelerator memory of rank 0 (allocated, reserved, peak; CUDA only) and the trainer's resident host memory.",
        (
            (f"g2rpo_training_accelerator_memory_bytes{{{RUN}}}", "{{run_id}} {{device}} {{kind}}"),
            (
                "process_resident_memory_bytes * on (job, instance) group_left (run_id, pipeline) "
                f"g2rpo_training_run_info{{{RUN}}}",
                "{{run_id}} host resident",
            ),
        ),
        unit="bytes",
    ),
    Panel(
        "Training",
        "Age of the last complete checkpoint",
        "Seconds since the last complete checkpoint; a crash loses this much (G2RPOCheckpointTooOld).",
        ((f"time() - g2rpo_training_last_checkpoint_timestamp_seconds{{{RUN}}}", "{{run_id}}"),),
        kind="stat",
        unit="s",
    ),
    Panel(
        "Validation during training",
        "Held-out validation metrics",
        "Mean of each metric over the fixed validation prompts × seeds (ODE sampler) with its 95 % interval, "
        "at every validation of the run (train.validation). Trained rewards should rise; a falling out-of-domain "
        "metric is reward hacking, and past its max_regression that checkpoint cannot be exported.",
        (
            (f"g2rpo_training_validation_mean{{{RUN}}}", "{{run_id}} {{metric}}"),
            (f"g2rpo_training_validation_ci{{{RUN}}}", "{{run_id}} {{metric}} {{bound}}"),
        ),
    ),
    Panel(
        "Validation during training",
        "Objective, chosen checkpoint and early stop",
        "The validated objective (trained rewards' weighted sum), the iteration the export would take now, "
        "the out-of-domain metrics beyond tolerance at the last validation, and 1 once the run stopped early.",
        (
            (f"g2rpo_training_validation_objective{{{RUN}}}", "{{run_id}} objective"),
            (f"g2rpo_training_validation_selected_iteration{{{RUN}}}", "{{run_id}} chosen iteration"),
            (f"g2rpo_training_validation_breached_metrics{{{RUN}}}", "{{run_id}} metrics beyond tolerance"),
            (f"g2rpo_training_early_stopped{{{RUN}}}", "{{run_id}} stopped early"),
        ),
    ),
    Panel(
        "Validation during training",
        "Validation cost",
        "Seconds per second spent validating against training's phases (rank 0): what the validation "
        "schedule costs the run.",
        (
            (f"rate(g2rpo_training_validation_seconds_total{{{RUN}}}[{RATE}])", "{{run_id}} validation s/s"),
            (
                f"sum by (run_id) (rate(g2rpo_training_phase_seconds_sum{{{RUN}}}[{RATE}]))",
                "{{run_id}} training s/s",
            ),
        ),
    ),
    Panel(
        "Evaluation and promotion",
        "Evaluation metrics by version",
        "Mean of each evaluation metric over prompts × seeds with its 95 % interval, per evaluated version and "
        "sampler step count (pushed by the evaluate step).",
        (
            (f"g2rpo_evaluation_metric_mean{{{PIPE}}}", "{{metric}} {{version}} T={{steps}}"),
            (f"g2rpo_evaluation_metric_ci_lower{{{PIPE}}}", "{{metric}} {{version}} T={{steps}} low"),
            (f"g2rpo_evaluation_metric_ci_upper{{{PIPE}}}", "{{metric}} {{version}} T={{steps}} high"),
        ),
    ),
    Panel(
        "Evaluation and promotion",
        "Promotion decisions",
        "The last decision of each pipeline over time: promoted, rejected (reason: the first failed gate), "
        "dry_run, or error (G2RPOPromotionFailed).",
        (
            (
                f"count by (pipeline, model, outcome, reason) "
                f"(g2rpo_promotion_last_decision_timestamp_seconds{{{PIPE}}})",
                "{{pipeline}} {{model}} {{outcome}} ({{reason}})",
            ),
        ),
        kind="state",
    ),
    Panel(
        "Evaluation and promotion",
        "Gate margins of the last decision",
        "Signed improvement of the challenger over the champion per gate (positive = better); a failed "
        "out-of-domain regression gate is G2RPOChallengerOutOfDomainRegression.",
        ((f"g2rpo_promotion_gate_delta{{{PIPE}}}", "{{model}} {{metric}} ({{kind}})"),),
    ),
    Panel(
        "Evaluation and promotion",
        "Champion version",
        "The version the champion alias points at after the last decision.",
        ((f"g2rpo_promotion_champion_info{{{PIPE}}}", "{{pipeline}} {{model}} v{{version}}"),),
        kind="state",
    ),
    Panel(
        "Evaluation and promotion",
        "Time since the last promotion",
        "Seconds since the champion last moved.",
        ((f"time() - g2rpo_promotion_last_promotion_timestamp_seconds{{{PIPE}}}", "{{pipeline}} {{model}}"),),
        kind="stat",
        unit="s",
    ),
    Panel(
        "Pipeline",
        "Time since the last successful retraining",
        "Seconds since a pipeline run last succeeded (G2RPONoSuccessfulRetraining past 26 h).",
        ((f"time() - g2rpo_pipeline_last_success_timestamp_seconds{{{PIPE}}}", "{{pipeline}}"),),
        kind="stat",
        unit="s",
    ),
    Panel(
        "Pipeline",
        "Last run outcome",
        "1 = the pipeline's last run succeeded, 0 = it did not (G2RPOPipelineRunFailed).",
        ((f"g2rpo_pipeline_last_run_success{{{PIPE}}}", "{{pipeline}}"),),
        kind="state",
    ),
)

VARIABLES = (
    ("pipeline", 'label_values({__name__=~"g2rpo_.+"}, pipeline)'),
    ("run", 'label_values(g2rpo_training_run_info{pipeline=~"$pipeline"}, run_id)'),
)


def _panel(spec: Panel, panel_id: int) -> object:
    builder = {
        "timeseries": timeseries.Panel,
        "stacked": timeseries.Panel,
        "stat": stat.Panel,
        "state": statetimeline.Panel,
    }[spec.kind]()
    builder.id(panel_id).title(spec.title).description(spec.description).datasource(DATASOURCE).unit(spec.unit)
    builder.height(8).span(8 if spec.kind in ("stat", "state") else 12)
    if spec.kind == "stacked":
        builder.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(30)
    for n, (expr, legend) in enumerate(spec.queries):
        builder.with_target(
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n)).datasource(DATASOURCE)
        )
    return builder


def build_dashboard() -> object:
    """The dashboard model (grafana-foundation-sdk's)."""
    board = (
        gd.Dashboard("g2rpo: training, evaluation, promotion")
        .uid(UID)
        .description(
            "G²RPO retraining: training progress, evaluations, promotions, pipeline runs (docs/observability.md)"
        )
        .tags(["g2rpo"])
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .readonly()
    )
    board.with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    for name, query in VARIABLES:
        board.with_variable(
            gd.QueryVariable(name)
            .label(name)
            .datasource(DATASOURCE)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    row, panel_id = None, 0
    for spec in PANELS:
        if spec.row != row:
            row, panel_id = spec.row, panel_id + 1
            board.with_row(gd.Row(row).id(panel_id))
        panel_id += 1
        board.with_panel(_panel(spec, panel_id))
    return board.build()


def dashboard_json() -> str:
    """The dashboard as the JSON file the chart ships (stable: sorted keys, 2-space indent, newline)."""
    return json.dumps(json.loads(json.dumps(build_dashboard(), cls=JSONEncoder)), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dashboard_json(), encoding="utf-8")
    print(f"wrote {path} ({len(PANELS)} panels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
