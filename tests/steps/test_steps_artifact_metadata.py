"""The records the tasks put in their KFP artifacts' metadata are ones KFP's launcher can store.

KFP 2.17's launcher turns each top-level metadata value into an ML Metadata property; a null one fails the task
(``unknown/unsupported value type *structpb.Value_NullValue``), which is what the real backend did to every first
run's evaluate (no champion yet: ``champion_version`` None). :func:`g2rpo.steps.records.artifact_metadata` leaves
None fields out; the record reads back equal.
"""

from __future__ import annotations

from google.protobuf import struct_pb2

from g2rpo.steps.records import CandidatesRecord, DecisionRecord, artifact_metadata
from tests.pipeline.test_pipeline_compile import COMPILED

FIRST_RUN = CandidatesRecord(
    challenger_eval_uri="s3://b/run/evaluate/evaluation",
    challenger_means={"clip": 0.8, "hps_v21": 0.5},
    baseline_label="base model",
    baseline_eval_uri=None,
    trained_metrics=["clip"],
)
FIRST_DECISION = DecisionRecord(model="m", version=1, passed=True, gates_sha256="0" * 64, reasons=["clip: pass"])


def _kinds_the_launcher_stores(metadata: dict) -> set[str]:
    """The protobuf kinds of the top-level values, as the launcher sees them (metadata goes to it as a Struct)."""
    struct = struct_pb2.Struct()
    struct.update(metadata)
    return {value.WhichOneof("kind") for value in struct.fields.values()}


def test_a_first_runs_records_hold_nulls_that_the_launcher_refuses():
    for record in (FIRST_RUN, FIRST_DECISION):
        assert "null_value" in _kinds_the_launcher_stores(record.model_dump(mode="json")), record


def test_artifact_metadata_has_no_null_and_reads_back_equal():
    for record in (FIRST_RUN, FIRST_DECISION):
        metadata = artifact_metadata(record)
        assert _kinds_the_launcher_stores(metadata) <= {
            "string_value",
            "number_value",
            "bool_value",
            "struct_value",
            "list_value",
        }
        assert type(record).model_validate(metadata) == record


def test_the_compiled_tasks_put_artifact_metadata_in_their_artifacts():
    text = COMPILED.read_text()
    for output in ("evaluation", "decision"):
        assert f"{output}.metadata.update(artifact_metadata(record))" in text, output
    assert 'metadata.update(record.model_dump(mode=\\"json\\"))' not in text
