"""Step prepare: the split and both embedding caches on the tiny Flux, read back through g2rpo.data."""

from __future__ import annotations

import json

import pytest
import torch

from g2rpo.data import EmbeddingCache, read_prompt_split
from g2rpo.errors import G2RPOError
from g2rpo.models.loading import load_text_encoder
from g2rpo.steps.prepare import prepare_data

pytestmark = pytest.mark.integration

PROMPTS = ["a cat", "a dog", "a red car", "a blue boat", "a cat", "an old tree", "a tall tower"]


def test_prepare_data_splits_and_caches_both_splits(tiny_flux_dir, tmp_path):
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    result = prepare_data(
        str(src), (tmp_path / "prep").as_uri(), model_uri=str(tiny_flux_dir), test_size=2, seed=3, shard_rows=2
    )
    assert (result.read, result.duplicates, result.train, result.test, result.seed) == (7, 1, 4, 2, 3)
    assert result.output_dir == tmp_path / "prep" and result.manifest_path.is_file()
    train, test = read_prompt_split(result.train_prompts), read_prompt_split(result.test_prompts)
    assert sorted(train + test) == sorted(set(PROMPTS)) and (len(train), len(test)) == (4, 2)
    assert sorted(result.embeddings) == ["test", "train"]
    encoder = load_text_encoder(tiny_flux_dir, dtype="bfloat16")
    for split, prompts in (("train", train), ("test", test)):
        ref = result.embeddings[split]
        cache = EmbeddingCache(ref.path, verify=True)
        assert ref.count == len(cache) == len(prompts) and cache.prompts == prompts
        assert ref.shards == -(-len(prompts) // 2)  # two prompts a shard
        assert ref.manifest_path.is_file() and ref.dtype == "bfloat16"
        assert ref.total_bytes == sum(
            p.stat().st_size for p in ref.path.iterdir() if p.is_file() and p.name != "manifest.json"
        )
        expected = encoder.encode(prompts)
        got = cache.get(range(len(prompts)))
        assert ref.shapes["prompt_embeds"] == tuple(expected.prompt_embeds.shape[1:])
        assert ref.shapes["pooled_prompt_embeds"] == tuple(expected.pooled_prompt_embeds.shape[1:])
        assert torch.equal(got.prompt_embeds, expected.prompt_embeds)
        assert torch.equal(got.pooled_prompt_embeds, expected.pooled_prompt_embeds)


def test_prepare_data_without_a_model_writes_only_the_split(tmp_path):
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    result = prepare_data(str(src), tmp_path / "prep", test_size=0.25)
    assert (result.train, result.test) == (4, 2) and result.embeddings == {}
    assert sorted(p.name for p in result.output_dir.iterdir()) == ["manifest.json", "test.jsonl", "train.jsonl"]
    with pytest.raises(G2RPOError, match="already holds"):
        prepare_data(str(src), tmp_path / "prep", test_size=0.25)


def test_prepare_data_refuses_a_remote_output_and_a_missing_model_before_writing(tmp_path):
    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS) + "\n")
    with pytest.raises(G2RPOError, match=r"output='s3://b/prep': this step writes a local folder"):
        prepare_data(str(src), "s3://b/prep")
    with pytest.raises(G2RPOError, match="does not exist"):
        prepare_data(str(src), tmp_path / "prep", model_uri=str(tmp_path / "no-model"), test_size=2)
    assert not (tmp_path / "prep").exists()
