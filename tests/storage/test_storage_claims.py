"""A publish's claim carries its holder and a lease: a dead holder's claim is taken over by the retry, a
live publisher is never overtaken (the race itself: test_storage_manifest.py's
``test_storage_second_publish_to_a_claimed_prefix_is_refused_up_front``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from g2rpo.artifacts.manifest import MARKER_NAME, _iso, _now, verify
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main
from g2rpo.errors import G2RPOError

ROOT = Path(__file__).resolve().parents[2]


def _artifact(tmp_path: Path, name: str = "export") -> Path:
    src = tmp_path / name
    (src / "transformer").mkdir(parents=True)
    (src / "transformer" / "model.safetensors").write_bytes(os.urandom(4096))
    (src / "config.json").write_text('{"layers": 2}')
    return src


def _marker(uri: str) -> dict:
    return json.loads(open_store(uri).get_bytes(MARKER_NAME)[0])


@pytest.mark.integration
def test_a_publisher_killed_mid_upload_does_not_block_the_same_command(s3_env, tmp_path, capsys):
    # The issue's case on the real SeaweedFS server: `g2rpo storage put` is kill -9'd with one of its two
    # files uploaded and its claim on the prefix; the same command, run again, takes the claim over
    # (logged) and publishes, with no manual step. On main it was refused ("is being published by").
    src, uri, ready = _artifact(tmp_path), f"{s3_env.uri}/exports/v1", tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.publish_worker", str(src), uri, str(ready)], cwd=ROOT, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert worker.poll() is None, "the publisher ended before its upload"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        holder = _marker(uri)
        assert holder["pid"] == worker.pid and holder["lease_s"] > 0 and holder["token"]
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
    assert open_store(uri).exists(MARKER_NAME)  # the dead publisher's claim is still there

    assert main(["storage", "put", str(src), uri]) == 0
    err = capsys.readouterr().err
    assert f"taking over the publish claim of g2rpo storage put (pid {worker.pid} on" in err
    assert f"process {worker.pid} on this host is gone" in err
    verify(open_store(uri), deep=True)
    assert not open_store(uri).exists(MARKER_NAME)


def _foreign_claim(uri: str, renewed_seconds_ago: float, lease_s: float) -> None:
    """A claim written by a publisher on another machine that last renewed it that long ago."""
    renewed = _iso(_now() - timedelta(seconds=renewed_seconds_ago))
    marker = {
        "producer": "g2rpo pipeline train",
        "started_at": renewed,
        "renewed_at": renewed,
        "lease_s": lease_s,
        "host": "another-machine",
        "pid": 4242,
        "pid_started": "1",
        "token": "feedc0de",
    }
    open_store(uri).put_bytes(MARKER_NAME, json.dumps(marker).encode(), if_none_match=True)


def test_a_lapsed_lease_from_another_machine_is_taken_over(root_uri, tmp_path, capsys):
    uri = f"{root_uri}/lapsed"
    _foreign_claim(uri, renewed_seconds_ago=300, lease_s=120)
    publish_dir(_artifact(tmp_path), uri)
    assert (
        "taking over the publish claim of g2rpo pipeline train (pid 4242 on another-machine" in capsys.readouterr().err
    )
    verify(open_store(uri), deep=True)


def test_a_live_lease_from_another_machine_is_refused_saying_when_it_lapses(root_uri, tmp_path):
    uri = f"{root_uri}/live"
    _foreign_claim(uri, renewed_seconds_ago=5, lease_s=120)
    with pytest.raises(
        G2RPOError, match=r"is being published by g2rpo pipeline train \(pid 4242 on another-machine"
    ) as err:
        publish_dir(_artifact(tmp_path), uri)
    assert "its claim lapses 120 s after its last renewal" in str(err.value)
    assert _marker(uri)["token"] == "feedc0de"  # untouched


def test_a_live_publisher_renews_its_lease_and_is_never_overtaken(root_uri, tmp_path, monkeypatch):
    # Publish A, with a 2 s lease, is held inside its upload for 6 s (three lease periods): its renewals
    # keep the claim live, so B is refused — as a publisher on another machine would see it (no pid check).
    uri = f"{root_uri}/renewed"
    store_cls = type(open_store(uri))
    real_put_file = store_cls.put_file
    inside, release = threading.Event(), threading.Event()

    def put_file_paused(self, key, path, *, callback=None):
        inside.set()
        assert release.wait(30)
        return real_put_file(self, key, path, callback=callback)

    monkeypatch.setattr(store_cls, "put_file", put_file_paused)
    result: dict = {}
    first = threading.Thread(
        target=lambda: result.setdefault("a", publish_dir(_artifact(tmp_path, "a"), uri, lease_s=2.0))
    )
    first.start()
    try:
        assert inside.wait(30)
        started = _marker(uri)
        time.sleep(6.0)
        renewed = _marker(uri)
        assert renewed["renewed_at"] > started["renewed_at"] and renewed["token"] == started["token"]
        monkeypatch.setattr("g2rpo.artifacts.publish.socket.gethostname", lambda: "another-machine")
        with pytest.raises(G2RPOError, match="is being published by"):
            publish_dir(_artifact(tmp_path, "b"), uri)
    finally:
        release.set()
        first.join(30)
    assert "a" in result
    assert not open_store(uri).exists(MARKER_NAME)


@pytest.mark.parametrize("claim", [b"[1, 2]", b'{"producer": "g2rpo tr', b"\0\0\0\0"])
def test_a_claim_that_is_not_a_json_object_is_refused_naming_it_and_kept(tmp_path, claim):
    uri = str(tmp_path / "store" / "damaged")
    open_store(uri).put_bytes(MARKER_NAME, claim, if_none_match=True)
    with pytest.raises(G2RPOError, match=r"is being published by an unknown publisher \(its claim .* is not a JSON"):
        publish_dir(_artifact(tmp_path), uri)
    assert open_store(uri).get_bytes(MARKER_NAME)[0] == claim  # kept: `storage gc` removes it, as the error says


def test_a_claim_over_the_record_limit_is_refused_unread(root_uri, tmp_path):
    uri = f"{root_uri}/huge"
    open_store(uri).put_bytes(MARKER_NAME, b" " * 70_000 + b"{}", if_none_match=True)
    with pytest.raises(G2RPOError, match=r"_publishing\.json is 70,002 bytes, over the 65,536-byte limit"):
        publish_dir(_artifact(tmp_path), uri)


def test_a_claim_that_is_not_utf8_json_is_named_with_its_cause_and_never_taken_over(tmp_path):
    uri = str(tmp_path / "store" / "utf16")
    renewed = _iso(_now() - timedelta(hours=1))
    stale = {"producer": "g2rpo train", "renewed_at": renewed, "lease_s": 1.0, "host": "another-machine", "pid": 4242}
    claim = json.dumps(stale).encode("utf-16")  # a lapsed lease, in an encoding g2rpo never writes
    open_store(uri).put_bytes(MARKER_NAME, claim, if_none_match=True)
    with pytest.raises(
        G2RPOError,
        match=r"unknown publisher \(its claim .*_publishing\.json is not a JSON object g2rpo can read: is UTF-16 "
        r"\(it starts with a UTF-16 byte-order mark\), not UTF-8: claims are written whole",
    ):
        publish_dir(_artifact(tmp_path), uri)  # was read as UTF-16 and taken over
    assert open_store(uri).get_bytes(MARKER_NAME)[0] == claim
    cut = str(tmp_path / "store" / "cut")
    open_store(cut).put_bytes(MARKER_NAME, b'{"producer": "g2rpo tr', if_none_match=True)
    with pytest.raises(G2RPOError, match=r"g2rpo can read: line 1, column 14: not valid JSON .* it ends early"):
        publish_dir(_artifact(tmp_path, "other"), cut)
