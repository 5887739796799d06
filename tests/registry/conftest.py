"""Fixtures of the registry tests: every flow runs on file:// and on a real S3 server."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["file", "s3"])
def root_uri(request, tmp_path):
    """A fresh, empty root: a local folder, or a prefix in a fresh bucket on SeaweedFS."""
    if request.param == "file":
        return str(tmp_path / "root")
    s3_env = request.getfixturevalue("s3_env")
    return f"{s3_env.uri}/root"
