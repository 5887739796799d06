"""Tiny random reward weights written in each published file format and key layout.

Tests, the benchmark and the parity fixtures need every head's *real* loading code to run
offline. These writers build the same library classes at tiny size with seeded random weights and
save them exactly as the published artifacts are laid out:

| writer | layout written | loaded by |
| --- | --- | --- |
| :func:`write_tiny_hps` | ``HPS_v2.1_compressed.pt`` = ``{"state_dict": open_clip CLIP state dict}`` + ``open_clip_config.json`` | :meth:`HPSv21.from_checkpoint` |
| :func:`write_tiny_open_clip_dir` | open_clip ``local-dir:`` folder: ``open_clip_config.json`` + ``open_clip_pytorch_model.bin`` (as apple/DFN5B-CLIP-ViT-H-14-384 on the Hub) | :meth:`CLIPScore.from_local_dir` |
| :func:`write_tiny_pickscore_dir` | transformers ``CLIPModel.save_pretrained`` folder + ``preprocessor_config.json`` + CLIP BPE ``vocab.json``/``merges.txt`` | :meth:`PickScore.from_pretrained_dir` |
| :func:`write_tiny_image_reward` | ``ImageReward.pt`` flat state dict in the *reference* module's key names (``blip.visual_encoder.blocks.0.attn.qkv.weight``, ...) + ``med_config.json`` + ``vision_config.json`` + ``tokenizer/vocab.txt`` | :meth:`ImageReward.from_checkpoint` |
| :func:`write_tiny_aesthetic` | LAION improved-aesthetic-predictor MLP state dict (``layers.0.weight`` ...) + an open_clip ``local-dir:`` folder | :meth:`Aesthetic.from_files` |
| :func:`write_tiny_unified_reward` | transformers ``Qwen2_5_VLForConditionalGeneration.save_pretrained`` folder (published key names) + ``Qwen2Tokenizer`` ``tokenizer.json`` + ``Qwen2VLImageProcessor`` config + a Qwen chat template | :meth:`UnifiedReward.from_pretrained_dir` |

Each writer returns a dict of the paths it wrote. The parity helper may use them in the
reference environments too: they need only torch, open_clip / transformers and the standard
library (the ImageReward writer builds the reference key names itself, from the inverse of
:data:`g2rpo.rewards.image_reward.KEY_RULES`).

Sizes: open_clip towers are 16–32 wide with 2 layers but keep open_clip's 49,408-token BPE
vocabulary (so the real tokenizer works), ~1 M parameters; the ImageReward tiny net is ~0.2 M.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TINY_OPEN_CLIP_CONFIG",
    "TINY_BLIP_VISION",
    "TINY_MED_CONFIG",
    "write_tiny_hps",
    "write_tiny_open_clip_dir",
    "write_tiny_pickscore_dir",
    "write_tiny_image_reward",
    "write_tiny_aesthetic",
    "write_tiny_unified_reward",
    "tiny_qwen2_tokenizer",
    "QWEN_CHAT_TEMPLATE",
    "tiny_bert_vocab",
    "to_reference_image_reward_keys",
]

# open_clip config at tiny size: 32×32 images in 8×8 patches (16 tokens), 2+2 layers.
TINY_OPEN_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 2},
}

# BLIP ViT at tiny size (keys as ImageReward.from_checkpoint's vision_config).
TINY_BLIP_VISION: dict[str, Any] = {
    "image_size": 32,
    "patch_size": 16,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "layer_norm_eps": 1e-6,
}

# BLIP med_config.json at tiny size (vocab_size filled in from the tiny vocabulary + 2).
TINY_MED_CONFIG: dict[str, Any] = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 40,
    "model_type": "bert",
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "add_cross_attention": True,
    "encoder_width": 32,
}


def _jitter_(module: torch.nn.Module, generator: torch.Generator, scale: float = 0.05) -> None:
    """Add seeded noise to every floating parameter so that no score is trivially constant."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)


def _build_open_clip(config: dict[str, Any], seed: int) -> torch.nn.Module:
    from g2rpo.rewards.openclip_loading import build_open_clip

    torch.manual_seed(seed)
    model, _, _ = build_open_clip("tiny", "tiny", {"model_cfg": config})
    _jitter_(model, torch.Generator().manual_seed(seed + 1))
    return model


