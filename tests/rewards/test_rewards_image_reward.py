"""ImageReward on transformers BLIP parts, loaded from a tiny ``ImageReward.pt`` in the published
(reference-module) key layout. Numerical agreement with the ``image-reward`` package itself is
the parity test's job (tests/fixtures/parity/image_reward); these tests check the loading
contract, the tokenizer, the head's arithmetic and the errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.image_reward import (
    IGNORED_KEYS,
    REWARD_MEAN,
    REWARD_STD,
    ImageReward,
    map_image_reward_keys,
)
from g2rpo.rewards.tiny import tiny_bert_vocab, to_reference_image_reward_keys

PROMPTS = ["a cat sitting on a red chair", "a photo of a mountain at night"]


def _load(paths, **kw):
    return ImageReward.from_checkpoint(
        paths["checkpoint"],
        med_config=paths["med_config"],
        vision_config=paths["vision_config"],
        tokenizer_dir=paths["tokenizer_dir"],
        **kw,
    )


def test_every_published_key_is_mapped_or_explicitly_ignored(tiny_image_reward):
    state = torch.load(tiny_image_reward["checkpoint"], weights_only=True)
    assert "blip.visual_encoder.blocks.0.attn.qkv.weight" in state  # the reference layout
    mapped, unmapped = map_image_reward_keys(state)
    assert unmapped == []
    ignored = len(state) - len(mapped)
    assert ignored == 5  # vision_proj.{weight,bias}, text_proj.{weight,bias}, position_ids
    head = _load(tiny_image_reward)
    loaded = head.net.state_dict()
    assert set(loaded) == set(mapped)
    assert all(torch.equal(mapped[k].to(loaded[k].dtype), loaded[k]) for k in mapped)
    # the writer's inverse table and KEY_RULES are inverses on the whole model
    published = {k for k in state if not any(re.match(p, k) for p in IGNORED_KEYS)}
    assert to_reference_image_reward_keys(loaded).keys() == published


def test_tokenizer_is_bert_with_blip_special_tokens_and_35_tokens(tiny_image_reward):
    head = _load(tiny_image_reward)
    vocab = tiny_bert_vocab()
    ids = head.tokenizer(["a cat"], padding="max_length", truncation=True, max_length=35).input_ids[0]
    # [CLS] a cat [SEP] then [PAD] (id 0) up to 35: ids are line numbers in vocab.txt
    expected = [vocab.index("[CLS]"), vocab.index("a"), vocab.index("cat"), vocab.index("[SEP]")] + [0] * 31
    assert ids == expected
    assert head.tokenizer.convert_tokens_to_ids(["[DEC]", "[ENC]"]) == [len(vocab), len(vocab) + 1]


def test_score_is_the_standardised_mlp_of_the_cls_output(tiny_image_reward):
    head = _load(tiny_image_reward)
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    scores = head.score(images, PROMPTS)
    from g2rpo.rewards.base import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, normalize

    net = head.net
    with torch.no_grad():
        tokens = head.tokenizer(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
        image_embeds = net.vision(pixel_values=normalize(images, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)).last_hidden_state
        h = net.text(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long),
            is_decoder=False,
        ).last_hidden_state[:, 0]
        r = net.head(h).squeeze(-1)
    torch.testing.assert_close(scores, (r - REWARD_MEAN) / REWARD_STD, rtol=0, atol=1e-6)
    # cross-attention is live: the same prompt scores differently on different images
    same = head.score(images, [PROMPTS[0]] * 2)
    assert float((same[0] - same[1]).abs()) > 0


def test_standardisation_uses_the_published_constants(tiny_image_reward):
    # The published constants (ImageReward/ImageReward.py: self.mean, self.std).
    assert (REWARD_MEAN, REWARD_STD) == (0.16717362830052426, 1.0333394966054072)
    # Hand-worked: with the MLP's last layer zeroed and its bias set to b, the raw reward is
    # r = b for every input, so the score is (b − mean) / std: b = mean → 0, b = mean + std → 1,
    # b = mean − 2·std → −2.
    head = _load(tiny_image_reward)
    last = head.net.head.layers[-1]
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        last.weight.zero_()
        for bias, expected in (
            (REWARD_MEAN, 0.0),
            (REWARD_MEAN + REWARD_STD, 1.0),
            (REWARD_MEAN - 2 * REWARD_STD, -2.0),
        ):
            last.bias.fill_(bias)
            torch.testing.assert_close(head.score(images, PROMPTS), torch.full((2,), expected), rtol=0, atol=1e-6)


def test_batched_equals_one_at_a_time(tiny_image_reward):
    head = _load(tiny_image_reward)
    images = torch.rand(2, 3, 40, 48, generator=torch.Generator().manual_seed(1))
    batched = head.score(images, PROMPTS)
    single = torch.cat([head.score(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(batched, single, rtol=0, atol=1e-5)


def test_config_dicts_equal_config_files(tiny_image_reward):
    a = _load(tiny_image_reward).score(
        torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2)), PROMPTS[:1]
    )
    b = ImageReward.from_checkpoint(
        tiny_image_reward["checkpoint"],
        med_config=json.loads(tiny_image_reward["med_config"].read_text()),
        vision_config=json.loads(tiny_image_reward["vision_config"].read_text()),
        tokenizer_dir=tiny_image_reward["tokenizer_dir"],
    ).score(torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2)), PROMPTS[:1])
    assert torch.equal(a, b)


def test_unexpected_and_missing_keys_are_listed(tiny_image_reward, tmp_path):
    state = torch.load(tiny_image_reward["checkpoint"], weights_only=True)
    state["blip.visual_encoder.head.weight"] = torch.zeros(3)  # matches no rule
    del state["mlp.layers.7.bias"]
    bad = tmp_path / "ImageReward.pt"
    torch.save(state, bad)
    with pytest.raises(G2RPOError) as err:
        _load({**tiny_image_reward, "checkpoint": bad})
    message = str(err.value)
    assert "1 missing key(s): head.layers.7.bias" in message
    assert "1 unexpected key(s): blip.visual_encoder.head.weight" in message


def test_wrong_vision_config_is_a_shape_error(tiny_image_reward):
    vision = json.loads(tiny_image_reward["vision_config"].read_text())
    vision["intermediate_size"] = 96
    with pytest.raises(G2RPOError, match="wrong shape"):
        _load({**tiny_image_reward, "vision_config": vision})
    with pytest.raises(G2RPOError, match="unknown keys"):
        _load({**tiny_image_reward, "vision_config": {**vision, "depth": 2}})


def test_missing_files_are_errors(tiny_image_reward, tmp_path):
    with pytest.raises(G2RPOError, match="image_reward.weights=.*does not exist"):
        _load({**tiny_image_reward, "checkpoint": tmp_path / "none.pt"})
    with pytest.raises(G2RPOError, match="image_reward.tokenizer_dir=.*does not exist"):
        _load({**tiny_image_reward, "tokenizer_dir": tmp_path / "none"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(G2RPOError, match="vocab.txt"):
        _load({**tiny_image_reward, "tokenizer_dir": tmp_path / "empty"})
    med = json.loads(tiny_image_reward["med_config"].read_text())
    del med["hidden_size"]
    with pytest.raises(G2RPOError, match="missing BERT keys"):
        _load({**tiny_image_reward, "med_config": med})


@pytest.mark.slow
def test_full_size_image_reward_layout_loads_and_scores(tmp_path, tiny_image_reward):
    """BLIP ViT-L/16 @ 224 + BERT-base with cross-attention (ImageReward's published sizes, random
    weights, ≈ 450 M parameters) saved in the published key layout, loaded with the defaults."""
    from g2rpo.rewards.image_reward import ImageRewardNet

    # BLIP's med_config.json as ImageReward publishes it (train/src/config/med_config.json)
    med = {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "vocab_size": 30524,
        "encoder_width": 768,
        "add_cross_attention": True,
    }
    net = ImageRewardNet(med)  # vision_config None → BLIP_LARGE_VISION
    state = to_reference_image_reward_keys(net.state_dict())
    state["blip.vision_proj.weight"] = torch.zeros(256, 1024)
    state["blip.vision_proj.bias"] = torch.zeros(256)
    state["blip.text_proj.weight"] = torch.zeros(256, 768)
    state["blip.text_proj.bias"] = torch.zeros(256)
    torch.save(state, tmp_path / "ImageReward.pt")
    del net, state
    head = ImageReward.from_checkpoint(
        tmp_path / "ImageReward.pt", med_config=med, tokenizer_dir=tiny_image_reward["tokenizer_dir"]
    )
    assert head.net.image_size == 224 and len(head.net.vision.encoder.layers) == 24
    scores = head.score(torch.rand(2, 3, 256, 320), PROMPTS)
    assert scores.shape == (2,) and bool(torch.isfinite(scores).all())
