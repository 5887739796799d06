"""Promotion gates (YAML data), paired comparison, decision records, atomic alias moves.

Gates, per metric ``m`` with direction sign ``s = +1`` (higher is better) or ``-1``:

- challenger vs champion, on the *same* prompt set and seeds, paired by ``(prompt_id, seed)``:

      d_i   = s · (score_i(challenger) − score_i(champion))        # [N]
      Δ     = mean_i d_i                                            # signed improvement

  * in-domain metric (trained on):   pass iff ``Δ ≥ min_improvement``, and, when
    ``require_ci_excludes_zero``, the paired bootstrap CI of ``Δ`` lies above 0;
  * out-of-domain metric:            pass iff ``Δ ≥ −max_regression`` (the reward-hacking guard:
    G²RPO's paper reports HPS-only training lowering CLIP/UnifiedReward).

- first version (no champion): pass iff ``s · mean ≥ s · floor`` for every metric with a floor.

The paired bootstrap draws ``B`` resamples of the N indices with a seeded ``numpy`` generator and
takes the ``(1 ± confidence)/2`` percentiles of the resampled means of ``d`` (percentile method).

The decision (every gate's numbers, pass/fail and reason) is stored with the version and printed.
A passing promotion moves ``champion`` with one conditional write of the registry state, based on
the state the decision was computed against: if another promotion got there first the write is
refused (:class:`~g2rpo.artifacts.registry.AliasConflict`) and the command must be rerun, because the
decision compared against a champion that is no longer the champion.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from g2rpo.artifacts.registry import (
    AliasConflict,
    EvalRecord,
    EvalScores,
    HistoryEvent,
    Registry,
    RegistryState,
)
from g2rpo.artifacts.scores import bootstrap_mean_ci, paired_differences, summarize
from g2rpo.artifacts.storage import sha256_file
from g2rpo.config import SEED_MAX, Section, load_config
from g2rpo.errors import G2RPOError, problem

__all__ = [
    "MetricGate",
    "Gates",
    "GateResult",
    "Decision",
    "load_gates",
    "default_gates_path",
    "bootstrap_mean_ci",
    "paired_differences",
    "summarize",
    "eval_record_from_scores",
    "decide",
    "format_decision",
    "promote",
    "rollback",
]


# --------------------------------------------------------------------------- gates as data


class MetricGate(Section):
    """The gate for one metric."""

    direction: Literal["higher", "lower"] = Field(description="which way is better")
    domain: Literal["in", "out"] = Field(
        description="'in': trained on (must improve); 'out': held out (may not regress)"
    )
    min_improvement: float | None = Field(
        None, ge=0, description="in-domain: least signed improvement over the champion (score units)"
    )
    max_regression: float | None = Field(
        None, ge=0, description="out-of-domain: largest signed regression allowed vs the champion (score units)"
    )
    require_ci_excludes_zero: bool = Field(
        False, description="in-domain: the paired bootstrap CI of the improvement must lie above 0"
    )
    floor: float | None = Field(None, description="absolute bound for a first version (no champion), in score units")

    @model_validator(mode="after")
    def _consistent(self):
        if self.domain == "in":
            if self.min_improvement is None:
                raise ValueError(problem("min_improvement", None, "in-domain gates need min_improvement (0 allowed)"))
            if self.max_regression is not None:
                raise ValueError(problem("max_regression", self.max_regression, "only out-of-domain gates use it"))
        else:
            if self.max_regression is None:
                raise ValueError(problem("max_regression", None, "out-of-domain gates need max_regression (0 allowed)"))
            if self.min_improvement is not None:
                raise ValueError(problem("min_improvement", self.min_improvement, "only in-domain gates use it"))
            if self.require_ci_excludes_zero:
                raise ValueError(
                    problem("require_ci_excludes_zero", True, "only in-domain gates use it; remove it here")
                )
        return self


class Gates(Section):
    """A gates file: bootstrap settings and one gate per metric."""

    bootstrap_resamples: int = Field(2000, ge=100, le=100_000, description="paired bootstrap resamples")
    bootstrap_seed: int = Field(
        0, ge=0, le=SEED_MAX, description="seed of the bootstrap generator (decisions are reproducible)"
    )
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="two-sided CI level")
    metrics: dict[str, MetricGate] = Field(description="metric name -> gate; every metric here is checked")

    @model_validator(mode="after")
    def _some_metric(self):
        if not self.metrics:
            raise ValueError(problem("metrics", {}, "list at least one metric gate"))
        if not any(g.domain == "in" for g in self.metrics.values()):
            raise ValueError(problem("metrics", sorted(self.metrics), "add at least one in-domain gate"))
        return self


def default_gates_path() -> Path:
    """The packaged example gates file (``g2rpo/gates/default.yaml``)."""
    return Path(str(resources.files("g2rpo") / "gates" / "default.yaml"))


def load_gates(path: str | Path | None = None, overrides=()) -> tuple[Gates, str]:
    """``(gates, sha256 of the file)``; the packaged default when ``path`` is None."""
    path = Path(path) if path is not None else default_gates_path()
    if not path.is_file():
        raise G2RPOError(problem("gates", str(path), "no such file; pass a gates YAML (see g2rpo/gates/default.yaml)"))
    gates = load_config(Gates, path, overrides)
    return gates, sha256_file(path)[1]


def eval_record_from_scores(scores: EvalScores, scores_uri: str, scores_sha256: str) -> EvalRecord:
    summary = summarize(scores)
    return EvalRecord(
        prompt_set=scores.prompt_set,
        prompt_set_sha256=scores.prompt_set_sha256,
        seeds=list(scores.seeds),
        n=len(scores.items),
        metrics=summary,
        definitions=dict(scores.definitions),
        scores_uri=scores_uri,
        scores_sha256=scores_sha256,
    )


# --------------------------------------------------------------------------- decisions


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    kind: Literal["improvement", "regression", "floor"]
    passed: bool
    challenger_mean: float | None
    champion_mean: float | None = None
    delta: float | None = Field(None, description="signed improvement Δ (positive = better)")
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None
    reason: str


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    challenger: int
    champion: int | None
    passed: bool
    gates_sha256: str
    results: list[GateResult]


def decide(
    challenger: EvalScores,
    champion: EvalScores | None,
    gates: Gates,
    *,
    model: str = "",
    challenger_version: int = 0,
    champion_version: int | None = None,
    gates_sha256: str = "",
) -> Decision:
    """Apply every gate; pure (no I/O). ``champion=None`` means a first version (floors).

    A gate on a metric the challenger's eval does not have is a configuration error, raised before
    any gate is applied (so :func:`promote` stores nothing), not a failed gate.
    """
    ungated = [metric for metric in gates.metrics if not challenger.keyed(metric)]
    if ungated:
        raise G2RPOError(
            problem(
                "gates.metrics",
                ungated,
                f"the challenger's eval{f' (v{challenger_version})' if challenger_version else ''} has no scores "
                f"for {'this metric' if len(ungated) == 1 else 'these metrics'}; it has "
                f"{', '.join(challenger.metric_names()) or 'none'}: gate only metrics the eval has, or evaluate "
                "the version with the missing ones (nothing was decided or recorded)",
            )
        )
    results = []
    for metric, gate in gates.metrics.items():
        sign = 1.0 if gate.direction == "higher" else -1.0
        chal_values = challenger.keyed(metric)
        chal_mean = float(np.mean(list(chal_values.values())))
        if champion is None:
            if gate.floor is None:
                results.append(
                    GateResult(
                        metric=metric,
                        kind="floor",
                        passed=True,
                        challenger_mean=chal_mean,
                        reason="no champion and no floor set: not gated",
                    )
                )
                continue
            ok = sign * chal_mean >= sign * gate.floor
            cmp = "≥" if sign > 0 else "≤"
            results.append(
                GateResult(
                    metric=metric,
                    kind="floor",
                    passed=ok,
                    challenger_mean=chal_mean,
                    threshold=gate.floor,
                    reason=f"mean {chal_mean:.4f} {'meets' if ok else 'misses'} the floor ({cmp} {gate.floor:g})",
                )
            )
            continue
        diff = sign * paired_differences(challenger, champion, metric)  # [N] signed
        delta = float(diff.mean())
        champ_mean = float(np.mean(list(champion.keyed(metric).values())))
        low, high = bootstrap_mean_ci(diff, gates.bootstrap_resamples, gates.bootstrap_seed, gates.confidence)
        if gate.domain == "in":
            ok = delta >= gate.min_improvement
            reason = f"improvement {delta:+.4f} {'≥' if ok else '<'} required {gate.min_improvement:g}"
            if gate.require_ci_excludes_zero:
                ci_ok = low > 0
                reason += (
                    f"; {gates.confidence:.0%} CI [{low:+.4f}, {high:+.4f}] {'excludes' if ci_ok else 'includes'} 0"
                )
                ok = ok and ci_ok
            results.append(
                GateResult(
                    metric=metric,
                    kind="improvement",
                    passed=ok,
                    challenger_mean=chal_mean,
                    champion_mean=champ_mean,
                    delta=delta,
                    ci_low=low,
                    ci_high=high,
                    threshold=gate.min_improvement,
                    reason=reason,
                )
            )
        else:
            ok = delta >= -gate.max_regression
            reason = (
                f"change {delta:+.4f} {'within' if ok else 'beyond'} the allowed regression {-gate.max_regression:+g}"
            )
            results.append(
                GateResult(
                    metric=metric,
                    kind="regression",
                    passed=ok,
                    challenger_mean=chal_mean,
                    champion_mean=champ_mean,
                    delta=delta,
                    ci_low=low,
                    ci_high=high,
                    threshold=-gate.max_regression,
                    reason=reason,
                )
            )
    return Decision(
        model=model,
        challenger=challenger_version,
        champion=champion_version,
        passed=all(r.passed for r in results),
        gates_sha256=gates_sha256,
        results=results,
    )


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def format_decision(
    decision: Decision,
    baseline_label: str = "",
    baseline_means: Mapping[str, float] | None = None,
    paired: Mapping[str, Mapping[str, float]] | None = None,
) -> str:
    """A plain-text table of the decision (what the CLI prints): one row per gate with its numbers,
    pass or FAIL, and the reason, so that each reason is said once.

    A first version's floors compare with no champion; given the baseline it was evaluated against
    (``baseline_label``, e.g. ``base model``, its means, and the challenger's ``paired`` differences to
    it: metric -> delta, ci_low, ci_high), those rows show that baseline's mean and the paired Δ with
    its interval instead of dashes.

    The head says whether the gates are *met*: "passed" and "failed" are left to the tasks and the
    run, so that a run that succeeded and a model that was refused are never worded alike.
    """
    versus = decision.champion is None and bool(baseline_label) and bool(paired)
    baseline_means, paired = baseline_means or {}, paired or {}
    against = f"champion v{decision.champion}" if decision.champion is not None else "absolute floors (no champion)"
    failed = sum(not r.passed for r in decision.results)
    met = (
        f"all {len(decision.results)} gate(s) met"
        if not failed
        else f"{failed} of {len(decision.results)} gate(s) not met"
    )
    head = f"{decision.model} v{decision.challenger} vs {against}: {met}"
    rows = [
        ("gate", "metric", "challenger", baseline_label if versus else "champion", "Δ", "95% CI", "result", "reason")
    ]
    for r in decision.results:
        delta, low, high, other = r.delta, r.ci_low, r.ci_high, r.champion_mean
        if versus and delta is None and r.metric in paired:
            pair = paired[r.metric]
            delta, low, high = pair["delta"], pair["ci_low"], pair["ci_high"]
            other = baseline_means.get(r.metric)
        ci = "—" if low is None else f"[{low:+.4f}, {high:+.4f}]"
        rows.append(
            (
                r.kind,
                r.metric,
                _fmt(r.challenger_mean),
                _fmt(other),
                "—" if delta is None else f"{delta:+.4f}",
                ci,
                "pass" if r.passed else "FAIL",
                r.reason,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head] + ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- registry actions


def promote(
    registry: Registry,
    model: str,
    version: int,
    gates: Gates,
    *,
    gates_sha256: str = "",
    dry_run: bool = False,
    reason: str = "",
    champion_scores: tuple[int, EvalScores] | None = None,
) -> Decision:
    """Decide whether ``version`` beats the champion; if so make it champion (one conditional write).

    ``champion_scores`` is ``(champion version, its scores)`` from a fresh evaluation on the challenger's
    prompts and seeds (the pipeline evaluates both in one task); by default the champion's registered scores
    are used. Fresh scores of a version that is no longer the champion are refused.

    The decision is stored with the version (unless ``dry_run``) whatever the outcome; a gates file
    that does not fit the evals (a metric they lack) raises before anything is stored. Raises
    :class:`~g2rpo.artifacts.registry.AliasConflict` when another writer moved the aliases after the state
    this decision was computed against was read.
    """
    expected = registry.read_state(model)
    state, _ = expected
    champion_version = state.aliases.get("champion")
    if champion_version == version:
        raise G2RPOError(problem("version", version, f"is already the champion of {model!r}"))
    record = registry.get_version(model, version)
    challenger_scores = registry.load_scores(record)
    if champion_scores is not None and champion_scores[0] != champion_version:
        raise G2RPOError(
            problem(
                "champion_scores",
                f"v{champion_scores[0]}",
                f"the champion of {model!r} is now "
                f"{'none' if champion_version is None else f'v{champion_version}'}: evaluate it and decide again",
            )
        )
    champion = None if champion_scores is None else champion_scores[1]
    if champion is None and champion_version is not None:
        champion = registry.load_scores(registry.get_version(model, champion_version))
    decision = decide(
        challenger_scores,
        champion,
        gates,
        model=model,
        challenger_version=version,
        champion_version=champion_version,
        gates_sha256=gates_sha256,
    )
    if dry_run:
        return decision
    if decision.passed:
        # At the moment of promotion: the export must be there and be the registered one (a champion
        # that points at nothing is refused before the decision is stored or the alias moves).
        registry.verify_export(record)
    key = registry.record_decision(model, version, decision.model_dump(mode="json"))
    if not decision.passed:
        return decision

    def change(current: RegistryState) -> list[HistoryEvent]:
        events = [
            HistoryEvent(
                revision=0,
                at="",
                actor="",
                action="promote",
                alias="champion",
                version=version,
                previous=champion_version,
                reason=reason,
                decision=key,
            )
        ]
        if current.aliases.get("challenger") == version:
            events.append(
                HistoryEvent(
                    revision=0,
                    at="",
                    actor="",
                    action="clear-alias",
                    alias="challenger",
                    version=None,
                    previous=version,
                    reason="promoted to champion",
                )
            )
        return events

    try:
        registry.update_state(model, change, expected=expected)
    except AliasConflict as exc:
        raise AliasConflict(
            f"{exc}\n(the decision that v{version} passed against champion "
            f"{'none' if champion_version is None else f'v{champion_version}'} stays stored as {key}, "
            "but was not applied; the history shows what happened)"
        ) from None
    return decision


def rollback(registry: Registry, model: str, to: int | None = None, reason: str = "") -> HistoryEvent:
    """Point ``champion`` back at the version it had before (or at ``to``), without gates."""
    expected = registry.read_state(model)
    state, _ = expected
    current = state.aliases.get("champion")
    if current is None:
        raise G2RPOError(problem("model", model, "has no champion to roll back"))
    if to is None:
        # The champion that the current one replaced when it was promoted (so repeated rollbacks
        # walk back through promotions rather than toggling between two versions).
        previous = None
        for event in reversed(state.history):
            if event.action == "promote" and event.version == current:
                previous = event.previous
                break
        if previous is None:
            raise G2RPOError(problem("model", model, f"champion v{current} has no predecessor; pass --to VERSION"))
        to = previous
    if to == current:
        raise G2RPOError(problem("to", to, "is already the champion"))
    registry.verify_export(registry.get_version(model, to))  # must exist, and its export too

    def change(_: RegistryState) -> list[HistoryEvent]:
        return [
            HistoryEvent(
                revision=0,
                at="",
                actor="",
                action="rollback",
                alias="champion",
                version=to,
                previous=current,
                reason=reason,
            )
        ]

    new = registry.update_state(model, change, expected=expected)
    return new.history[-1]
