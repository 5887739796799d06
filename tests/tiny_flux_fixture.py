"""The tiny Flux pipeline for every test area (real diffusers/transformers classes, seeded weights).

Registered as a plugin (``pytest_plugins = ["tests.tiny_flux_fixture"]``); then a test asks for
the session fixture ``tiny_flux_dir``: a directory written by ``g2rpo model init-tiny`` (the same
``save_pretrained`` layout as FLUX.1-dev), built once per session (~1 s). Load it through
``g2rpo.models.loading`` or ``FluxPipeline.from_pretrained(dir, local_files_only=True)``; do not
write into it. Other code can call :func:`make_tiny_flux` directly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_FLUX_SEED = 0


def make_tiny_flux(directory: str | Path, seed: int = TINY_FLUX_SEED) -> Path:
    """Write the tiny Flux pipeline (``g2rpo.models.tiny.save_tiny_flux``) into ``directory``."""
    from g2rpo.models.tiny import save_tiny_flux

    return save_tiny_flux(directory, seed=seed)


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory) -> Path:
    """A saved tiny ``FluxPipeline`` directory (seed 0, 64×64 images, T5 length 32), read-only."""
    return make_tiny_flux(tmp_path_factory.mktemp("tiny_flux"))
