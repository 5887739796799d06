"""Step **decide + promote**: a registered version and the promotion gates in, a recorded decision out.

:func:`decide_and_promote` applies the gates to the version against the current champion
(:func:`g2rpo.artifacts.promotion.promote`: the decision is stored with the version, and the
champion alias moves by one conditional write iff every gate passed).

:func:`base_model_floors` is the policy for a first version (no champion to compare with): each
gate gets a floor from the untrained base model's mean on the same evaluation items, so the version
is promoted iff training raised what it trained on by the gate's margin and lowered no held-out
metric beyond its tolerance; :func:`floor_gates_file` writes a gates file with those floors (what
``g2rpo demo`` gates its first version with). :func:`write_gates` stores gates as YAML.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from g2rpo.artifacts.promotion import Decision, Gates, load_gates, promote
from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings
from g2rpo.observability.push import PushTarget, push_promotion

__all__ = [
    "PromoteResult",
    "base_model_floors",
    "decide_and_promote",
    "floor_gates_file",
    "push_decision",
    "write_gates",
]


@dataclass(frozen=True)
class PromoteResult:
    """What :func:`decide_and_promote` decided and did."""

    registry_uri: str
    model: str
    version: int
    decision: Decision
    dry_run: bool  # nothing was recorded
    champion: int | None  # the champion after the step

    @property
    def passed(self) -> bool:
        return self.decision.passed


def decide_and_promote(
    registry_uri: str,
    model: str,
    version: int | str,
    gates: Gates,
    *,
    gates_sha256: str = "",
    dry_run: bool = False,
    reason: str = "",
    champion_scores: tuple[int, EvalScores] | None = None,
    settings: S3Settings | None = None,
    pushgateway: PushTarget | None = None,
) -> PromoteResult:
    """Apply ``gates`` to ``version`` (a number, ``v3``, or an alias such as ``challenger``) of ``model``;
    make it champion if it passes, unless ``dry_run``. ``gates_sha256`` (of the gates file) is recorded.
    ``champion_scores``: ``(champion version, scores)`` of a fresh evaluation on the same items
    (:func:`g2rpo.artifacts.promotion.promote`); default the champion's registered scores.
    With ``pushgateway`` the decision (or the error that stopped it) is pushed there."""
    registry = Registry(registry_uri, settings)
    try:
        number = registry.resolve(model, version)
        decision = promote(
            registry,
            model,
            number,
            gates,
            gates_sha256=gates_sha256,
            dry_run=dry_run,
            reason=reason,
            champion_scores=champion_scores,
        )
        state, _ = registry.read_state(model)
    except Exception as exc:
        if pushgateway is not None:
            push_promotion(pushgateway, model=model, outcome="error", reason=type(exc).__name__, champion=None)
        raise
    if pushgateway is not None:
        push_decision(pushgateway, decision, state.aliases.get("champion"), dry_run=dry_run)
    return PromoteResult(
        registry_uri=registry.store.uri,
        model=model,
        version=number,
        decision=decision,
        dry_run=dry_run,
        champion=state.aliases.get("champion"),
    )


def push_decision(target: PushTarget, decision: Decision, champion: int | None, *, dry_run: bool = False) -> bool:
    """Push ``decision``: outcome promoted/rejected/dry_run, reason ``passed`` or the first failed gate."""
    failed = [r for r in decision.results if not r.passed]
    outcome = "dry_run" if dry_run else ("promoted" if decision.passed else "rejected")
    return push_promotion(
        target,
        model=decision.model,
        outcome=outcome,
        reason="passed" if not failed else f"gate:{failed[0].metric}",
        champion=champion,
        gates=[r.model_dump() for r in decision.results],
    )


def base_model_floors(gates: Gates, base: Mapping[str, float]) -> Gates:
    """``gates`` with floors for a first version (no champion to compare with) from ``base``, the base
    model's means on the same items: a trained (in-domain) metric must beat its base mean by its
    ``min_improvement`` (what a champion would be held to), a held-out (out-of-domain) one may fall at
    most its ``max_regression`` below it; a metric the base model was not scored on gets no floor."""
    metrics = {}
    for name, gate in gates.metrics.items():
        sign = 1 if gate.direction == "higher" else -1
        margin = (gate.min_improvement or 0.0) if gate.domain == "in" else -(gate.max_regression or 0.0)
        floor = None if name not in base else float(base[name]) + sign * margin
        metrics[name] = gate.model_copy(update={"floor": floor})
    return gates.model_copy(update={"metrics": metrics})


def floor_gates_file(gates_uri: str, base: Mapping[str, float], path: str | Path) -> Path:
    """``gates_uri``'s gates (empty: the packaged default) with the base model's floors
    (:func:`base_model_floors`), written to ``path`` with a comment that says where they came from."""
    gates, _ = load_gates(gates_uri or None)
    comment = (
        f"{gates_uri or 'the packaged gates'} with floors for a first version (no champion): the base model's means\n"
        "on the same held-out prompts and seeds plus the required improvement (in-domain), less the allowed\n"
        "regression (out-of-domain)."
    )
    return write_gates(base_model_floors(gates, base), path, comment=comment)[0]


def write_gates(gates: Gates, path: str | Path, comment: str = "") -> tuple[Path, str]:
    """Write ``gates`` as a gates YAML (``comment`` lines first); return the path and the file's sha256
    (what :func:`decide_and_promote` records as ``gates_sha256``)."""
    path = Path(path)
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    body = yaml.safe_dump(gates.model_dump(mode="json", exclude_none=True), sort_keys=False)
    path.write_text(header + body, encoding="utf-8")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()
