"""UnifiedReward on a tiny Qwen2.5-VL judge whose tokenizer and processor are built offline: the
expectation against a hand computation from the model's logits, left-padded batches equal to
single calls, the generate mode on a judge programmed to answer, strict loading, the registry."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

from g2rpo.errors import ConfigError, G2RPOError
from g2rpo.rewards.config import RewardModelConfig
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.unified_reward import SCORING_PROMPT, UnifiedReward, parse_score

PROMPTS = ["a cat", "a photo of a small dog sitting on a red chair in the garden"]


def _images(n=2, h=32, w=48, seed=0):
    return torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _copy_processor_files(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, dst / path.name)


def _hand_expectation(head, image, prompt):
    """Σ v·p over the tokens "1".."5" at the last position, built without the head's own code path."""
    processor, tokenizer = head.processor, head.processor.tokenizer
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": SCORING_PROMPT.format(prompt=prompt)}]}
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "Final Score: "
    inputs = processor(text=[text], images=[image], return_tensors="pt", do_rescale=False)
    tail = tokenizer.convert_ids_to_tokens(inputs.input_ids[0, -4:].tolist())
    assert tail == ["Final", "ĠScore", ":", "Ġ"]  # the answer position follows "Final Score: "
    with torch.no_grad():
        logits = head.model(**inputs).logits[0, -1]  # [V]
    ids = [tokenizer.convert_tokens_to_ids(str(v)) for v in range(1, 6)]
    probs = torch.softmax(logits[ids], dim=0)
    return sum(v * float(p) for v, p in zip(range(1, 6), probs, strict=True)), probs


def test_expectation_equals_a_hand_computation_from_the_logits(tiny_unified_reward):
    head = UnifiedReward.from_pretrained_dir(tiny_unified_reward["dir"])
    images = _images()
    scores = head.score(images, PROMPTS)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    for i in range(2):
        expected, probs = _hand_expectation(head, images[i], PROMPTS[i])
        assert float(probs.max() - probs.min()) > 0.2  # not a uniform distribution (which gives 3.0)
        assert abs(scores[i].item() - expected) < 1e-5
        assert 1.0 <= scores[i].item() <= 5.0
    torch.testing.assert_close(head.score_probabilities(images, PROMPTS).sum(-1), torch.ones(2))
    assert torch.equal(head.score(images, PROMPTS), scores)  # deterministic


def test_a_left_padded_batch_equals_single_calls(tiny_unified_reward):
    head = UnifiedReward.from_pretrained_dir(tiny_unified_reward["dir"])
    images = _images(seed=1)
    batch = head.inputs(images, PROMPTS, prefill=True)
    mask = batch["attention_mask"]
    short = int(mask[0].sum())
    assert short < mask.shape[1] and int(mask[1].sum()) == mask.shape[1]  # the prompts differ in length
    assert mask[0, : mask.shape[1] - short].eq(0).all() and mask[0, -short:].eq(1).all()  # padded on the left
    together = head.score(images, PROMPTS)
    alone = torch.cat([head.score(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(2)])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    assert abs(float(together[0] - together[1])) > 1e-3  # two different inputs, two different scores


def _programmed_judge(src, dst, answer="4"):
    """The tiny judge rewired to answer "Final Score: <answer>": attention and MLP outputs zeroed, so
    the last hidden state is the normalised embedding of the last token, and the output layer maps
    each token of the chain to the next one."""
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(src), local_files_only=True)
    tokenizer = AutoProcessor.from_pretrained(str(src), local_files_only=True).tokenizer
    chain = ["Ċ", "Final", "ĠScore", ":", "Ġ", answer, "<|im_end|>"]
    ids = tokenizer.convert_tokens_to_ids(chain)
    lm = model.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        lm.norm.weight.fill_(1.0)
        embed, out = lm.embed_tokens.weight, model.lm_head.weight
        out.zero_()
        for k, (token, successor) in enumerate(zip(ids[:-1], ids[1:], strict=True)):
            embed[token] = torch.nn.functional.one_hot(torch.tensor(k), embed.shape[1]).float()
            out[successor] = 10.0 * embed[token]
    model.save_pretrained(dst)
    _copy_processor_files(src, dst)
    return dst


def test_generate_mode_parses_the_judges_answer(tiny_unified_reward, tmp_path):
    folder = _programmed_judge(tiny_unified_reward["dir"], tmp_path / "judge")
    head = UnifiedReward.from_pretrained_dir(folder, mode="generate", max_new_tokens=12)
    images = _images(seed=2)
    assert head.generate_texts(images, PROMPTS) == ["Final Score: 4", "Final Score: 4"]
    assert head.score(images, PROMPTS).tolist() == [4.0, 4.0]
    # the same judge in expectation mode puts (almost) all the mass on "4"
    expectation = UnifiedReward.from_pretrained_dir(folder).score(images, PROMPTS)
    torch.testing.assert_close(expectation, torch.full((2,), 4.0), rtol=0, atol=1e-3)


