"""The tiny Flux pipeline for every test area (real diffusers/transformers classes, seeded weights).

Registered as a plugin (``pytest_plugins = ["tests.tiny_flux_fixture"]``); then a test asks for
the session fixture ``tiny_flux_dir``: a directory written by ``g2rpo model init-tiny`` (the same
``save_pretrained`` layout as FLUX.1-dev), built once per session (~1 s). Load it through
``g2rpo.models.loading`` or ``FluxPipeline.from_pretrained(dir, local_files_only=True)``; do not
write into it. Other code can call :func:`make_tiny_flux` directly.

``quick_shapes_dir`` is the shapes model (:mod:`g2rpo.models.shapes`) pretrained with
:func:`quick_shapes`' few steps (seconds; the shipped settings take minutes): the demo's and the
local pipeline's model, for tests that need its architecture and vocabulary, not its skill. Pass
:data:`QUICK_SHAPES_FLAGS` (or ``pretraining=quick_shapes()``) with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_FLUX_SEED = 0
QUICK_SHAPES_STEPS = {"vae_steps": 2, "flow_steps": 2}
QUICK_SHAPES_FLAGS = ("--pretrain-vae-steps", "2", "--pretrain-flow-steps", "2")


def make_tiny_flux(directory: str | Path, seed: int = TINY_FLUX_SEED) -> Path:
    """Write the tiny Flux pipeline (``g2rpo.models.tiny.save_tiny_flux``) into ``directory``."""
    from g2rpo.models.tiny import save_tiny_flux

    return save_tiny_flux(directory, seed=seed)


@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory) -> Path:
    """A saved tiny ``FluxPipeline`` directory (seed 0, 64×64 images, T5 length 32), read-only."""
    return make_tiny_flux(tmp_path_factory.mktemp("tiny_flux"))


@pytest.fixture(scope="session")
def quick_shapes_dir(tmp_path_factory) -> Path:
    """The shapes model pretrained with :func:`quick_shapes`' settings (a few seconds), read-only."""
    from g2rpo.models.shapes import pretrain_shapes

    return pretrain_shapes(tmp_path_factory.mktemp("quick_shapes") / "shapes-flux", quick_shapes())


def quick_shapes():
    """The demo's model's pretraining settings (``UNSEEN_PRETRAINING``: what ``run-local``'s flags default
    to) with :data:`QUICK_SHAPES_STEPS`."""
    from dataclasses import replace

    from g2rpo.models.shapes import UNSEEN_PRETRAINING

    return replace(UNSEEN_PRETRAINING, **QUICK_SHAPES_STEPS)