def write_tiny_hps(folder: str | Path, *, seed: int = 0, config: dict[str, Any] | None = None) -> dict[str, Path]:
    """``HPS_v2.1_compressed.pt`` (``{"state_dict": ...}``) + ``open_clip_config.json``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config or TINY_OPEN_CLIP_CONFIG
    model = _build_open_clip(config, seed)
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    cfg_path = folder / "open_clip_config.json"
    cfg_path.write_text(json.dumps({"model_cfg": config}, indent=2), encoding="utf-8")
    return {"checkpoint": checkpoint, "open_clip_config": cfg_path}


def write_tiny_open_clip_dir(
    folder: str | Path, *, seed: int = 0, config: dict[str, Any] | None = None, preprocess_cfg: dict | None = None
) -> dict[str, Path]:
    """An open_clip ``local-dir:`` folder: ``open_clip_config.json`` + ``open_clip_pytorch_model.bin``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config or TINY_OPEN_CLIP_CONFIG
    model = _build_open_clip(config, seed)
    full = {"model_cfg": config}
    if preprocess_cfg:
        full["preprocess_cfg"] = preprocess_cfg
    (folder / "open_clip_config.json").write_text(json.dumps(full, indent=2), encoding="utf-8")
    weights = folder / "open_clip_pytorch_model.bin"
    torch.save(model.state_dict(), weights)
    return {"dir": folder, "weights": weights, "open_clip_config": folder / "open_clip_config.json"}


# --------------------------------------------------------------------------- PickScore (transformers CLIP)


def _clip_byte_vocab() -> tuple[dict[str, int], list[str]]:
    """A byte-level CLIP BPE vocabulary without merges: every byte, alone and word-final.

    Same construction as CLIP's (GPT-2 byte-to-unicode table, ``</w>`` word ends, the two
    special tokens last); with no merges every word splits into characters, so any prompt encodes.
    """
    from open_clip.tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(tokens)}, []


