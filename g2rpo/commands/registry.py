"""``g2rpo registry list|show|register|promote|rollback|history``: versions, aliases, gated promotion."""

from __future__ import annotations

import argparse
import os

from g2rpo.commands.storage import _add_s3_options, settings_from_args
from g2rpo.errors import G2RPOError


def _registry_uri(args) -> str:
    uri = args.registry or os.environ.get("G2RPO_REGISTRY_URI")
    if not uri:
        raise G2RPOError(
            "--registry=None: pass --registry URI (a folder or s3://bucket/prefix) or set G2RPO_REGISTRY_URI"
        )
    return uri


def _registry(args):
    from g2rpo.artifacts.registry import Registry

    return Registry(_registry_uri(args), settings_from_args(args))


def _last_decision(reg, model: str, version: int, champion: int | None) -> str:
    """A version's last decision in a word or two (``promoted``, ``refused vs v1``, ``undecided``)."""
    decisions = reg.decisions(model, version)  # in the order they were recorded
    if not decisions:
        return "champion (registered so)" if version == champion else "undecided"
    last = decisions[-1]
    against = "floors" if last["champion"] is None else f"v{last['champion']}"
    if not last["passed"]:
        failed = sum(not r["passed"] for r in last["results"])
        return f"REFUSED vs {against} ({failed} of {len(last['results'])} gate(s) not met)"
    return f"promoted over {against}" if version == champion else f"gates met vs {against}, not champion now"


def _list(args) -> int:
    reg = _registry(args)
    if args.model is None:
        for model in reg.require_models():
            state, _ = reg.read_state(model)
            champion = state.aliases.get("champion")
            aliases = (
                ", ".join(
                    f"{a}=v{v}" + (f" ({_last_decision(reg, model, v, champion)})" if a != "champion" else "")
                    for a, v in sorted(state.aliases.items())
                )
                or "no aliases"
            )
            print(f"{model}  {len(reg.version_numbers(model))} version(s)  {aliases}")
        return 0
    reg.require_model(args.model)
    state, _ = reg.read_state(args.model)
    champion = state.aliases.get("champion")
    by_version: dict[int, list[str]] = {}
    for alias, version in state.aliases.items():
        by_version.setdefault(version, []).append(alias)
    for number in reg.version_numbers(args.model):
        record = reg.get_version(args.model, number)
        metrics = "  ".join(f"{m}={s.mean:.4f}" for m, s in sorted(record.eval.metrics.items()))
        tags = ",".join(sorted(by_version.get(number, [])))
        decision = _last_decision(reg, args.model, number, champion)
        print(f"v{number:<4} {tags:<20} {decision:<44} {record.created_at}  run={record.source_run}  {metrics}")
    return 0


def _show(args) -> int:
    from g2rpo.artifacts.promotion import Decision, format_decision

    reg = _registry(args)
    reg.require_model(args.model)
    number = reg.resolve(args.model, args.version)
    record = reg.get_version(args.model, number)
    state, _ = reg.read_state(args.model)
    # The decision first (what a reader came for), the full record after it.
    print(f"{args.model} v{number}: {_last_decision(reg, args.model, number, state.aliases.get('champion'))}")
    for decision in reg.decisions(args.model, number):
        print(format_decision(Decision.model_validate(decision)))
    print()
    print(record.model_dump_json(indent=2))
    return 0


def _register(args) -> int:
    from g2rpo.steps.register import read_scores, register

    settings = settings_from_args(args)
    result = register(
        _registry_uri(args),
        args.model,
        export_uri=args.export,
        scores=read_scores(args.scores, settings, field="--scores"),
        source_run=args.source_run,
        config_hash=args.config_hash,
        base_model=args.base_model,
        licence=args.licence,
        challenger=args.challenger,
        settings=settings,
    )
    print(f"registered {args.model} v{result.version}")
    if result.challenger:
        print(f"challenger → v{result.version}")
    return 0


def _promote(args) -> int:
    from g2rpo.artifacts.promotion import format_decision, load_gates
    from g2rpo.observability.push import PushTarget
    from g2rpo.steps.promote import decide_and_promote

    gates, gates_sha = load_gates(args.gates)
    result = decide_and_promote(
        _registry_uri(args),
        args.model,
        args.version,
        gates,
        gates_sha256=gates_sha,
        dry_run=args.dry_run,
        reason=args.reason or "",
        settings=settings_from_args(args),
        pushgateway=PushTarget(args.pushgateway, pipeline=args.pipeline) if args.pushgateway else None,
    )
    print(format_decision(result.decision))
    if result.dry_run:
        print("dry run: nothing recorded")
    elif result.passed:
        print(f"champion → v{result.version}")
    else:
        print(f"champion unchanged (v{result.decision.champion})" if result.decision.champion else "no champion set")
    return 0 if result.passed else 1


