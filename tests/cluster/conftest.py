"""The cluster tier (`make test-cluster`, marker ``cluster``): real builds and a real Kubernetes on this machine.

Skips, saying why, without ``../shared/tools/cluster`` beside the checkout, without root, or without the
Debian packages its README lists (podman, buildah, runc, containerd, etcd, mmdebstrap).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from components.images import G2RPO_IMAGE
from tests.cluster.build import build
from tests.shared_checkout import shared_path

CLUSTER = shared_path("tools/cluster")
BASE_IMAGE = "localhost/debian-py311:bookworm"
COMPONENT_TAG = "localhost/g2rpo:cluster-test"
PACKAGES = ("podman", "buildah", "runc", "containerd", "etcd", "mmdebstrap")


def _missing() -> str | None:
    if not (CLUSTER / "cluster").is_file():
        return f"../shared/tools/cluster is not beside this checkout ({CLUSTER})"
    if os.geteuid() != 0:
        return "the cluster tier runs as root (containerd, kubelet, podman's root storage)"
    absent = [name for name in PACKAGES if shutil.which(name) is None]
    if absent:
        return f"missing Debian packages {absent}: see ../shared/tools/cluster/README.md"
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
    result = build(BASE_IMAGE, COMPONENT_TAG, image_workdir / "build", image_workdir / "build.log")
    subprocess.run(["podman", "tag", COMPONENT_TAG, G2RPO_IMAGE], check=True)
    print(f"\ncomponent image {COMPONENT_TAG}: built in {result['seconds']} s, {result['bytes'] / 1e9:.2f} GB")
    return {"tag": COMPONENT_TAG, **result}
