"""Training from an ``s3://`` base model (the pipeline's default ``base_model_uri`` is one): the model is
fetched once into the verified cache and trained exactly as from the local folder it was published from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_testlib import export_weights, run_train, tiny_overrides

from g2rpo.artifacts.publish import publish_dir
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("s3_model_tiny_flux"))


def test_a_run_trains_from_an_s3_model_as_from_its_local_folder(tiny_model, s3_env, tmp_path, monkeypatch):
    uri = f"{s3_env.uri}/models/tiny-flux"
    publish_dir(tiny_model, uri)
    cache = tmp_path / "cache"
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(cache))  # the image sets it; the run inherits it
    local = run_train(tiny_overrides(tiny_model, tmp_path / "local", **{"train.iterations": 2}))
    assert local.returncode == 0, local.stderr[-3000:]
    config = tiny_overrides(tiny_model, tmp_path / "remote", **{"train.iterations": 2, "model.path": uri})
    remote = run_train(config)
    assert remote.returncode == 0, remote.stderr[-3000:]
    (entry,) = (cache / "artifacts").iterdir()  # fetched once, keyed by its manifest's digest
    assert (entry / "transformer").is_dir()
    wa, wb = export_weights(tmp_path / "local"), export_weights(tmp_path / "remote")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    base = json.loads((tmp_path / "remote" / "export" / "base_model.json").read_text())
    # The export points at the model's URI, not at this pod's cache.
    assert base["base_model_record"]["location"] == uri, base
