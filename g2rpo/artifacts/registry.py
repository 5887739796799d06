"""A model registry on any :mod:`g2rpo.artifacts.storage` store: versions, aliases, history.

Layout under the registry's root URI (``s3://bucket/registry`` or a local folder)::

    models/<model>/versions/000001.json        a version's record (create-only, immutable)
    models/<model>/evals/<unique>/scores.json  per-prompt scores of an eval (a published artifact)
    models/<model>/decisions/000001/<t>.json   promotion decisions about version 1 (create-only)
    models/<model>/state.json                  aliases + history, one document (compare-and-swap)

A *version record* is the version's manifest: schema version, producer, source pipeline run,
config hash, base model and its licence, the exported model's URI with its manifest digest and
file digests, and the eval record (per metric mean, CI and n; prompt set and seeds; a pointer to the
per-prompt scores with their sha256, so paired comparisons can be recomputed).

Aliases follow MLflow's move from stages to aliases: ``champion`` (what serves) and
``challenger`` (the candidate) are names that point at version numbers. Aliases and their history
live in one ``state.json`` so that one conditional write moves an alias *and* appends its history
event: it is created with ``If-None-Match: *`` and replaced with ``If-Match: <etag>``. A writer
that loses the race gets :class:`AliasConflict` and nothing it wrote is visible, so there are no
lost updates. Version numbers are claimed the same way (create-only ``versions/<n>.json``; a loser
takes the next number).

The registry does not decide promotions; :mod:`g2rpo.artifacts.promotion` does, and writes through
:meth:`Registry.update_state`.
"""

from __future__ import annotations

import difflib
import getpass
import hashlib
import json
import re
import secrets
import socket
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import Field

from g2rpo import __version__
from g2rpo.artifacts.manifest import MANIFEST_NAME, FileEntry, mismatches, parse_manifest, read_manifest
from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.scores import SCHEMA_VERSION, EvalScores, MetricSummary, Record, ScoreItem
from g2rpo.artifacts.storage import FileStore, ObjectNotFound, S3Settings, Store, WriteConflict, open_store
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import JSON_MAX_BYTES, decode_json, decode_record

__all__ = [
    "ALIASES",
    "AliasConflict",
    "BaseModelRef",
    "MetricSummary",
    "ScoreItem",
    "EvalScores",
    "EvalRecord",
    "ExportRef",
    "ModelVersion",
    "HistoryEvent",
    "RegistryState",
    "Registry",
    "validate_model_name",
    "find_registries",
]

ALIASES = ("champion", "challenger")
_MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_MAX_VERSION_CLAIMS = 100


class AliasConflict(G2RPOError):
    """Another writer changed the model's aliases/history between our read and our write."""


class BaseModelRef(Record):
    name: str = Field(description="base model id, e.g. black-forest-labs/FLUX.1-dev")
    licence: str = Field(description="the base model's licence, e.g. flux-1-dev-non-commercial-license")


class EvalRecord(Record):
    prompt_set: str = Field(description="name (or URI) of the prompt set")
    prompt_set_sha256: str | None = Field(None, description="digest of the prompt set file, when known")
    seeds: list[int] = Field(description="sampling seeds")
    n: int = Field(ge=1, description="number of (prompt, seed) items")
    metrics: dict[str, MetricSummary] = Field(description="per metric summary")
    definitions: dict[str, str] = Field(
        default_factory=dict, description="metric name -> the official definition its scores follow"
    )
    scores_uri: str = Field(description="URI of the published per-prompt scores artifact")
    scores_sha256: str = Field(description="sha256 of scores.json")


class ExportRef(Record):
    uri: str = Field(description="URI of the exported model artifact (published, with a manifest)")
    manifest_sha256: str = Field(description="sha256 of the export's manifest.json")
    files: list[FileEntry] = Field(description="the export's files with sizes and digests")


class ModelVersion(Record):
    """A version's record; immutable once written."""

    schema_version: int = Field(SCHEMA_VERSION, description="record format version")
    model: str
    version: int = Field(ge=1)
    created_at: str
    producer: str
    source_run: str = Field(description="pipeline run that produced the model")
    config_hash: str = Field(description="hash of the training config")
    base_model: BaseModelRef
    export: ExportRef
    eval: EvalRecord


class HistoryEvent(Record):
    revision: int = Field(description="state revision this event created")
    at: str
    actor: str = Field(description="user@host that made the change")
    action: str = Field(description="promote | rollback | set-alias | clear-alias")
    alias: str
    version: int | None = Field(description="version the alias points to after the event (None: cleared)")
    previous: int | None = Field(description="version it pointed to before")
    reason: str = ""
    decision: str | None = Field(None, description="key of the decision record behind a promotion")