def _rollback(args) -> int:
    from g2rpo.artifacts.promotion import rollback

    reg = _registry(args)
    reg.require_model(args.model)
    to = reg.resolve(args.model, args.to) if args.to is not None else None
    event = rollback(reg, args.model, to=to, reason=args.reason)
    print(f"champion v{event.previous} → v{event.version} (rollback, revision {event.revision})")
    return 0


def _history(args) -> int:
    reg = _registry(args)
    reg.require_model(args.model)
    state, _ = reg.read_state(args.model)
    if not state.history:
        print(f"{args.model}: no alias changes yet")
    for e in state.history:
        before = "—" if e.previous is None else f"v{e.previous}"
        after = "—" if e.version is None else f"v{e.version}"
        why = f"  ({e.reason})" if e.reason else ""
        print(f"r{e.revision:<3} {e.at}  {e.action:<11} {e.alias:<10} {before} → {after}  by {e.actor}{why}")
    return 0


def add_commands(sub) -> None:
    registry = sub.add_parser(
        "registry",
        help="model versions, champion/challenger aliases, gated promotion",
        description="A model registry on a local folder or S3. Versions are immutable records; aliases "
        "(champion, challenger) move by conditional writes, so two racing promotions cannot both win.",
    )
    verbs = registry.add_subparsers(dest="registry_command", metavar="VERB", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--registry", help="registry root (folder or s3://bucket/prefix); default: $G2RPO_REGISTRY_URI")
        _add_s3_options(p)

    p = verbs.add_parser("list", help="models, or the versions of one model with their aliases")
    p.add_argument("model", nargs="?", help="model name; omit to list models")
    common(p)
    p.set_defaults(handler=_list)

    p = verbs.add_parser("show", help="a version's record and its promotion decisions")
    p.add_argument("model", help="model name, e.g. flux-g2rpo")
    p.add_argument("version", help="number (3 or v3), champion or challenger")
    common(p)
    p.set_defaults(handler=_show)

    p = verbs.add_parser("register", help="record a new version from a published export and its eval scores")
    p.add_argument("model", help="model name, e.g. flux-g2rpo")
    p.add_argument("--export", required=True, help="URI of the exported model (a published artifact)")
    p.add_argument(
        "--scores", required=True, help="per-prompt eval scores JSON, local or s3:// (format: docs/registry.md)"
    )
    p.add_argument("--source-run", required=True, help="pipeline run that produced the model")
    p.add_argument("--config-hash", required=True, help="hash of the training config")
    p.add_argument("--base-model", required=True, help="base model id, e.g. black-forest-labs/FLUX.1-dev")
    p.add_argument("--licence", required=True, help="the base model's licence")
    p.add_argument("--challenger", action="store_true", help="also point the challenger alias at it")
    common(p)
    p.set_defaults(handler=_register)

    p = verbs.add_parser(
        "promote",
        help="apply the gates; make the version champion if it passes (exit 1 if it fails)",
    )
    p.add_argument("model", help="model name, e.g. flux-g2rpo")
    p.add_argument("version", help="number (3 or v3) or challenger")
    p.add_argument("--gates", default=None, help="gates YAML (default: the packaged g2rpo/gates/default.yaml)")
    p.add_argument("--dry-run", action="store_true", help="print the decision, record nothing")
    p.add_argument("--reason", default="", help="note recorded in the history")
    p.add_argument("--pushgateway", metavar="URL", help="push the decision to this Prometheus Pushgateway")
    p.add_argument("--pipeline", default="local", help="the pushed series' `pipeline` label (default: local)")
    common(p)
    p.set_defaults(handler=_promote)

    p = verbs.add_parser("rollback", help="point champion back at its predecessor (or --to), without gates")
    p.add_argument("model", help="model name, e.g. flux-g2rpo")
    p.add_argument("--to", default=None, help="version to make champion (default: the one before)")
    p.add_argument("--reason", required=True, help="why (recorded in the history)")
    common(p)
    p.set_defaults(handler=_rollback)

    p = verbs.add_parser("history", help="every alias change, oldest first")
    p.add_argument("model", help="model name, e.g. flux-g2rpo")
    common(p)
    p.set_defaults(handler=_history)
