"""Fixtures of the step tests: a store root on file:// and on a real S3 server."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["file", "s3"])
def root_uri(request, tmp_path):
    """A fresh, empty root: a local folder as a file:// URI, or a prefix in a fresh bucket on SeaweedFS."""
    if request.param == "file":
        return (tmp_path / "root").as_uri()
    s3_env = request.getfixturevalue("s3_env")
    return f"{s3_env.uri}/root"
