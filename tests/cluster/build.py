"""Build the component image with buildah, pip pointed at the build machine's own package sources.

``images/component.Dockerfile`` takes two build arguments: ``BASE_IMAGE`` and ``PIP_CONFIG_FILE``.
:func:`pip_config` reads how pip is configured on this machine (``pip config list``: its config files and
``PIP_*`` variables, the later winning as pip itself does), writes one ``pip.conf`` from it, and lists the
local paths it names (``file://`` indexes, find-links folders, a constraint file, a CA bundle): each is
bind-mounted read-only into the build at the same path, so pip inside resolves exactly as pip outside.
Nothing here names a path of one machine; a machine whose pip uses only a remote index mounts nothing.

Run by hand from the repository root::

    python -m tests.cluster.build --base localhost/debian-py311:bookworm --tag localhost/g2rpo:dev WORKDIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "images" / "component.Dockerfile"
# Where the merged pip.conf is mounted inside the build (a path no base image uses).
PIP_CONF_IN_BUILD = "/opt/g2rpo-pip/pip.conf"
# pip options whose values are local paths or file:// URLs (space-separated lists for the URL ones).
PATH_OPTIONS = {"find-links", "extra-index-url", "index-url", "constraint", "requirement", "cert", "client-cert"}


def _pip_config_items() -> dict[str, str]:
    """pip's effective global options on this machine: ``key -> value`` (environment over files)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip().strip("'\"")
        section, _, option = key.rpartition(".")
        if section == ":env:":
            env[option] = value
        elif section in ("global", "install"):
            files[option] = value
    return {**files, **env}


def _local_paths(option: str, value: str) -> list[Path]:
    """The local files and folders one option's value names."""
    if option not in PATH_OPTIONS:
        return []
    out = []
    for word in value.split():
        path = urlparse(word).path if word.startswith("file:") else word if word.startswith("/") else None
        if path is None or not os.path.exists(path):
            continue
        path = Path(path)
        # A PEP 503 index folder ("…/simple") links its files relative to its parent: mount the parent.
        out.append(path.parent if path.name == "simple" else path)
    return out


def pip_config(workdir: Path) -> tuple[Path, list[Path]]:
    """Write ``workdir/pip.conf`` from this machine's pip configuration; return it and the local paths to mount."""
    items = _pip_config_items()
    conf = workdir / "pip.conf"
    workdir.mkdir(parents=True, exist_ok=True)
    conf.write_text("[global]\n" + "".join(f"{key} = {value}\n" for key, value in sorted(items.items())))
    mounts: list[Path] = []
    for option, value in items.items():
        for path in _local_paths(option, value):
            if not any(path == m or m in path.parents for m in mounts):
                mounts = [m for m in mounts if path not in m.parents] + [path]
    return conf, sorted(mounts)


def buildah_command(base: str, tag: str, workdir: Path) -> list[str]:
    """The ``buildah bud`` command that builds the component image from ``base`` as ``tag``."""
    conf, mounts = pip_config(workdir)
    command = ["buildah", "bud", "--layers", "--network", "host", "--runtime", "/usr/sbin/runc"]
    command += ["--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"PIP_CONFIG_FILE={PIP_CONF_IN_BUILD}"]
    command += ["--volume", f"{conf}:{PIP_CONF_IN_BUILD}:ro"]
    for path in mounts:
        command += ["--volume", f"{path}:{path}:ro"]
    return [*command, "-f", str(DOCKERFILE), "-t", tag, str(REPO)]


def image_size(tag: str) -> int:
    """The image's size in bytes as podman reports it."""
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def build(base: str, tag: str, workdir: Path, log: Path) -> dict:
    """Build; the log goes to ``log``. Returns ``{"seconds", "bytes"}``; raises with the log's tail on failure."""
    command = buildah_command(base, tag, workdir)
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"buildah bud failed ({done.returncode}) after {seconds:.0f} s; {log}:\n{tail}")
    return {"seconds": round(seconds, 1), "bytes": image_size(tag)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--base", default="python:3.11.14-slim-bookworm")
    parser.add_argument("--tag", default="localhost/g2rpo:dev")
    args = parser.parse_args(argv)
    result = build(args.base, args.tag, args.workdir, args.workdir / "build.log")
    print(f"{args.tag}: built in {result['seconds']} s, {result['bytes'] / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
