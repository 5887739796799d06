"""What ML Metadata holds of one KFP run's outputs, as the KFP UI reads it: each task's output artifacts (type, URI and
properties — a ``system.Metrics`` artifact's properties are the values ``log_metric`` recorded, which the UI's
metrics tab shows) and each execution's last known state, as JSON on stdout.

It runs with the KFP tool's Python (``WORKDIR/kfp/venv``, which ``kfp up`` makes with ``ml-metadata==1.17.1``), not
the project's: ml-metadata pins protobuf < 5. Usage: ``VENV/bin/python mlmd_outputs.py HOST PORT RUN_ID``.
"""

import json
import sys

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as pb


def value(v):
    """An MLMD property value as JSON: the one field that is set."""
    kind = v.WhichOneof("value")
    if kind == "struct_value":
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(v.struct_value)
    return getattr(v, kind) if kind else None


def main(host: str, port: int, run_id: str) -> dict:
    store = metadata_store.MetadataStore(pb.MetadataStoreClientConfig(host=host, port=port))
    run = store.get_context_by_type_and_name("system.PipelineRun", run_id)
    if run is None:
        raise SystemExit(f"mlmd_outputs: ML Metadata has no system.PipelineRun context named {run_id}")
    execution_types = {t.id: t.name for t in store.get_execution_types()}
    artifact_types = {t.id: t.name for t in store.get_artifact_types()}
    executions = {e.id: e for e in store.get_executions_by_context(run.id)}
    artifacts = {a.id: a for a in store.get_artifacts_by_context(run.id)}
    tasks: dict[str, dict] = {}
    for e in sorted(executions.values(), key=lambda e: e.id):
        name = e.custom_properties["task_name"].string_value if "task_name" in e.custom_properties else ""
        tasks.setdefault(name, {"executions": [], "outputs": {}})["executions"].append(
            {"type": execution_types[e.type_id], "state": pb.Execution.State.Name(e.last_known_state)}
        )
    for event in store.get_events_by_execution_ids(list(executions)):
        if event.type != pb.Event.OUTPUT or event.artifact_id not in artifacts:
            continue
        artifact = artifacts[event.artifact_id]
        execution = executions[event.execution_id]
        task = execution.custom_properties["task_name"].string_value
        output = event.path.steps[0].key if event.path.steps else str(artifact.id)
        tasks[task]["outputs"][output] = {
            "id": artifact.id,
            "type": artifact_types[artifact.type_id],
            "uri": artifact.uri,
            "properties": {k: value(v) for k, v in artifact.custom_properties.items()},
        }
    return tasks


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: mlmd_outputs.py HOST PORT RUN_ID")
    json.dump(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]), sys.stdout, indent=1, sort_keys=True)