def write_tiny_pickscore_dir(folder: str | Path, *, seed: int = 0, image_size: int = 32) -> dict[str, Path]:
    """A transformers ``CLIPModel`` folder with tokenizer and ``preprocessor_config.json``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = _clip_byte_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges), encoding="utf-8")
    special = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(special), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "CLIPTokenizer", "model_max_length": 77, **special}), encoding="utf-8"
    )
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config={
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 77,
            "bos_token_id": vocab["<|startoftext|>"],
            "eos_token_id": vocab["<|endoftext|>"],
            "pad_token_id": vocab["<|endoftext|>"],
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": image_size,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    model = CLIPModel(config)
    _jitter_(model, torch.Generator().manual_seed(seed + 1))
    model.save_pretrained(folder)
    CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    ).save_pretrained(folder)
    return {"dir": folder}


# --------------------------------------------------------------------------- ImageReward (BLIP)

_COMMON_WORDS = (
    "a an the of on in with and at to by for from is are cat dog man woman girl boy person photo picture "
    "painting portrait drawing red green blue yellow black white orange purple pink brown gray big small "
    "tall old young beautiful cute sitting standing running flying table chair house car tree sky sea "
    "mountain city street river flower garden forest night day sun moon star light dark high quality "
    "detailed realistic art style oil digital render cinematic 4k 8k"
).split()


def tiny_bert_vocab() -> list[str]:
    """A small uncased WordPiece vocabulary: specials, common words, letters, digits, ``##`` pieces.

    Every lowercase ASCII prompt tokenizes without ``[UNK]`` (words fall back to letters and
    ``##letter`` pieces). The special tokens sit at BERT's order (``[PAD]`` = 0).
    """
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    singles = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = ["##" + c for c in string.ascii_lowercase + string.digits]
    seen: set[str] = set()
    out = []
    for tok in specials + _COMMON_WORDS + singles + pieces:
        if tok not in seen:
            seen.add(tok)
            out.append(tok)
    return out


# Inverse of image_reward.KEY_RULES: this project's key → the reference ImageReward module's key.
_REFERENCE_RULES: list[tuple[str, str]] = [
    (r"^vision\.embeddings\.class_embedding$", "blip.visual_encoder.cls_token"),
    (r"^vision\.embeddings\.position_embedding$", "blip.visual_encoder.pos_embed"),
    (r"^vision\.embeddings\.patch_embedding\.", "blip.visual_encoder.patch_embed.proj."),
    (r"^vision\.encoder\.layers\.(\d+)\.layer_norm1\.", r"blip.visual_encoder.blocks.\1.norm1."),
    (r"^vision\.encoder\.layers\.(\d+)\.layer_norm2\.", r"blip.visual_encoder.blocks.\1.norm2."),
    (r"^vision\.encoder\.layers\.(\d+)\.self_attn\.qkv\.", r"blip.visual_encoder.blocks.\1.attn.qkv."),
    (r"^vision\.encoder\.layers\.(\d+)\.self_attn\.projection\.", r"blip.visual_encoder.blocks.\1.attn.proj."),
    (r"^vision\.encoder\.layers\.(\d+)\.mlp\.", r"blip.visual_encoder.blocks.\1.mlp."),
    (r"^vision\.post_layernorm\.", "blip.visual_encoder.norm."),
    (r"^text\.", "blip.text_encoder."),
    (r"^head\.layers\.", "mlp.layers."),
]


def to_reference_image_reward_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an :class:`ImageRewardNet` state dict to the reference ``ImageReward.pt`` key names."""

    out = {}
    for key, tensor in state_dict.items():
        for pattern, replacement in _REFERENCE_RULES:
            if re.match(pattern, key):
                out[re.sub(pattern, replacement, key)] = tensor
                break
        else:
            raise KeyError(f"no reference name for {key!r}")
    return out


def write_tiny_image_reward(folder: str | Path, *, seed: int = 0) -> dict[str, Path]:
    """``ImageReward.pt`` (reference key names) + ``med_config.json`` + ``vision_config.json`` +
    ``tokenizer/vocab.txt``; the extra keys the published file carries (``blip.vision_proj``,
    ``blip.text_proj``, ``blip.text_encoder.embeddings.position_ids``) are written too."""
    from g2rpo.rewards.image_reward import ImageRewardNet

    folder = Path(folder)
    tok_dir = folder / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    vocab = tiny_bert_vocab()
    (tok_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    med = dict(TINY_MED_CONFIG, vocab_size=len(vocab) + 2)  # + [DEC], [ENC]
    (folder / "med_config.json").write_text(json.dumps(med, indent=2), encoding="utf-8")
    (folder / "vision_config.json").write_text(json.dumps(TINY_BLIP_VISION, indent=2), encoding="utf-8")

    torch.manual_seed(seed)
    net = ImageRewardNet(med, TINY_BLIP_VISION)
    _jitter_(net, torch.Generator().manual_seed(seed + 1))
    state = to_reference_image_reward_keys(net.state_dict())
    g = torch.Generator().manual_seed(seed + 2)
    state["blip.vision_proj.weight"] = torch.randn(256, TINY_BLIP_VISION["hidden_size"], generator=g) * 0.02
    state["blip.vision_proj.bias"] = torch.zeros(256)
    state["blip.text_proj.weight"] = torch.randn(256, med["hidden_size"], generator=g) * 0.02
    state["blip.text_proj.bias"] = torch.zeros(256)
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(med["max_position_embeddings"]).expand((1, -1))
    checkpoint = folder / "ImageReward.pt"
    torch.save(state, checkpoint)
    return {
        "checkpoint": checkpoint,
        "med_config": folder / "med_config.json",
        "vision_config": folder / "vision_config.json",
        "tokenizer_dir": tok_dir,
    }


# --------------------------------------------------------------------------- LAION aesthetic


def write_tiny_aesthetic(folder: str | Path, *, seed: int = 0) -> dict[str, Path]:
    """The improved-aesthetic-predictor MLP (``layers.{0,2,4,6,7}``) + a tiny open_clip folder."""
    from g2rpo.rewards.aesthetic import AestheticMLP

    folder = Path(folder)
    clip = write_tiny_open_clip_dir(folder / "clip", seed=seed)
    torch.manual_seed(seed + 3)
    mlp = AestheticMLP(TINY_OPEN_CLIP_CONFIG["embed_dim"])
    _jitter_(mlp, torch.Generator().manual_seed(seed + 4))
    weights = folder / "aesthetic_mlp.pth"
    torch.save(mlp.state_dict(), weights)
    return {"mlp": weights, "clip_dir": clip["dir"]}


# --------------------------------------------------------------------------- UnifiedReward (Qwen2.5-VL)

# Qwen2.5-VL's special tokens, in the order the published vocabulary numbers them after the BPE tokens.
_QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# The chat layout of Qwen2.5-VL-Instruct's template, which the UnifiedReward checkpoints ship: a
# default system turn when the chat has none, ChatML turns, an image part as
# <|vision_start|><|image_pad|><|vision_end|>. Rendered text (and so token ids) as transformers'
# Qwen2.5-VL integration test expects from the published processor (docs/rewards.md).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Merges that make "Final" and " Score" single tokens, as in the published vocabulary.
_QWEN_MERGES = ("F i", "Fi n", "Fin a", "Fina l", "Ġ S", "ĠS c", "ĠSc o", "ĠSco r", "ĠScor e")


def tiny_qwen2_tokenizer():
    """A transformers ``Qwen2Tokenizer`` built offline: byte-level BPE over the 256 byte symbols, a
    few merges, and Qwen2.5-VL's special tokens (eos ``<|im_end|>``, pad ``<|endoftext|>``).

    Digits are single tokens, as in Qwen's vocabulary; any text encodes (bytes fall back to
    single symbols).
    """
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    symbols = sorted(ByteLevel.alphabet())
    merged = [a + b for a, b in (m.split(" ") for m in _QWEN_MERGES)]
    vocab = {tok: i for i, tok in enumerate(symbols + merged)}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[tuple(m.split(" ")) for m in _QWEN_MERGES],
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(_QWEN_SPECIALS[1:])})
    return tokenizer


