"""The small JSON records the pipeline's tasks hand to each other (inside their KFP artifacts).

Each task of the KFP pipeline writes one record next to its outputs and the next task reads it; the
records hold URIs of published artifacts (durable, in the run's store), never the artifacts themselves,
so a registry version never points at a pod's local folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import Field

from g2rpo.config import Section
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import JSON_MAX_BYTES, decode_record, read_regular_file

__all__ = [
    "CandidatesRecord",
    "DecisionRecord",
    "RECORD_FILE",
    "TrainRecord",
    "artifact_metadata",
    "read_record",
    "write_record",
]

RECORD_FILE = "record.json"  # inside each task's output artifact folder

R = TypeVar("R", bound=Section)


def artifact_metadata(record: Section) -> dict:
    """``record`` as a KFP artifact's metadata: its JSON form, leaving out the fields that are None.

    KFP 2.17's launcher turns each top-level metadata value into an ML Metadata property and refuses a null one
    (``failed to convert RuntimeArtifact to MLMD artifact: unknown/unsupported value type
    *structpb.Value_NullValue``), failing the task after its work is done: every first run's evaluate
    (``champion_version`` is None until a champion exists) failed so on the real backend, where ``kfp.local``
    had taken it. A field left out reads back as its default, None (``type(record).model_validate``)."""
    return record.model_dump(mode="json", exclude_none=True)


class TrainRecord(Section):
    """What the train task published."""

    export_uri: str = Field(description="the published export (a manifest-carrying artifact)")
    base_model_uri: str = Field(description="the Flux pipeline the export was trained from")
    base_model_name: str = Field(description="the base model's id, recorded in the registry")
    licence: str = Field(description="the base model's licence, recorded in the registry")
    config_hash: str = Field(description="the run's resume hash")
    run_config: str = Field(description="file name (in the same folder) of the resolved run config YAML")
    iterations: int = Field(ge=0, description="iterations the run completed")
    first_reward: float | None = Field(None, description="mean rollout reward of the run's first iteration")
    last_reward: float | None = Field(None, description="mean rollout reward of its last iteration")
    selected_iteration: int | None = Field(
        None, description="the validated iteration the export holds (train.validation); None: the last iteration"
    )
    selection_reason: str | None = Field(None, description="why that iteration was chosen")
    early_stop: str | None = Field(None, description="why the run stopped early; None: it ran its iterations")
    validation_curve: list[dict] = Field(
        default_factory=list,
        description="per validation: iteration, objective, breached metrics, per-metric means (empty: validation off)",
    )


class CandidatesRecord(Section):
    """What the evaluate task published: the challenger's evaluation, and the champion's on the same items."""

    challenger_eval_uri: str
    champion_eval_uri: str | None = Field(None, description="None: no champion yet")
    champion_version: int | None = None
    challenger_means: dict[str, float]
    champion_means: dict[str, float] = Field(default_factory=dict)
    baseline_label: str = Field("", description="what the challenger was paired with: 'champion vN' or 'base model'")
    baseline_eval_uri: str | None = Field(
        None, description="that baseline's evaluation (the champion's, or the base model's)"
    )
    baseline_means: dict[str, float] = Field(default_factory=dict)
    trained_metrics: list[str] = Field(default_factory=list, description="the rewards the challenger was trained on")
    paired: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="metric -> the challenger minus the baseline on the same items: delta, its 95 % bootstrap "
        "interval ci_low..ci_high, n",
    )


class DecisionRecord(Section):
    """What the decide task found: the registered version and whether it passes the gates."""

    model: str
    version: int
    passed: bool
    champion: int | None = Field(None, description="the champion the decision compared against; None: none yet")
    gates_sha256: str
    reasons: list[str] = Field(description="one line per gate: metric, verdict, why")


def write_record(record: Section, folder: str | Path) -> Path:
    """Write ``record`` as ``folder/record.json`` (the folder is made)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORD_FILE
    path.write_text(record.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def read_record(cls: type[R], folder: str | Path, field: str = "record") -> R:
    """The record ``cls`` from ``folder/record.json``; a missing or malformed one names ``field``."""
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        raise G2RPOError(problem(field, str(folder), f"holds no {RECORD_FILE}: the task that makes it did not finish"))
    fix = "run the task that makes it again (it writes the record whole, so this one was changed since)"
    try:
        data = read_regular_file(path, what=f"{cls.__name__} record", max_bytes=JSON_MAX_BYTES, fix=fix)
        return decode_record(cls, data, str(path), fix=fix)
    except G2RPOError as exc:
        raise G2RPOError(problem(field, str(folder), str(exc))) from None
