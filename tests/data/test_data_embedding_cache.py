"""The sharded, memory-mapped text-embedding cache, with the tiny model's real text encoders."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from g2rpo.artifacts.manifest import SCHEMA_VERSION, read_manifest, write_dir_manifest
from g2rpo.artifacts.storage import FileStore, sha256_file
from g2rpo.cli import main
from g2rpo.data import EmbeddingCache, PromptEmbeddingDataset, write_embedding_cache
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration

PROMPTS = [
    "a photo of a cat",
    "a red car in the city at night",
    "an oil painting of a river",
    "portrait of an old man",
    "a small bird on a tree",
    "snow on the mountain",
    "digital art of a dragon",
]


@pytest.fixture(scope="module")
def encoder(tiny_flux_dir):
    from g2rpo.models.loading import load_text_encoder

    return load_text_encoder(tiny_flux_dir, dtype="float32")


@pytest.fixture
def cache_dir(tmp_path, encoder):
    out = tmp_path / "emb"
    # 7 prompts, 3 per shard → shards of 3, 3, 1 rows; batches of 2 straddle shard borders
    write_embedding_cache(out, PROMPTS, encoder, batch_size=2, shard_rows=3, encoder_source="tiny")
    return out


def test_data_cache_round_trip_equals_the_encoders(cache_dir, encoder):
    # the manifest every artifact carries: files with size + sha256, the cache's facts in metadata
    manifest = read_manifest(FileStore(cache_dir))
    shards = [f"shard-0000{i}.safetensors" for i in range(3)]
    assert manifest.schema_version == SCHEMA_VERSION and manifest.producer.startswith("g2rpo.data.")
    assert sorted(f.path for f in manifest.files) == ["index.json", *shards]
    assert all(f.sha256 == sha256_file(cache_dir / f.path)[1] for f in manifest.files)
    meta = manifest.metadata
    assert meta["count"] == 7 and meta["shards"] == shards and meta["kind"] == "flux-text-embeddings"
    assert meta["shapes"] == {"prompt_embeds": [32, 32], "pooled_prompt_embeds": [32]}
    assert meta["dtype"] == "float32" and meta["encoder"] == {"source": "tiny", "max_sequence_length": 32}
    cache = EmbeddingCache(cache_dir, verify=True)
    assert cache.manifest == manifest
    assert len(cache) == 7 and cache.prompts == PROMPTS and cache.max_sequence_length == 32
    direct = encoder.encode(PROMPTS)
    everything = cache.get(range(7))
    assert torch.equal(everything.prompt_embeds, direct.prompt_embeds)
    assert torch.equal(everything.pooled_prompt_embeds, direct.pooled_prompt_embeds)
    # any order, repeats allowed, across shards
    picked = cache.get(torch.tensor([6, 0, 3, 3]))
    assert torch.equal(picked.prompt_embeds, direct.prompt_embeds[[6, 0, 3, 3]])
    assert torch.equal(cache[4].pooled_prompt_embeds, direct.pooled_prompt_embeds[4:5])
    assert cache.index_of("snow on the mountain") == 5
    with pytest.raises(G2RPOError, match="not in the embedding cache"):
        cache.index_of("never seen")
    with pytest.raises(G2RPOError, match="0..6"):
        cache.get([7])


def test_data_cache_rows_land_in_the_index(cache_dir):
    from safetensors import safe_open

    index = json.loads((cache_dir / "index.json").read_text())
    # prompt i → shard i // 3, row i % 3
    assert index["entries"][4] == ["a small bird on a tree", 1, 1]
    with safe_open(str(cache_dir / "shard-00002.safetensors"), framework="pt") as f:
        assert f.get_slice("prompt_embeds").get_shape() == [1, 32, 32]
        assert f.metadata() == {"first_index": "6", "rows": "1"}


def test_data_cache_without_manifest_is_incomplete(cache_dir):
    (cache_dir / "manifest.json").unlink()  # what a killed writer leaves: shards, maybe an index, no manifest
    with pytest.raises(G2RPOError, match="incomplete: no manifest.json.*did not finish.*--overwrite"):
        EmbeddingCache(cache_dir)


def test_data_cache_damaged_files_are_refused(cache_dir):
    fix = r"rebuild it with `g2rpo data prep --model \.\.\. --overwrite`"
    shard = cache_dir / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[:-10]))  # truncated: the default open sees it
    with pytest.raises(G2RPOError, match=rf"does not match its manifest.*{fix}.*\n  - shard-00001.safetensors: size"):
        EmbeddingCache(cache_dir)
    data[-1] ^= 0xFF  # same size, one flipped byte: only the sha256 check sees it
    shard.write_bytes(bytes(data))
    EmbeddingCache(cache_dir)  # the cheap open checks sizes only
    with pytest.raises(G2RPOError, match=rf"{fix}.*\n  - shard-00001.safetensors: sha256 .*, manifest says"):
        EmbeddingCache(cache_dir, verify=True)
    (cache_dir / "shard-00000.safetensors").unlink()
    with pytest.raises(G2RPOError, match="shard-00000.safetensors: missing"):
        EmbeddingCache(cache_dir)


def test_data_cache_index_digest_is_checked_on_every_open(cache_dir):
    index = cache_dir / "index.json"
    text = index.read_text()
    index.write_text(text.replace("a photo of a cat", "a photo of a cow"))  # same size, other prompt
    with pytest.raises(G2RPOError, match="index.json: sha256 .*, manifest says"):
        EmbeddingCache(cache_dir)


def test_data_cache_in_another_format_is_refused_with_the_fix(cache_dir):
    # a manifest in the format before the shared one (or anything else): refused, not guessed at
    (cache_dir / "manifest.json").write_text(json.dumps({"schema_version": 1, "kind": "flux-text-embeddings"}))
    with pytest.raises(G2RPOError, match=r"no readable manifest.*--overwrite"):
        EmbeddingCache(cache_dir)


def test_data_cache_refuses_to_overwrite_then_rewrites(cache_dir, encoder):
    before = (cache_dir / "manifest.json").read_bytes()
    with pytest.raises(G2RPOError, match="not empty"):
        write_embedding_cache(cache_dir, PROMPTS[:2], encoder)
    assert (cache_dir / "manifest.json").read_bytes() == before
    write_embedding_cache(cache_dir, PROMPTS[:2], encoder, overwrite=True)
    cache = EmbeddingCache(cache_dir)
    assert len(cache) == 2 and not (cache_dir / "shard-00001.safetensors").exists()
    with pytest.raises(G2RPOError, match="duplicate"):
        write_embedding_cache(cache_dir, ["a", "a"], encoder, overwrite=True)


def test_data_dataset_loader_and_pickling(cache_dir):
    from torch.utils.data import DataLoader

    dataset = PromptEmbeddingDataset(cache_dir)
    item = dataset[2]
    assert (item.index, item.prompt, len(item.cond)) == (2, PROMPTS[2], 1)
    prompts, cond = dataset.batch([5, 1])
    assert prompts == [PROMPTS[5], PROMPTS[1]] and len(cond) == 2
    loader = DataLoader(dataset, batch_size=3, shuffle=False, collate_fn=PromptEmbeddingDataset.collate)
    batches = list(loader)
    assert [b[0] for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert torch.equal(batches[1][2].prompt_embeds, dataset.cache.get([3, 4, 5]).prompt_embeds)
    clone = pickle.loads(pickle.dumps(dataset.cache))  # open shard handles are not pickled
    assert torch.equal(clone[6].pooled_prompt_embeds, dataset.cache[6].pooled_prompt_embeds)


def test_data_prep_cli_with_model_builds_both_caches(tiny_flux_dir, tmp_path, capsys):
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS + PROMPTS[:2]) + "\n", encoding="utf-8")
    out = tmp_path / "prep"
    args = [
        "data",
        "prep",
        "--prompts",
        str(src),
        "--output",
        str(out),
        "--test-size",
        "2",
        "--model",
        str(tiny_flux_dir),
        "--dtype",
        "float32",
        "--shard-rows",
        "2",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "9 prompts read, 2 duplicate(s) dropped: 5 train, 2 test" in text
    assert "train: 5 embeddings in 3 shard(s)" in text
    train = EmbeddingCache(out / "embeddings" / "train", verify=True)
    test = EmbeddingCache(out / "embeddings" / "test")
    assert sorted(train.prompts + test.prompts) == sorted(PROMPTS)
    assert train.metadata["encoder"]["source"] == str(tiny_flux_dir)
    assert read_manifest(FileStore(out)).metadata["summary"]["train"] == 5  # the prompt split's own manifest


def test_data_prep_cli_with_a_partial_model_writes_nothing(tiny_flux_dir, tmp_path, capsys):
    # The model's text encoders are checked before the splits are written: a half-downloaded model
    # leaves no output behind (a re-run after fixing it would otherwise need --overwrite).
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_flux_dir, model)
    shutil.rmtree(model / "text_encoder_2")
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    out = tmp_path / "prep"
    args = ["data", "prep", "--prompts", str(src), "--output", str(out), "--test-size", "2", "--model", str(model)]
    assert main(args) == 2
    assert f"{model}/text_encoder_2: component folder missing" in capsys.readouterr().err
    assert not out.exists()


def _resealed_index(cache_dir, data: bytes) -> None:
    """``index.json`` replaced by ``data`` and the cache sealed again: a cache written so (its digest matches)."""
    manifest = read_manifest(FileStore(cache_dir))
    (cache_dir / "index.json").write_bytes(data)
    (cache_dir / "manifest.json").unlink()
    write_dir_manifest(
        cache_dir, producer=manifest.producer, metadata=manifest.metadata, names=[f.path for f in manifest.files]
    )


def test_data_cache_index_sealed_cut_or_mis_shaped_is_refused_with_the_fix(cache_dir):
    fix = r"rebuild it with `g2rpo data prep --model \.\.\. --overwrite`"
    text = (cache_dir / "index.json").read_bytes()
    _resealed_index(cache_dir, text[: len(text) // 2])
    with pytest.raises(
        G2RPOError,
        match=rf"embedding cache index '.*index\.json': line \d+, column \d+: not valid JSON .*ends early.*{fix}",
    ):
        EmbeddingCache(cache_dir)  # was a JSONDecodeError
    entries = [[p] for p in PROMPTS]  # no shard and row
    _resealed_index(cache_dir, json.dumps({"shard_rows": 3, "entries": entries}).encode())
    with pytest.raises(
        G2RPOError, match=rf"entries\[0\] is \[\"a photo of a cat\"\], not \[prompt, shard, row\]; {fix}"
    ):
        EmbeddingCache(cache_dir)  # was an IndexError
