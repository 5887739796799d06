"""Steps **decide** and **promote**, as the pipeline runs them (promote only when decide says it passes).

:func:`decide_challenger` checks the gates file against the evaluated metrics (before anything is
written), registers the trained export with its evaluation as the model's challenger, and applies the
gates against the champion's fresh evaluation on the same items (or the floors, for a first version)
without moving any alias. A refusal is recorded with the version there and then; a pass is left for
:func:`promote_challenger`, which decides again against the registry as it is now and moves the champion
alias by one conditional write (:func:`g2rpo.steps.promote.decide_and_promote`).

With a Pushgateway URL each pushes its decision there under the pipeline's name (job ``g2rpo-promote``):
decide a pass as ``dry_run`` (promote's push then replaces it) and a refusal as ``rejected``, since it is
final; promote ``promoted``; either ``error`` when the step raises. A gateway that is down is a warning.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from g2rpo.artifacts.promotion import Gates, format_decision, load_gates
from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings, locate
from g2rpo.errors import G2RPOError, problem
from g2rpo.observability.push import PushTarget
from g2rpo.steps.decision_report import write_decision_report
from g2rpo.steps.promote import PromoteResult, decide_and_promote, push_decision
from g2rpo.steps.records import CandidatesRecord, DecisionRecord, TrainRecord, read_record, write_record
from g2rpo.steps.register import EVAL_SCORES_FILE, read_scores, register

__all__ = ["decide_challenger", "gates_from", "promote_challenger"]


def gates_from(gates_uri: str, settings: S3Settings | None = None) -> tuple[Gates, str]:
    """``(gates, sha256 of the file)`` from a path, ``file://`` or ``s3://`` URI; ``""`` is the packaged default."""
    if not gates_uri:
        return load_gates(None)
    if gates_uri.startswith("s3://"):
        store, key = locate(gates_uri, settings)
        with tempfile.TemporaryDirectory(prefix="g2rpo-gates-") as tmp:
            local = Path(tmp) / "gates.yaml"
            store.get_file(key, local)
            return load_gates(local)
    return load_gates(gates_uri.removeprefix("file://"))


def _target(pushgateway_url: str, pipeline: str) -> PushTarget | None:
    return PushTarget(pushgateway_url, pipeline=pipeline) if pushgateway_url else None


def _fresh_champion(candidates: CandidatesRecord, settings: S3Settings | None) -> tuple[int, EvalScores] | None:
    if candidates.champion_version is None or candidates.champion_eval_uri is None:
        return None
    uri = f"{candidates.champion_eval_uri.rstrip('/')}/{EVAL_SCORES_FILE}"
    return candidates.champion_version, read_scores(uri, settings, field="champion_eval_uri")


def decide_challenger(
    train_dir: str | Path,
    candidates_dir: str | Path,
    *,
    registry_uri: str,
    model: str,
    gates_uri: str,
    source_run: str,
    output_dir: str | Path,
    report_path: str | Path | None = None,
    settings: S3Settings | None = None,
    pushgateway_url: str = "",
    pipeline: str = "g2rpo-alignment",
) -> DecisionRecord:
    """Register the challenger and decide whether it passes the gates; write the decision record
    and, at ``report_path``, the decision report (:mod:`g2rpo.steps.decision_report`); push the
    decision to ``pushgateway_url`` when one is given (see the module docstring)."""
    target = _target(pushgateway_url, pipeline)
    trained = read_record(TrainRecord, train_dir, field="train")
    candidates = read_record(CandidatesRecord, candidates_dir, field="evaluation")
    gates, gates_sha = gates_from(gates_uri, settings)
    unknown = sorted(set(gates.metrics) - set(candidates.challenger_means))
    if unknown:
        raise G2RPOError(
            problem(
                "gates",
                gates_uri or "the packaged default",
                f"gates metrics {unknown} were not evaluated (evaluated: {sorted(candidates.challenger_means)}); "
                "gate only the run's rewards",
            )
        )
    registered = register(
        registry_uri,
        model,
        export_uri=trained.export_uri,
        eval_uri=candidates.challenger_eval_uri,
        source_run=source_run,
        config_hash=trained.config_hash,
        base_model=trained.base_model_name,
        licence=trained.licence,
        challenger=True,
        settings=settings,
    )
    result = decide_and_promote(
        registry_uri,
        model,
        registered.version,
        gates,
        gates_sha256=gates_sha,
        dry_run=True,
        champion_scores=_fresh_champion(candidates, settings),
        settings=settings,
        pushgateway=target,
    )
    if not result.passed:  # a refusal is final: record it now (a pass is recorded when promote applies it)
        Registry(registry_uri, settings).record_decision(
            model, registered.version, result.decision.model_dump(mode="json")
        )
        if target is not None:
            push_decision(target, result.decision, result.champion)
    # Floors have no champion to pair with: the table shows the baseline the challenger was evaluated against.
    print(
        format_decision(result.decision, candidates.baseline_label, candidates.baseline_means, candidates.paired),
        flush=True,
    )
    record = DecisionRecord(
        model=model,
        version=registered.version,
        passed=result.passed,
        champion=result.decision.champion,
        gates_sha256=gates_sha,
        reasons=[f"{r.metric}: {'pass' if r.passed else 'FAIL'}: {r.reason}" for r in result.decision.results],
    )
    write_record(record, output_dir)
    if report_path is not None:
        write_decision_report(report_path, result.decision, candidates, settings, train_dir=train_dir)
    return record


def promote_challenger(
    decision_dir: str | Path,
    candidates_dir: str | Path,
    *,
    registry_uri: str,
    gates_uri: str,
    reason: str,
    settings: S3Settings | None = None,
    pushgateway_url: str = "",
    pipeline: str = "g2rpo-alignment",
) -> PromoteResult:
    """Make the decided challenger champion: the gates again, against the registry as it is now, then the
    alias move. Raises when the decision no longer passes (the champion changed since it was made).
    With ``pushgateway_url`` the decision is pushed there (see the module docstring)."""
    decided = read_record(DecisionRecord, decision_dir, field="decision")
    candidates = read_record(CandidatesRecord, candidates_dir, field="evaluation")
    gates, gates_sha = gates_from(gates_uri, settings)
    if gates_sha != decided.gates_sha256:
        raise G2RPOError(problem("gates_uri", gates_uri, "changed since the decision was made; rerun the pipeline"))
    result = decide_and_promote(
        registry_uri,
        decided.model,
        decided.version,
        gates,
        gates_sha256=gates_sha,
        reason=reason,
        champion_scores=_fresh_champion(candidates, settings),
        settings=settings,
        pushgateway=_target(pushgateway_url, pipeline),
    )
    if result.passed:  # decide printed the gates' table: one line here, so no reason is said twice
        print(f"{decided.model} v{decided.version}: the gates still hold; champion → v{decided.version}", flush=True)
    else:
        print(format_decision(result.decision), flush=True)
    if not result.passed:
        raise G2RPOError(
            f"{decided.model} v{decided.version} no longer passes the gates (recorded); see the reasons above"
        )
    return result