def write_tiny_unified_reward(folder: str | Path, *, seed: int = 0, answer: str | None = None) -> dict[str, Path]:
    """A tiny Qwen2.5-VL judge folder in the published layout (``config.json``,
    ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``, ``processor_config.json``,
    ``chat_template.jinja``).

    Vision: patch 8, merge 2, images resized into 256–4096 pixels (a 32×32 image is 4 image
    tokens); text: 2 layers, 32 wide. Weights are seeded random with the output layer scaled up.
    A random judge writes no score; with ``answer`` (e.g. ``"Final Score: 2.35"``) the judge is
    rewired to answer exactly that to any image and caption (:func:`_program_answer`).
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_qwen2_tokenizer()
    image_processor = Qwen2VLImageProcessor(
        patch_size=8, merge_size=2, temporal_patch_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )
    video_processor = Qwen2VLVideoProcessor(patch_size=8, merge_size=2, temporal_patch_size=2)
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 8,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 32,
            "out_hidden_size": 32,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    _jitter_(model, torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    if answer is not None:
        _program_answer(model, tokenizer, answer)
    model.save_pretrained(folder)
    return {"dir": folder}


def _program_answer(model, tokenizer, answer: str) -> None:
    """Rewire a tiny judge so that greedy decoding after the generation prompt writes ``answer``.

    Attention and MLP outputs are zeroed, so the last hidden state is the (normalised) embedding
    of the last token alone; each token of the chain ``"\\n"`` (the generation prompt's last
    token), ``answer``'s tokens, ``<|im_end|>`` gets a one-hot embedding, and the output layer maps
    it to its successor. Every token of the chain must be distinct (its successor is a function of
    the token) and the chain must fit the hidden width.
    """
    chain = [tokenizer.convert_tokens_to_ids("Ċ")]
    chain += tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    lm = model.model.language_model
    width = lm.embed_tokens.weight.shape[1]
    if len(set(chain)) != len(chain) or len(chain) > width:
        raise ValueError(f"answer {answer!r}: its tokens must be distinct and fewer than {width - 1}")
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        lm.norm.weight.fill_(1.0)
        embed, out = lm.embed_tokens.weight, model.lm_head.weight
        out.zero_()
        for k, (token, successor) in enumerate(zip(chain[:-1], chain[1:], strict=True)):
            embed[token] = torch.nn.functional.one_hot(torch.tensor(k), width).to(embed.dtype)
            out[successor] = 10.0 * embed[token]
