"""The cluster tier (`make test-cluster`, marker ``cluster``): real builds and a real Kubernetes on this machine.

Skips, saying why, without ``../shared/tools/cluster`` beside the checkout, without root, or without the
Debian packages its README lists (podman, buildah, runc, containerd, etcd, mmdebstrap).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from components.images import G2RPO_IMAGE
from tests.cluster.build import build
from tests.cluster.deploy import deployed
from tests.cluster.kfp_backend import KFP_DIR
from tests.shared_checkout import shared_path

CLUSTER = shared_path("tools/cluster")
BASE_IMAGE = "localhost/debian-py311:bookworm"
COMPONENT_TAG = "localhost/g2rpo:cluster-test"
PACKAGES = ("podman", "buildah", "runc", "containerd", "etcd", "mmdebstrap", "mariadbd")
# The label images/component.Dockerfile puts on every layer after its LABEL line.
IMAGE_LABEL = "org.opencontainers.image.title=g2rpo"
# Free disk the tier needs from nothing, in GB (measured: docs/cluster.md); `.ci/run` checks the same figure.
DISK_GB = float(os.environ.get("G2RPO_CLUSTER_DISK_GB", "30"))


def free_gb(path: str) -> float:
    """Free space, in GB, on the filesystem holding ``path`` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free / 1e9


def need_disk(gb: float, what: str) -> None:
    """Fail at once, saying how much is free where, rather than at a full disk halfway through a build."""
    places = {p: free_gb(p) for p in ("/var/lib/containers", os.environ.get("TMPDIR", "/tmp"))}
    short = {p: f for p, f in places.items() if f < gb}
    if short:
        pytest.fail(
            f"{what} need about {gb:.0f} GB free; "
            + ", ".join(f"{p} has {f:.1f} GB" for p, f in short.items())
            + " (podman image prune; or set G2RPO_CLUSTER_DISK_GB if you know this machine needs less)"
        )


# `cluster up` joins its namespace to the host by a /30 in this range (its README): the S3 server the pods use
# listens on the host side of it, and this tier's host-side checks read that S3. Nothing else leaves loopback.
CLUSTER_LINKS = ipaddress.ip_network("172.29.0.0/16")
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _local(address) -> bool:
    if not isinstance(address, tuple):
        return True  # AF_UNIX
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return address[0] == "localhost"
    return ip.is_loopback or ip in CLUSTER_LINKS


def _guarded(real):
    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address):
            raise ConnectionRefusedError(
                f"test tried to reach {address!r}: the cluster tier may use loopback and {CLUSTER_LINKS} only"
            )
        return real(self, address)

    return connect


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """The suite's guard (tests/conftest.py), widened to the test cluster's veth link and nothing more."""
    monkeypatch.setattr(socket.socket, "connect", _guarded(_real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded(_real_connect_ex))
    yield


def _missing() -> str | None:
    if not (CLUSTER / "cluster").is_file():
        return f"../shared/tools/cluster is not beside this checkout ({CLUSTER})"
    if not (KFP_DIR / "kfp").is_file():
        return f"../shared/tools/kfp (Argo and KFP's backend) is not beside this checkout ({KFP_DIR})"
    if os.geteuid() != 0:
        return "the cluster tier runs as root (containerd, kubelet, podman's root storage)"
    absent = [name for name in PACKAGES if shutil.which(name) is None]
    if absent:
        return (
            f"missing commands {absent}: as root, apt-get update && apt-get install -y --no-install-recommends "
            "podman buildah runc containerd containernetworking-plugins mmdebstrap iptables etcd-server mariadb-server "
            "(../shared/tools/cluster/README.md; mariadb-server: the KFP API server's database)"
        )
    return None


def pytest_collection_modifyitems(items):
    reason = _missing()
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def image_workdir(tmp_path_factory) -> Path:
    """A folder with containers.conf for this machine and the base image in podman's storage."""
    workdir = Path(os.environ.get("G2RPO_CLUSTER_WORKDIR") or tmp_path_factory.mktemp("cluster")) / "img"
    env = {**os.environ}
    exists = subprocess.run(["podman", "image", "exists", BASE_IMAGE], env=env).returncode == 0
    subprocess.run(
        [str(CLUSTER / "build-base-image"), str(workdir)],
        env={**env, "CONF_ONLY": "1" if exists else "0"},
        check=True,
        timeout=900,
    )
    os.environ["CONTAINERS_CONF"] = str(workdir / "containers.conf")
    return workdir


@pytest.fixture(scope="session")
def component_image(image_workdir) -> dict:
    """The component image built once per session (buildah, ``tests/cluster/build.py``) and also tagged with the
    name the compiled pipeline and the chart use (``components.images.G2RPO_IMAGE``); ``{"tag", "seconds", "bytes"}``."""
    need_disk(DISK_GB, "the component image (6.5 GB) and the cluster's copy of it")
    result = build(BASE_IMAGE, COMPONENT_TAG, image_workdir / "build", image_workdir / "build.log")
    subprocess.run(["podman", "tag", COMPONENT_TAG, G2RPO_IMAGE], check=True)
    # Earlier builds of this image, untagged by this one (their layers above torch's): this tier's own leftovers.
    subprocess.run(["podman", "image", "prune", "--force", "--filter", f"label={IMAGE_LABEL}"], check=True)
    print(f"\ncomponent image {COMPONENT_TAG}: built in {result['seconds']} s, {result['bytes'] / 1e9:.2f} GB")
    return {"tag": COMPONENT_TAG, **result}


@pytest.fixture(scope="session")
def deployment(component_image, tmp_path_factory):
    """One cluster for the session with the chart installed (:func:`tests.cluster.deploy.deployed`); down at the end."""
    workdir = Path(os.environ.get("G2RPO_CLUSTER_WORKDIR") or tmp_path_factory.mktemp("k8s")) / "k"
    yield from deployed(workdir)
