"""What an evaluation's scores depend on, so that a model is scored once per settings.

An evaluation's images and scores are a function of the model's bytes (and, for a trainer export,
the base model's: its VAE and text encoders), the prompts, the seeds, the step counts, the metrics
and the sampling settings — not of where those bytes live or where the evaluation is published.
:class:`ScoringIdentity` holds exactly those, with the models named by their **content** (the
sha256 of their manifests' file list, so a copy or a republish of the same files has the same
identity, and the manifest's ``created_at`` does not count). Its digest is the evaluation's
address: :func:`scored_uri` is ``<evaluations>/scored/<digest>``.

The evaluation records its identity in its manifest's metadata (:data:`IDENTITY_KEY`), so a stored
evaluation is reused only after :func:`check_reusable` has checked every file's sha256 against the
manifest and the recorded identity against the wanted one; a damaged or mismatched one is refused
with the fix, never silently re-scored over or used. A model without a manifest (a plain folder
being edited) has no content identity: it is evaluated every time.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import Field

from g2rpo.artifacts.manifest import has_manifest, read_manifest, verify
from g2rpo.artifacts.scores import Record
from g2rpo.artifacts.storage import S3Settings, open_store
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.artifact import PromptSet
from g2rpo.evaluation.config import EvaluationConfig

__all__ = [
    "IDENTITY_KEY",
    "NOT_SAMPLING",
    "ScoringIdentity",
    "check_reusable",
    "content_digest",
    "sampling_settings",
    "scored_uri",
    "scoring_identity",
]

IDENTITY_KEY = "scored"  # the evaluation manifest's metadata key that holds its ScoringIdentity
# Config keys that change no image and no score (where the prompts are read, how many processes, caches).
NOT_SAMPLING = frozenset(
    {"prompts", "num_prompts", "seeds", "num_steps", "extra_steps", "cache_dir", "device", "trained_metrics"}
)


class ScoringIdentity(Record):
    """Everything an evaluation's scores depend on; equal identities give equal scores."""

    model_digest: str = Field(description="content digest of the evaluated model (content_digest)")
    base_model_digest: str | None = Field(description="content digest of the base model an export borrows from")
    prompt_set_sha256: str
    prompts: list[str]
    seeds: list[int]
    step_counts: list[int]
    metrics: list[str]
    sampling: dict = Field(description="every config key that changes an image or a score, and the device type")

    @property
    def digest(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def sampling_settings(config: EvaluationConfig, device_type: str) -> dict:
    """The config's keys that change an image or a score (all but :data:`NOT_SAMPLING`), with the device type."""
    kept = {k: v for k, v in config.model_dump(mode="json").items() if k not in NOT_SAMPLING}
    return {"device": device_type, **kept}


def content_digest(uri: str, settings: S3Settings | None = None) -> str | None:
    """sha256 of the sorted (path, sha256, size) list of the artifact's manifest at ``uri``; None
    without a manifest. Names the files' bytes, not when or where they were published."""
    store = open_store(uri, settings)
    if not has_manifest(store):
        return None
    files = sorted((entry.path, entry.sha256, entry.size) for entry in read_manifest(store).files)
    return hashlib.sha256(json.dumps(files, separators=(",", ":")).encode()).hexdigest()


def scoring_identity(
    model_uri: str,
    config: EvaluationConfig,
    prompt_set: PromptSet,
    metrics: list[str],
    device_type: str,
    *,
    base_model_uri: str | None = None,
    settings: S3Settings | None = None,
) -> ScoringIdentity | None:
    """The identity of evaluating ``model_uri`` so; None when the model (or the base model given) has no
    manifest, so its bytes cannot be named."""
    model = content_digest(model_uri, settings)
    base = None
    if base_model_uri and base_model_uri != model_uri:
        base = content_digest(base_model_uri, settings)
        if base is None:
            return None
    if model is None:
        return None
    return ScoringIdentity(
        model_digest=model,
        base_model_digest=base,
        prompt_set_sha256=prompt_set.sha256,
        prompts=list(prompt_set.prompts),
        seeds=list(config.seeds),
        step_counts=list(config.step_counts),
        metrics=list(metrics),
        sampling=sampling_settings(config, device_type),
    )


def scored_uri(evaluations_uri: str, identity: ScoringIdentity) -> str:
    """Where the evaluation of ``identity`` is published under ``evaluations_uri``: its content address."""
    return f"{evaluations_uri.rstrip('/')}/scored/{identity.digest}"


def check_reusable(uri: str, identity: ScoringIdentity, settings: S3Settings | None = None) -> bool:
    """Whether ``uri`` holds a published evaluation of ``identity`` that may be used instead of scoring
    again: False when nothing is published there; True after every file's sha256 matched the manifest
    and the recorded identity matched ``identity``. A damaged evaluation, or one of another identity, is
    refused (G2RPOError naming what differs and the fix)."""
    store = open_store(uri, settings)
    if not has_manifest(store):
        return False
    fix = f"delete {uri} and run again: the model is then scored afresh and published there"
    try:
        manifest = verify(store, deep=True)
    except G2RPOError as exc:
        raise G2RPOError(
            problem("stored scores", uri, f"do not match their manifest ({' '.join(str(exc).split())}); {fix}")
        ) from None
    recorded = manifest.metadata.get(IDENTITY_KEY)
    wanted = identity.model_dump(mode="json")
    if recorded != wanted:
        if not isinstance(recorded, dict):
            differs = f"it records no {IDENTITY_KEY!r} identity"
        else:
            keys = sorted(k for k in wanted.keys() | recorded.keys() if recorded.get(k) != wanted.get(k))
            differs = f"they differ in {', '.join(keys)}"
        raise G2RPOError(problem("stored scores", uri, f"are not of this model and settings ({differs}); {fix}"))
    return True
