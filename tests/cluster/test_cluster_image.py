"""The component image, built by buildah from images/component.Dockerfile and run as what it is."""

from __future__ import annotations

import json
import subprocess

from tests.cluster.build import build
from tests.cluster.conftest import BASE_IMAGE

TAG = "localhost/g2rpo:cluster-test"


def test_the_component_image_builds_and_runs_the_cli_as_uid_10001(image_workdir, capsys):
    result = build(BASE_IMAGE, TAG, image_workdir / "build", image_workdir / "build.log")
    with capsys.disabled():
        print(f"\ncomponent image {TAG}: built in {result['seconds']} s, {result['bytes'] / 1e9:.2f} GB")
    probe = (
        "import json, os, kfp, torch; print(json.dumps({'uid': os.getuid(), 'kfp': kfp.__version__, "
        "'torch': torch.__version__}))"
    )
    done = subprocess.run(
        ["podman", "run", "--rm", "--read-only", "--network", "none", TAG, "python3", "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"uid": 10001, "kfp": "2.17.3", "torch": "2.14.1"}
    cli = subprocess.run(["podman", "run", "--rm", "--read-only", TAG], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "usage: g2rpo" in cli.stdout, cli.stdout + cli.stderr
