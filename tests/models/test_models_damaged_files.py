"""A model folder's own JSON files, damaged (a model index or shard index that is not an object, a
safetensors header larger than the format allows, a marker cut short): refused naming the file, what is
wrong and the fix — never an AttributeError, a JSONDecodeError or a read of hundreds of MB (docs/errors.md)."""

from __future__ import annotations

import json
import shutil

import pytest

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.models.loading import SAFETENSORS_HEADER_MAX, base_model_record, check_model_dir
from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL, check_shapes_model
from g2rpo.models.tiny import TINY_MARKER

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


@pytest.fixture
def copy(tmp_path, monkeypatch):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "shapes-copy"
    shutil.copytree(SHIPPED_SHAPES_MODEL, folder)
    return folder


def test_a_model_index_that_is_not_an_object_is_named(copy):
    (copy / "model_index.json").write_text('["FluxPipeline"]')
    with pytest.raises(G2RPOError, match=r"model index .*model_index\.json.* holds an array where an object belongs"):
        check_model_dir(copy)


def test_a_safetensors_header_over_the_format_limit_is_not_read(copy):
    weights = copy / WEIGHTS
    n = SAFETENSORS_HEADER_MAX + 1
    with weights.open("wb") as handle:  # a sparse file: the header length fits inside it
        handle.write(n.to_bytes(8, "little"))
        handle.truncate(8 + n + 16)
    with pytest.raises(G2RPOError, match=r"not a readable safetensors file \(a 100,000,001-byte header, over the"):
        check_model_dir(copy, components=["transformer"])


def test_a_shard_index_without_a_map_of_file_names_is_named(copy):
    (copy / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text('{"weight_map": ["a", "b"]}')
    with pytest.raises(G2RPOError, match=r"unreadable shard index \(no 'weight_map' of file names\)"):
        check_model_dir(copy, components=["transformer"])


def test_a_damaged_marker_is_named(copy):
    marker = copy / TINY_MARKER
    marker.write_bytes(marker.read_bytes()[:10])  # cut short
    with pytest.raises(G2RPOError, match=r"shapes model marker .*: line \d+, column \d+: not valid JSON .*ends early"):
        check_shapes_model(copy)
    marker.write_text("[]")
    with pytest.raises(G2RPOError, match=r"model marker .* holds an array where an object belongs"):
        base_model_record(copy)


def test_validate_with_a_transformer_config_that_is_not_an_object_names_the_damage(copy, capsys):
    config = copy / "transformer" / "config.json"
    json.loads(config.read_text())  # it is an object now
    config.write_text("[]")
    code = main(["validate", "--config", "configs/tiny-cpu.yaml", f"model.path={copy}"])
    err = capsys.readouterr().err
    assert code == 2 and "transformer/config.json" in err and "Traceback" not in err
