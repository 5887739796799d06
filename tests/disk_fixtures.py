"""Real filesystems that fail writes: a full one (a small tmpfs) and a read-only one (a read-only
tmpfs). Both need root and ``mount``; a test using them is skipped elsewhere. Root writes through
permission bits, so a chmod'ed folder is no read-only folder for root: a read-only mount is."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs mount needs root and mount")
    mnt.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}")
    try:
        yield mnt
    finally:
        # A file the test left open keeps the mount busy, and a plain umount then fails silently (the mount
        # outlived every run); a lazy one detaches it now and frees it when the last handle closes.
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mnt)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs."""
    yield from _mount_tmpfs(tmp_path / "disk", "size=2m")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty folder on a read-only tmpfs (writes fail with EROFS, for root too)."""
    yield from _mount_tmpfs(tmp_path / "ro", "ro,size=1m")
