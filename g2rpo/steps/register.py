"""Step **register**: a published export and its evaluation's per-prompt scores in, a registry version out.

Order matters, so that a refused registration writes nothing: the scores are validated first
(:func:`read_scores` names the bad item and metric), then the export's manifest is read (an export
that was never published is refused), and only then are the scores published and the version
recorded. With ``challenger=True`` the challenger alias moves to the new version.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from g2rpo.artifacts.manifest import Manifest, read_manifest
from g2rpo.artifacts.promotion import eval_record_from_scores
from g2rpo.artifacts.registry import BaseModelRef, ModelVersion, Registry
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings, locate, open_store
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import JSON_MAX_BYTES, decode_json, read_regular_file

__all__ = ["RegisterResult", "read_scores", "register"]

EVAL_SCORES_FILE = "scores.json"  # in an evaluation artifact (g2rpo.evaluation.artifact's layout)


@dataclass(frozen=True)
class RegisterResult:
    """The version :func:`register` recorded."""

    registry_uri: str
    model: str
    version: int
    record: ModelVersion
    export_manifest: Manifest
    scores_uri: str  # the published per-prompt scores
    scores_sha256: str
    means: dict[str, float]  # metric -> mean over the evaluation set
    challenger: bool  # the challenger alias now points here


def read_scores(location: str, settings: S3Settings | None = None, field: str = "scores") -> EvalScores:
    """Per-prompt evaluation scores from a JSON file (a path or ``s3://`` URI), validated.

    Errors name ``field`` (e.g. ``--scores``), the location and what is wrong (the first three problems).
    """
    fix = "pass the eval's per-prompt scores JSON (docs/registry.md)"
    try:  # UTF-8 JSON, one object; a local file must be a regular file of bounded size
        if location.startswith("s3://"):
            store, key = locate(location, settings)
            data = store.get_bytes(key, max_bytes=JSON_MAX_BYTES)[0]
        else:
            path = Path(location.removeprefix("file://"))
            if not os.path.lexists(path):
                raise G2RPOError(f"no such file: {fix}")
            data = read_regular_file(path, what="scores file", max_bytes=JSON_MAX_BYTES, fix=fix)
        document = decode_json(data, "the scores file", fix=fix)
    except G2RPOError as exc:
        raise G2RPOError(problem(field, location, str(exc))) from None
    try:
        return EvalScores.model_validate(document)
    except ValidationError as exc:
        details = "; ".join(
            (f"{'.'.join(str(part) for part in e['loc'])}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()[:3]
        )
        raise G2RPOError(
            problem(field, location, f"not a valid scores file: {details}; see docs/registry.md")
        ) from None


def register(
    registry_uri: str,
    model: str,
    *,
    export_uri: str,
    scores: EvalScores | str | None = None,
    eval_uri: str | None = None,
    source_run: str,
    config_hash: str,
    base_model: str,
    licence: str,
    challenger: bool = False,
    settings: S3Settings | None = None,
) -> RegisterResult:
    """Register the published export ``export_uri`` as a new version of ``model`` with its evaluation's
    per-prompt scores: ``scores`` (an :class:`EvalScores` or the location of its JSON file), or
    ``eval_uri``, a published evaluation artifact (:func:`g2rpo.steps.evaluate.evaluate`'s output)."""
    if (scores is None) == (eval_uri is None):
        raise G2RPOError(problem("scores", scores, "pass the scores or eval_uri (the evaluation artifact), not both"))
    if eval_uri is not None:
        read_manifest(open_store(eval_uri, settings))  # a published evaluation, not a half-written one
        scores = read_scores(f"{eval_uri.rstrip('/')}/{EVAL_SCORES_FILE}", settings, field="eval_uri")
    elif isinstance(scores, str):
        scores = read_scores(scores, settings)
    registry = Registry(registry_uri, settings)
    # Before anything is written: a refused registration must leave no published (and so never
    # garbage-collected) scores artifact behind.
    export_manifest = read_manifest(open_store(export_uri, settings))
    scores_uri, scores_sha = registry.publish_scores(model, scores)
    eval_record = eval_record_from_scores(scores, scores_uri, scores_sha)
    record = registry.register(
        model,
        export_uri=export_uri,
        eval_record=eval_record,
        source_run=source_run,
        config_hash=config_hash,
        base_model=BaseModelRef(name=base_model, licence=licence),
    )
    if challenger:
        registry.set_alias(model, "challenger", record.version, reason="registered as challenger")
    return RegisterResult(
        registry_uri=registry.store.uri,
        model=model,
        version=record.version,
        record=record,
        export_manifest=export_manifest,
        scores_uri=scores_uri,
        scores_sha256=scores_sha,
        means={name: summary.mean for name, summary in record.eval.metrics.items()},
        challenger=challenger,
    )
