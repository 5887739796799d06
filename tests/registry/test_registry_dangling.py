"""A champion never points at nothing: registering, promoting, rolling back to or aliasing a version
checks at that moment that its export is there and matches the manifest digest recorded with it
(every file present, with its size); on file:// and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import pytest
from registry_helpers import make_scores, register_version

from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration


def _gates(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("metrics:\n  hps: {direction: higher, domain: in, min_improvement: 0.01, floor: 0.2}\n")
    return gates


def _delete_export(registry: Registry, model: str, version: int) -> str:
    uri = registry.get_version(model, version).export.uri
    store = open_store(uri)
    store.delete_many([o.key for o in store.list()])
    return uri


def test_promote_refuses_a_version_whose_export_was_deleted(root_uri, tmp_path, capsys):
    reg_uri = f"{root_uri}/registry"
    registry = Registry(reg_uri)
    assert register_version(registry, "flux-shapes", root_uri, tmp_path, make_scores({"hps": 0.25}), "r1") == 1
    assert register_version(registry, "flux-shapes", root_uri, tmp_path, make_scores({"hps": 0.30}), "r2") == 2
    common = ["--registry", reg_uri, "--gates", str(_gates(tmp_path))]
    assert main(["registry", "promote", "flux-shapes", "1", *common]) == 0
    capsys.readouterr()
    export = _delete_export(registry, "flux-shapes", 2)
    assert main(["registry", "promote", "flux-shapes", "2", *common]) == 2
    err = capsys.readouterr().err
    assert "v2" in err and export in err and "manifest.json" in err
    state, _ = registry.read_state("flux-shapes")
    assert state.aliases["champion"] == 1  # unchanged
    # neither an alias nor a rollback may point at it
    with pytest.raises(G2RPOError, match="export"):
        registry.set_alias("flux-shapes", "champion", 2)
    assert registry.read_state("flux-shapes")[0].aliases["champion"] == 1


def test_an_export_changed_after_registration_is_refused(root_uri, tmp_path):
    registry = Registry(f"{root_uri}/registry")
    register_version(registry, "m", root_uri, tmp_path, make_scores({"hps": 0.25}), "r1")
    uri = registry.get_version("m", 1).export.uri
    store = open_store(uri)
    data, _ = store.get_bytes("manifest.json")
    store.put_bytes("manifest.json", data.replace(b"test-trainer", b"test-trainex"))  # another manifest
    with pytest.raises(G2RPOError, match=r"manifest\.json has sha256 .* recorded"):
        registry.set_alias("m", "champion", 1)
    store.put_bytes("manifest.json", data)
    store.delete("base_model.json")  # the manifest is intact, a file is gone
    with pytest.raises(G2RPOError, match=r"base_model\.json: missing"):
        registry.set_alias("m", "champion", 1)
    store.put_bytes("base_model.json", b'{"base": "black-forest-labs/FLUX.1-dev"}')
    registry.set_alias("m", "champion", 1)
    assert registry.read_state("m")[0].aliases["champion"] == 1


def test_register_refuses_an_export_missing_a_file(root_uri, tmp_path):
    from registry_helpers import publish_export

    from g2rpo.artifacts.promotion import eval_record_from_scores
    from g2rpo.artifacts.registry import BaseModelRef

    registry = Registry(f"{root_uri}/registry")
    export = publish_export(root_uri, tmp_path, "r9")
    open_store(export).delete("transformer/diffusion_pytorch_model.safetensors")
    scores = make_scores({"hps": 0.25})
    scores_uri, sha = registry.publish_scores("m", scores)
    with pytest.raises(G2RPOError, match=r"diffusion_pytorch_model\.safetensors: missing"):
        registry.register(
            "m",
            export_uri=export,
            eval_record=eval_record_from_scores(scores, scores_uri, sha),
            source_run="r9",
            config_hash="c",
            base_model=BaseModelRef(name="b", licence="l"),
        )
    assert registry.version_numbers("m") == []