class RegistryState(Record):
    schema_version: int = SCHEMA_VERSION
    model: str
    revision: int = 0
    aliases: dict[str, int] = Field(default_factory=dict)
    history: list[HistoryEvent] = Field(default_factory=list)


_STATE_KEY = re.compile(r"^(?:(.*)/)?models/[^/]+/state\.json$")


def find_registries(uri: str, settings: S3Settings | None = None) -> list[str]:
    """Root URIs of the registries stored anywhere under ``uri`` (those with at least one model state)."""
    store = open_store(uri, settings)
    roots = []
    for info in store.list():
        match = _STATE_KEY.match(info.key)
        if match:
            roots.append(store.uri_for(match.group(1) or ""))
    return list(dict.fromkeys(roots))


def validate_model_name(model: str) -> str:
    if not isinstance(model, str) or not _MODEL_NAME.match(model):
        raise G2RPOError(
            problem("model", model, "use 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter/digit")
        )
    return model


def validate_alias(alias: str) -> str:
    if alias not in ALIASES:
        raise G2RPOError(problem("alias", alias, f"use one of {', '.join(ALIASES)}"))
    return alias


def _closest(name: str, candidates: list[str]) -> list[str]:
    """``candidates``, the most similar to ``name`` first (difflib's ratio; ties alphabetical)."""
    return sorted(candidates, key=lambda c: (-difflib.SequenceMatcher(None, name, c).ratio(), c))


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# Registry records are written whole (create-only or compare-and-swap), so a damaged one was changed outside g2rpo.
_RECORD_FIX = "the registry record was changed outside g2rpo: restore it from a backup or the bucket's object versions"


def _parse(cls, data: bytes, where: str, fix: str = _RECORD_FIX):
    return decode_record(cls, data, where, fix=fix)  # UTF-8 JSON, one object, the model's fields: else named