def test_generate_mode_without_a_score_gives_nan_reported_by_name(tiny_unified_reward, caplog):
    head = UnifiedReward.from_pretrained_dir(tiny_unified_reward["dir"], mode="generate", max_new_tokens=3)
    with caplog.at_level("WARNING", logger="g2rpo.rewards"):
        scores = head.score(_images(), PROMPTS)
    assert bool(torch.isnan(scores).all())  # three random tokens hold no "Final Score:"
    assert "reward 'unified_reward' returned NaN/inf for 2 of 2 image(s)" in caplog.text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("The cat is shown (1).\nFinal Score: 4", 4.0),
        ("final score: **3**", 3.0),
        ("Final Score: 2.5", 2.5),
        ("Final Score: 1 ... on reflection, Final Score: 5", 5.0),
        ("Final Score: 7", math.nan),
        ("Score 4", math.nan),
        ("", math.nan),
    ],
)
def test_parse_score(text, value):
    got = parse_score(text)
    assert (math.isnan(got) and math.isnan(value)) or got == value


def test_missing_or_partial_weights_are_refused(tiny_unified_reward, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tiny_unified_reward["dir"]
    empty = tmp_path / "no_weights"
    _copy_processor_files(src, empty)
    with pytest.raises(G2RPOError, match=r"unified_reward.weights=.*holds no weights \(\*\.safetensors\)"):
        UnifiedReward.from_pretrained_dir(empty)
    partial = tmp_path / "partial"
    _copy_processor_files(src, partial)
    state = load_file(src / "model.safetensors")
    dropped = next(k for k in state if "layers.1.mlp.up_proj" in k)
    del state[dropped]
    save_file(state, partial / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(G2RPOError, match=r"1 missing key\(s\): .*layers\.1\.mlp\.up_proj\.weight"):
        UnifiedReward.from_pretrained_dir(partial)
    no_template = tmp_path / "no_template"
    _copy_processor_files(src, no_template)
    shutil.copy(src / "model.safetensors", no_template / "model.safetensors")
    (no_template / "chat_template.jinja").unlink()
    with pytest.raises(G2RPOError, match="chat template"):
        UnifiedReward.from_pretrained_dir(no_template)
    with pytest.raises(G2RPOError, match="does not exist"):
        UnifiedReward.from_pretrained_dir(tmp_path / "nowhere")


def test_built_from_config_and_listed(tiny_unified_reward, capsys):
    folder = str(tiny_unified_reward["dir"])
    head = build_reward(RewardModelConfig(name="unified_reward", weights=folder))
    assert isinstance(head, UnifiedReward) and head.mode == "expectation"
    images = _images(seed=3)
    direct = UnifiedReward.from_pretrained_dir(folder)
    assert torch.equal(head.score(images, PROMPTS), direct.score(images, PROMPTS))
    generate = build_reward(
        RewardModelConfig(name="unified_reward", weights=folder, tokenizer=folder, mode="generate", max_new_tokens=4)
    )
    assert (generate.mode, generate.max_new_tokens) == ("generate", 4)
    with pytest.raises(G2RPOError, match="unified_reward.weights=None: 'unified_reward' needs weights: Qwen2.5-VL"):
        build_reward(RewardModelConfig(name="unified_reward"))
    with pytest.raises((ConfigError, ValueError), match="'clip' does not use it"):
        RewardModelConfig(name="clip", weights="/x", mode="generate")
    with pytest.raises((ConfigError, ValueError), match="mode"):
        RewardModelConfig(name="unified_reward", weights="/x", mode="sample")

    from g2rpo.cli import main

    assert main(["rewards", "list"]) == 0
    out = capsys.readouterr().out
    assert "\nunified_reward  (" in out and "CodeGoat24/UnifiedReward-qwen-7b" in out


@pytest.mark.integration
def test_weights_from_an_s3_artifact(tiny_unified_reward, s3_env, tmp_path):
    from g2rpo.artifacts.manifest import publish_dir

    uri = f"s3://{s3_env.bucket}/rewards/unified_reward"
    publish_dir(tiny_unified_reward["dir"], uri)
    remote = build_reward(RewardModelConfig(name="unified_reward", weights=uri), cache_dir=str(tmp_path / "cache"))
    local = UnifiedReward.from_pretrained_dir(tiny_unified_reward["dir"])
    images = _images(seed=4)
    assert torch.equal(remote.score(images, PROMPTS), local.score(images, PROMPTS))
