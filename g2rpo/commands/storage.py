"""``g2rpo storage put|get|ls|verify|gc``: move artifacts between local folders and stores."""

from __future__ import annotations

import argparse
from pathlib import Path

from g2rpo.errors import G2RPOError, problem

_URI_HELP = "a local path, file:///abs/path or s3://bucket/prefix"


def _add_s3_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url", help="S3 endpoint (MinIO/SeaweedFS/Ceph); default: AWS_ENDPOINT_URL_S3 or AWS")
    p.add_argument("--region", help="S3 region; default: AWS_DEFAULT_REGION / the AWS config file")


def settings_from_args(args):
    from pydantic import ValidationError

    from g2rpo.artifacts.storage import S3Settings

    endpoint = getattr(args, "endpoint_url", None)
    try:
        return S3Settings(endpoint_url=endpoint, region=getattr(args, "region", None))
    except ValidationError:
        raise G2RPOError(problem("--endpoint-url", endpoint, "give a URL like http://127.0.0.1:8333")) from None


def _put(args) -> int:
    from g2rpo.artifacts.publish import publish_dir
    from g2rpo.artifacts.storage import locate

    settings = settings_from_args(args)
    source = Path(args.source)
    if source.is_dir():
        dest = args.dest
        if args.unique:
            from g2rpo.artifacts.publish import unique_uri

            dest = unique_uri(dest)
        manifest = publish_dir(
            source, dest, producer=args.producer or "g2rpo storage put", config_hash=args.config_hash, settings=settings
        )
        print(f"published {len(manifest.files)} file(s), {manifest.total_size} bytes → {dest}")
        return 0
    if not source.is_file():
        raise G2RPOError(problem("source", args.source, "no such file or folder"))
    # These describe an artifact's manifest; a single object has none, so they would be ignored.
    for option, value in (
        ("--unique", args.unique or None),
        ("--producer", args.producer),
        ("--config-hash", args.config_hash),
    ):
        if value is not None:
            raise G2RPOError(
                problem(
                    option, value, "only applies to a folder (an artifact with a manifest); drop it for a single file"
                )
            )
    store, key = locate(args.dest, settings)
    store.put_file(key, source)
    print(f"uploaded {source} → {store.uri_for(key)}")
    return 0


def _get(args) -> int:
    from g2rpo.artifacts.cache import download_dir
    from g2rpo.artifacts.manifest import has_manifest
    from g2rpo.artifacts.storage import locate, open_store

    settings = settings_from_args(args)
    if has_manifest(open_store(args.source, settings)):
        manifest = download_dir(args.source, args.dest, settings)
        print(f"downloaded and verified {len(manifest.files)} file(s), {manifest.total_size} bytes → {args.dest}")
        return 0

    store, key = locate(args.source, settings)
    if Path(args.dest).exists():
        raise G2RPOError(problem("dest", args.dest, "already exists; choose a new path or remove it first"))
    store.get_file(key, args.dest)
    print(f"downloaded {store.uri_for(key)} → {args.dest}")
    return 0


def _ls(args) -> int:
    from g2rpo.artifacts.storage import open_store

    store = open_store(args.uri, settings_from_args(args))
    for info in store.list():
        print(f"{info.size:>14}  {info.modified:%Y-%m-%d %H:%M:%S}  {info.key}")
    return 0


def _verify(args) -> int:
    from g2rpo.artifacts.manifest import verify
    from g2rpo.artifacts.storage import open_store

    manifest = verify(open_store(args.uri, settings_from_args(args)), deep=args.deep)
    print(f"ok: {len(manifest.files)} file(s) match the manifest ({'sha256' if args.deep else 'sizes'} checked)")
    return 0


def _gc(args) -> int:
    from g2rpo.artifacts.gc import gc, parse_duration

    settings = settings_from_args(args)
    older_than = parse_duration(args.older_than)
    from g2rpo.artifacts.registry import Registry, find_registries

    registries = list(args.registry or []) + find_registries(args.uri, settings)
    protected = []
    for registry_uri in dict.fromkeys(registries):
        protected += Registry(registry_uri, settings).protected_uris()
    report = gc(args.uri, older_than, protected=protected, dry_run=args.dry_run, settings=settings)
    verb = "would remove" if args.dry_run else "removed"
    for uri in report.removed:
        print(f"{verb} {uri}")
    for uri in report.uploads_aborted:
        print(f"{'would abort' if args.dry_run else 'aborted'} unfinished multipart upload of {uri}")
    for uri in report.kept_protected:
        print(f"kept (protected) {uri}")
    print(
        f"{verb} {len(report.removed)} unpublished prefix(es), {report.bytes_freed} bytes; "
        f"kept {len(report.kept_recent)} recent, {len(report.kept_protected)} protected"
    )
    return 0


def add_commands(sub) -> None:
    storage = sub.add_parser(
        "storage",
        help="put/get/list artifacts on file:// or s3://, verify manifests, collect garbage",
        description="Artifacts on a local folder or S3. Folders are published with a manifest.json (sizes and "
        "sha256 of every file) written last; downloads check every digest. S3 credentials come from the standard "
        "AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...).",
    )
    verbs = storage.add_subparsers(dest="storage_command", metavar="VERB", required=True)

    p = verbs.add_parser("put", help="upload a file, or publish a folder as an artifact (manifest last)")
    p.add_argument("source", help="local file or folder")
    p.add_argument("dest", help=f"destination: {_URI_HELP}; for a folder, a new artifact prefix")
    p.add_argument("--producer", default=None, help="folder: recorded in the manifest (default: 'g2rpo storage put')")
    p.add_argument("--config-hash", default=None, help="folder: config hash recorded in the manifest")
    p.add_argument(
        "--unique",
        action="store_true",
        help="folder: publish under DEST-<UTC time>-<8 hex> (a fresh prefix) and print it",
    )
    _add_s3_options(p)
    p.set_defaults(handler=_put)

    p = verbs.add_parser("get", help="download an object, or an artifact (verifying every sha256)")
    p.add_argument("source", help=f"object or artifact: {_URI_HELP}")
    p.add_argument("dest", help="local file (object) or new folder (artifact)")
    _add_s3_options(p)
    p.set_defaults(handler=_get)

    p = verbs.add_parser("ls", help="list objects under a prefix (recursive)")
    p.add_argument("uri", help=_URI_HELP)
    _add_s3_options(p)
    p.set_defaults(handler=_ls)

    p = verbs.add_parser("verify", help="check an artifact against its manifest")
    p.add_argument("uri", help=f"artifact prefix: {_URI_HELP}")
    p.add_argument("--deep", action="store_true", help="also download and check every sha256")
    _add_s3_options(p)
    p.set_defaults(handler=_verify)

    p = verbs.add_parser(
        "gc",
        help="remove artifact prefixes whose upload never got a manifest",
        description="Remove prefixes under URI that started a publish but never got a manifest.json and have had "
        "no write for --older-than (on S3, also abort multipart uploads older than that). Published artifacts are "
        "never touched, nor the champions' artifacts of --registry and of every registry found under URI.",
    )
    p.add_argument("uri", help=f"root to scan: {_URI_HELP}")
    p.add_argument("--older-than", required=True, metavar="DURATION", help="e.g. 90s, 30m, 12h, 7d, 2w")
    p.add_argument(
        "--registry",
        action="append",
        metavar="URI",
        help="registry whose champions' artifacts are protected (repeatable; registries under URI are "
        "found automatically)",
    )
    p.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    _add_s3_options(p)
    p.set_defaults(handler=_gc)