class Registry:
    """Model versions and aliases under one root URI."""

    def __init__(self, uri: str, settings: S3Settings | None = None):
        self.settings = settings
        self.store: Store = open_store(uri, settings)
        self.uri = self.store.uri

    # ------------------------------------------------------------------ keys

    @staticmethod
    def _version_key(model: str, version: int) -> str:
        return f"models/{model}/versions/{version:06d}.json"

    @staticmethod
    def _state_key(model: str) -> str:
        return f"models/{model}/state.json"

    # ------------------------------------------------------------------ reading

    def models(self) -> list[str]:
        names = set()
        for info in self.store.list("models"):
            parts = info.key.split("/")
            if len(parts) >= 4 and parts[2] == "versions":
                names.add(parts[1])
        return sorted(names)

    def require_models(self) -> list[str]:
        """The registry's models; raises when it holds none (a wrong ``--registry`` looks just like that)."""
        models = self.models()
        if models:
            return models
        fix = "check --registry / $G2RPO_REGISTRY_URI (a registry appears with its first `g2rpo registry register`)"
        nearby = self._registries_beside()
        if nearby:
            fix += f"; registries next to it, closest first: {', '.join(nearby)}"
        raise G2RPOError(problem("registry", self.uri, f"no registry here (it holds no model versions): {fix}"))

    def require_model(self, model: str) -> str:
        """``model`` when the registry has versions of it; otherwise an error listing the models it
        has, the closest name first (a typo must not read as a model without versions)."""
        if self.version_numbers(model):
            return model
        models = self.require_models()
        raise G2RPOError(
            problem(
                "model",
                model,
                f"no such model in registry {self.uri}; models here, closest first: {', '.join(_closest(model, models))}",
            )
        )

    def _registries_beside(self) -> list[str]:
        """Local registries in the same parent folder, closest name first (S3 is not searched: a
        bucket-wide listing could be huge)."""
        if not isinstance(self.store, FileStore) or not self.store.root.parent.is_dir():
            return []
        root = self.store.root
        found = [str(d) for d in root.parent.iterdir() if d != root and d.is_dir() and (d / "models").is_dir()]
        return _closest(str(root), found)

    def version_numbers(self, model: str) -> list[int]:
        validate_model_name(model)
        numbers = []
        for info in self.store.list(f"models/{model}/versions"):
            name = info.key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                numbers.append(int(name[:-5]))
        return sorted(numbers)

    def get_version(self, model: str, version: int) -> ModelVersion:
        validate_model_name(model)
        key = self._version_key(model, int(version))
        try:
            data, _ = self.store.get_bytes(key, max_bytes=JSON_MAX_BYTES)
        except ObjectNotFound:
            known = self.version_numbers(model)
            raise G2RPOError(
                problem("version", version, f"model {model!r} has no such version (known: {known or 'none'})")
            ) from None
        return _parse(ModelVersion, data, self.store.uri_for(key))

    def resolve(self, model: str, ref: str | int) -> int:
        """A version number from ``3``, ``'3'``, ``'v3'``, ``'champion'`` or ``'challenger'``."""
        if isinstance(ref, int):
            return ref
        text = str(ref).strip()
        if text in ALIASES:
            state, _ = self.read_state(model)
            if text not in state.aliases:
                raise G2RPOError(problem("version", ref, f"model {model!r} has no {text}; give a version number"))
            return state.aliases[text]
        digits = text[1:] if text[:1] in ("v", "V") else text
        if not digits.isdigit():
            raise G2RPOError(problem("version", ref, "give a version number (3 or v3) or champion/challenger"))
        return int(digits)

    def read_state(self, model: str) -> tuple[RegistryState, str | None]:
        """The model's aliases and history, and the etag to update them with (None: never written)."""
        validate_model_name(model)
        key = self._state_key(model)
        try:
            data, etag = self.store.get_bytes(key, max_bytes=JSON_MAX_BYTES)
        except ObjectNotFound:
            return RegistryState(model=model), None
        return _parse(RegistryState, data, self.store.uri_for(key)), etag

    def load_scores(self, record: ModelVersion) -> EvalScores:
        """The per-prompt scores of a version's eval, checked against the recorded sha256."""

        store = open_store(record.eval.scores_uri, self.settings)
        try:
            data, _ = store.get_bytes("scores.json", max_bytes=JSON_MAX_BYTES)
        except ObjectNotFound:
            raise G2RPOError(
                f"{record.eval.scores_uri}/scores.json is missing (version {record.version} of {record.model}); "
                "the eval artifact was deleted: re-register the eval"
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != record.eval.scores_sha256:
            raise G2RPOError(
                f"{record.eval.scores_uri}/scores.json has sha256 {digest[:12]}…, version {record.version} recorded "
                f"{record.eval.scores_sha256[:12]}…: the scores were changed after registration"
            )
        return _parse(EvalScores, data, store.uri_for("scores.json"), "the eval artifact is damaged: re-run the eval")

    def decisions(self, model: str, version: int) -> list[dict]:
        out = []
        for info in self.store.list(f"models/{model}/decisions/{version:06d}"):
            data, _ = self.store.get_bytes(info.key, max_bytes=JSON_MAX_BYTES)
            out.append(decode_json(data, self.store.uri_for(info.key), fix=_RECORD_FIX))
        return out

    def protected_uris(self) -> list[str]:
        """URIs GC must never delete: every champion's export and eval artifacts."""
        uris = []
        for model in self.models():
            state, _ = self.read_state(model)
            champion = state.aliases.get("champion")
            if champion is not None:
                record = self.get_version(model, champion)
                uris += [record.export.uri, record.eval.scores_uri]
        return uris

    # ------------------------------------------------------------------ writing

    def publish_scores(self, model: str, scores: EvalScores) -> tuple[str, str]:
        """Publish per-prompt scores as an artifact of their own; returns ``(uri, sha256)``."""

        validate_model_name(model)
        data = scores.model_dump_json(indent=1).encode()
        uri = self.store.uri_for(f"models/{model}/evals/{unique_prefix('eval')}")
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "scores.json").write_bytes(data)
            publish_dir(tmp, uri, producer=f"g2rpo.artifacts.registry {__version__}", settings=self.settings)
        return uri, hashlib.sha256(data).hexdigest()

    def register(
        self,
        model: str,
        *,
        export_uri: str,
        eval_record: EvalRecord,
        source_run: str,
        config_hash: str,
        base_model: BaseModelRef,
        producer: str = f"g2rpo {__version__}",
    ) -> ModelVersion:
        """Record a new version (the next free number) of ``model``; returns its record.

        The export must be a published artifact (it has a manifest); its digests are copied into
        the record. Racing registrations get distinct numbers.
        """

        validate_model_name(model)
        export_store = open_store(export_uri, self.settings)
        manifest = read_manifest(export_store)
        manifest_bytes, _ = export_store.get_bytes("manifest.json", max_bytes=JSON_MAX_BYTES)
        export = ExportRef(
            uri=export_store.uri,
            manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(),
            files=manifest.files,
        )
        self._check_export(export, f"{model!r}'s new version")
        number = (self.version_numbers(model) or [0])[-1] + 1
        for _ in range(_MAX_VERSION_CLAIMS):
            record = ModelVersion(
                model=model,
                version=number,
                created_at=_now_iso(),
                producer=producer,
                source_run=source_run,
                config_hash=config_hash,
                base_model=base_model,
                export=export,
                eval=eval_record,
            )
            try:
                self.store.put_bytes(
                    self._version_key(model, number), record.model_dump_json(indent=1).encode(), if_none_match=True
                )
                return record
            except WriteConflict:
                number += 1  # another writer claimed this number first
        raise G2RPOError(f"could not claim a version number for {model!r} after {_MAX_VERSION_CLAIMS} tries; retry")

    def verify_export(self, record: ModelVersion) -> None:
        """Check, now, that the version's export is there and is the one registered: its manifest's sha256
        is the recorded one and every file it lists is present with its size (one HEAD per file; the
        manifest pins every file's sha256). Raises naming the version, the URI and what is wrong."""
        self._check_export(record.export, f"{record.model!r} v{record.version}")

    def _check_export(self, export: ExportRef, what: str) -> None:

        store = open_store(export.uri, self.settings)
        fix = "publish the export again and register it as a new version, or restore the export from a backup"
        try:
            data, _ = store.get_bytes(MANIFEST_NAME, max_bytes=JSON_MAX_BYTES)
        except ObjectNotFound:
            raise G2RPOError(
                f"{what}: its export {export.uri} has no {MANIFEST_NAME} (deleted, or never published): "
                f"an alias must not point at a model that is not there; {fix}"
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != export.manifest_sha256:
            raise G2RPOError(
                f"{what}: its export's {export.uri}/{MANIFEST_NAME} has sha256 {digest[:12]}…, recorded "
                f"{export.manifest_sha256[:12]}… at registration: the export was replaced; {fix}"
            )
        manifest = parse_manifest(data, store.uri_for(MANIFEST_NAME))
        problems = mismatches(store, manifest)
        if problems:
            raise G2RPOError(
                f"{what}: its export {export.uri} does not match its manifest ({len(problems)} problem(s)); {fix}\n  - "
                + "\n  - ".join(problems)
            )

    def record_decision(self, model: str, version: int, decision: dict) -> str:
        """Store a promotion decision with the version (create-only); returns its key."""

        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        key = f"models/{model}/decisions/{version:06d}/{stamp}-{secrets.token_hex(4)}.json"
        self.store.put_bytes(key, json.dumps(decision, indent=1, sort_keys=True).encode(), if_none_match=True)
        return key

    def update_state(
        self,
        model: str,
        change: Callable[[RegistryState], list[HistoryEvent]],
        *,
        expected: tuple[RegistryState, str | None] | None = None,
    ) -> RegistryState:
        """Apply ``change`` to the model's state with one conditional write.

        ``change(state)`` returns the events to append (each with alias, version, previous set);
        the aliases are moved accordingly and the revision bumped. ``expected`` is the
        ``(state, etag)`` the caller based its decision on; when the stored state has moved on
        since, :class:`AliasConflict` is raised and nothing is written.
        """
        state, etag = expected if expected is not None else self.read_state(model)
        events = change(state)
        aliases = dict(state.aliases)
        revision = state.revision + 1
        stamped = []
        for event in events:
            if event.version is None:
                aliases.pop(event.alias, None)
            else:
                aliases[event.alias] = event.version
            stamped.append(event.model_copy(update={"revision": revision, "at": _now_iso(), "actor": _actor()}))
        new = RegistryState(model=model, revision=revision, aliases=aliases, history=[*state.history, *stamped])
        data = new.model_dump_json(indent=1).encode()
        try:
            if etag is None:
                self.store.put_bytes(self._state_key(model), data, if_none_match=True)
            else:
                self.store.put_bytes(self._state_key(model), data, if_match=etag)
        except WriteConflict:
            current, _ = self.read_state(model)
            raise AliasConflict(
                f"the aliases of {model!r} changed while this update was prepared (revision {state.revision} → "
                f"{current.revision}, now {current.aliases or 'no aliases'}); aliases and history were left as "
                "they are: rerun the command to decide against the new state"
            ) from None
        return new

    def set_alias(self, model: str, alias: str, version: int | None, reason: str = "") -> RegistryState:
        """Point ``alias`` at ``version`` (None clears it), without gates. Conditional write."""
        validate_alias(alias)
        if version is not None:
            self.verify_export(self.get_version(model, version))  # must exist, its export too

        def change(state: RegistryState) -> list[HistoryEvent]:
            return [
                HistoryEvent(
                    revision=0,
                    at="",
                    actor="",
                    action="set-alias" if version is not None else "clear-alias",
                    alias=alias,
                    version=version,
                    previous=state.aliases.get(alias),
                    reason=reason,
                )
            ]

        return self.update_state(model, change)
