"""What KFP's launcher does inside a task's container, for a pod of the cluster tier (runs in the component image).

KFP 2.17 runs each task as ``/kfp-launcher/launch --executor_input JSON ... -- COMMAND ARGS`` (the launcher
binary, copied in by an init container, wraps the component's own command). The launcher binary is not
available here, so this file plays its part, and only that part: download each input artifact from its S3 URI
to the local path KFP's SDK maps it to (``s3://b/k`` -> ``/s3/b/k``), replace the ``{{$}}`` placeholder in the
component's command and arguments with the executor input, run them unchanged, then upload each output
artifact from its local path to its URI and record the executor output (parameters, artifact URIs and
metadata) at ``--record_uri`` (where the real launcher writes to ML Metadata).

Usage (in the pod; S3 endpoint and keys from the standard ``AWS_*`` variables the S3 Secret sets)::

    python3 kfp_launch.py --executor_input JSON --record_uri s3://BUCKET/KEY -- sh -ec '...' PROGRAM ARGS...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
from botocore.config import Config

S3_PREFIX = "s3://"
LOCAL_PREFIX = "/s3/"  # kfp.dsl.types.artifact_types._S3_LOCAL_MOUNT_PREFIX


def split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith(S3_PREFIX):
        raise SystemExit(f"kfp_launch: artifact uri {uri!r} is not s3://BUCKET/KEY (the pipeline root must be on S3)")
    bucket, _, key = uri[len(S3_PREFIX) :].partition("/")
    return bucket, key


def local_path(uri: str) -> Path:
    return Path(LOCAL_PREFIX + uri[len(S3_PREFIX) :])


def download(s3, uri: str) -> int:
    """The object at ``uri`` to its local path, or every object under ``uri/`` into that folder."""
    bucket, key = split_uri(uri)
    target = local_path(uri)
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for obj in page.get("Contents", []):
            if obj["Key"] == key:
                dest = target
            elif obj["Key"].startswith(key.rstrip("/") + "/"):
                dest = target / obj["Key"][len(key.rstrip("/")) + 1 :]
            else:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(dest))
            count += 1
    if count == 0:
        raise SystemExit(f"kfp_launch: input artifact {uri} has no object in S3")
    return count


def upload(s3, uri: str) -> int:
    """The local path of ``uri`` (a file, or a folder's files) to S3; 0 when the component wrote nothing there."""
    bucket, key = split_uri(uri)
    source = local_path(uri)
    if source.is_file():
        s3.upload_file(str(source), bucket, key)
        return 1
    count = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else []:
        s3.upload_file(str(path), bucket, f"{key.rstrip('/')}/{path.relative_to(source).as_posix()}")
        count += 1
    return count


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: kfp_launch.py --executor_input JSON --record_uri S3URI -- COMMAND ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--executor_input", required=True)
    parser.add_argument("--record_uri", required=True)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    executor_input = json.loads(args.executor_input)
    s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))

    for name, spec in executor_input.get("inputs", {}).get("artifacts", {}).items():
        for artifact in spec["artifacts"]:
            print(f"kfp_launch: input {name}: {artifact['uri']} ({download(s3, artifact['uri'])} objects)", flush=True)
    for spec in executor_input["outputs"].get("artifacts", {}).values():
        for artifact in spec["artifacts"]:
            local_path(artifact["uri"]).parent.mkdir(parents=True, exist_ok=True)

    placeholder = json.dumps(executor_input)
    done = subprocess.run([word.replace("{{$}}", placeholder) for word in command])
    if done.returncode != 0:
        print(f"kfp_launch: the component exited {done.returncode}", flush=True)
        return done.returncode

    output_file = Path(executor_input["outputs"]["outputFile"])
    output = json.loads(output_file.read_text()) if output_file.is_file() else {}
    written = {name: spec["artifacts"] for name, spec in output.get("artifacts", {}).items()}
    record: dict = {"parameters": output.get("parameterValues", {}), "artifacts": {}}
    for name, spec in executor_input["outputs"].get("artifacts", {}).items():
        artifact = spec["artifacts"][0]
        metadata = {**artifact.get("metadata", {}), **(written.get(name, [{}])[0].get("metadata") or {})}
        count = upload(s3, artifact["uri"])
        print(f"kfp_launch: output {name}: {artifact['uri']} ({count} objects)", flush=True)
        record["artifacts"][name] = {"uri": artifact["uri"], "type": artifact["type"], "metadata": metadata}
    bucket, key = split_uri(args.record_uri)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(record, indent=1).encode())
    print(f"kfp_launch: executor output recorded at {args.record_uri}", flush=True)
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1:]))
