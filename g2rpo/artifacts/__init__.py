"""Artifacts: ``file://`` and ``s3://`` storage, manifests, the model registry and promotion gates."""
