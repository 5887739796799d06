"""The component image, built by buildah from images/component.Dockerfile and run as what it is."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def pinned(package: str) -> str:
    return re.search(rf"^{package}==(\S+)$", CONSTRAINTS.read_text(), re.MULTILINE).group(1)


def test_the_component_image_builds_and_runs_the_cli_as_uid_10001(component_image):
    tag = component_image["tag"]
    probe = (
        "import json, os, pathlib, kfp, torch; print(json.dumps({'uid': os.getuid(), 'kfp': kfp.__version__, "
        "'torch': torch.__version__, 'config': pathlib.Path('configs/flux-dev-h200.yaml').is_file()}))"
    )
    done = subprocess.run(
        ["podman", "run", "--rm", "--read-only", "--network", "none", tag, "python3", "-c", probe],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # PyPI's torch wheel reports its CUDA build as a local version label ("2.14.1+cu130"): the pin is the public part.
    found["torch"] = found["torch"].partition("+")[0]
    assert found == {
        "uid": 10001,
        "kfp": pinned("kfp"),
        "torch": pinned("torch"),
        "config": True,  # the pipeline's default config_uri resolves in the tasks' working directory
    }, done.stdout
    cli = subprocess.run(["podman", "run", "--rm", "--read-only", tag], capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0 and "usage: g2rpo" in cli.stdout, cli.stdout + cli.stderr
