"""ImageReward: BLIP image-grounded text encoder + MLP head (Xu et al. 2023, the ``image-reward``
package's ``ImageReward.score``), on transformers' BLIP classes.

Algorithm: the image goes through BLIP's ViT (``[B, 1 + N, D_v]``); the prompt (BERT tokens,
``max_length=35``, padded and truncated) goes through BLIP's text encoder with cross-attention to
every image token; the ``[CLS]`` output ``h`` (``[B, D_t]``) feeds a 5-layer linear MLP
(D_t → 1024 → 128 → 64 → 16 → 1, no activations, dropout only in training) and the result is
standardised with the published constants:

    r = MLP(h),    ImageReward = (r − 0.16717362830052426) / 1.0333394966054072.

Checkpoint: the published ``ImageReward.pt`` is a flat state dict of the reference
``ImageReward`` module (``blip.visual_encoder.*``, ``blip.text_encoder.*``, ``blip.vision_proj.*``,
``blip.text_proj.*``, ``mlp.layers.*``), tensors only: read with ``torch.load(weights_only=True)``.
It is mapped onto :class:`transformers.BlipVisionModel` (``vision.*``),
:class:`transformers.models.blip.modeling_blip_text.BlipTextModel` (``text.*``, the same layout
as BLIP's ``med.py``) and the MLP (``head.*``) through the explicit table :data:`KEY_RULES`.
Keys in :data:`IGNORED_KEYS` (the contrastive projections and a position-id buffer, unused by the
score) are dropped; any other unmapped key, or any model parameter left without a value, is a
:class:`~g2rpo.errors.G2RPOError` listing them. (The reference loads with ``strict=False``.)

Preprocessing reproduced (the reference ``_transform(224)``): ``Resize(224, BICUBIC)`` (shorter
side), ``CenterCrop(224)``, ``ToTensor``, ``Normalize`` with OpenAI CLIP mean/std. The reference
resizes a uint8 PIL image; here torchvision's antialiased bicubic runs on the float batch, the
identity at 224×224 input (see docs/rewards.md for the measured difference otherwise).
Tokenizer: ``BertTokenizer`` from a local folder holding ``vocab.txt`` (bert-base-uncased), with
BLIP's two added special tokens ``[DEC]`` (bos) and ``[ENC]``, as ``init_tokenizer`` adds them.

Departures: batched (the reference loops over images); one prompt per image.

Public loader (the contract with the parity fixtures, docs/rewards.md)::

    ImageReward.from_checkpoint(checkpoint_path, *, med_config, vision_config=None,
                                tokenizer_dir, device="cpu", dtype=torch.float32)
    head.score(images [B, 3, H, W] in [0, 1], prompts: list[str]) -> tensor[B]

``med_config``: BLIP's ``med_config.json`` (BERT keys: ``vocab_size``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
``max_position_embeddings``, ``hidden_act``, ``layer_norm_eps``, ``pad_token_id``; path or dict).
``vision_config``: the ViT (``image_size``, ``patch_size``, ``hidden_size`` = BLIP ``embed_dim``,
``num_hidden_layers`` = ``depth``, ``num_attention_heads``, ``intermediate_size`` =
``mlp_ratio · embed_dim``; path or dict); None means BLIP's ``vit='large'`` at 224
(1024 wide, 24 layers, 16 heads, patch 16), what ``ImageReward.pt`` holds.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from g2rpo.config import CONFIG_MAX_BYTES
from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.aesthetic import AestheticMLP
from g2rpo.rewards.base import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    RewardModel,
    load_weights_only,
    normalize,
    require_dir,
    require_file,
    resize_shortest_center_crop,
    shape_check,
    strict_key_check,
)
from g2rpo.textfile import read_json_file, read_text_file

__all__ = [
    "ImageReward",
    "ImageRewardNet",
    "KEY_RULES",
    "IGNORED_KEYS",
    "map_image_reward_keys",
    "BLIP_LARGE_VISION",
    "REWARD_MEAN",
    "REWARD_STD",
    "MAX_PROMPT_TOKENS",
]

# Published standardisation constants (ImageReward/ImageReward.py: self.mean, self.std).
REWARD_MEAN = 0.16717362830052426
REWARD_STD = 1.0333394966054072
# The reference tokenizes with max_length=35.
MAX_PROMPT_TOKENS = 35

# BLIP create_vit('large', 224): embed_dim 1024, depth 24, heads 16, mlp_ratio 4, patch 16, LN eps 1e-6.
BLIP_LARGE_VISION: dict[str, Any] = {
    "image_size": 224,
    "patch_size": 16,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-6,
}

# ImageReward.pt key → this module's key. Applied in order; the first matching rule wins.
KEY_RULES: list[tuple[str, str]] = [
    (r"^blip\.visual_encoder\.cls_token$", "vision.embeddings.class_embedding"),
    (r"^blip\.visual_encoder\.pos_embed$", "vision.embeddings.position_embedding"),
    (r"^blip\.visual_encoder\.patch_embed\.proj\.", "vision.embeddings.patch_embedding."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm1\.", r"vision.encoder.layers.\1.layer_norm1."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm2\.", r"vision.encoder.layers.\1.layer_norm2."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.qkv\.", r"vision.encoder.layers.\1.self_attn.qkv."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.proj\.", r"vision.encoder.layers.\1.self_attn.projection."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.mlp\.(fc[12])\.", r"vision.encoder.layers.\1.mlp.\2."),
    (r"^blip\.visual_encoder\.norm\.", "vision.post_layernorm."),
    (r"^blip\.text_encoder\.", "text."),
    (r"^mlp\.layers\.", "head.layers."),
]

# Present in ImageReward.pt, unused by the score: ITC projections and BERT's position-id buffer.
IGNORED_KEYS: list[str] = [
    r"^blip\.vision_proj\.(weight|bias)$",
    r"^blip\.text_proj\.(weight|bias)$",
    r"^blip\.text_encoder\.embeddings\.position_ids$",
]


def map_image_reward_keys(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename ``ImageReward.pt`` keys by :data:`KEY_RULES`; return (mapped, unmapped keys).

    Ignored keys are dropped silently; keys that match no rule are returned as unmapped.
    """
    mapped: dict[str, torch.Tensor] = {}
    unmapped: list[str] = []
    for key, tensor in state_dict.items():
        if any(re.match(pattern, key) for pattern in IGNORED_KEYS):
            continue
        for pattern, replacement in KEY_RULES:
            if re.match(pattern, key):
                mapped[re.sub(pattern, replacement, key)] = tensor
                break
        else:
            unmapped.append(key)
    return mapped, unmapped


class ImageRewardNet(nn.Module):
    """BLIP ViT + BLIP image-grounded text encoder + MLP head, as transformers modules."""

    def __init__(self, med_config: dict[str, Any], vision_config: dict[str, Any] | None = None):
        """``vision_config`` keys override :data:`BLIP_LARGE_VISION` (None: the published ViT-L/16)."""
        super().__init__()
        from transformers import BlipTextConfig, BlipVisionConfig, BlipVisionModel
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        vision = {**BLIP_LARGE_VISION, **(vision_config or {})}
        vcfg = BlipVisionConfig(hidden_act="gelu", attention_dropout=0.0, **vision)
        tcfg = BlipTextConfig(
            vocab_size=med_config["vocab_size"],
            hidden_size=med_config["hidden_size"],
            # BLIP_Pretrain sets encoder_config.encoder_width = vision width, whatever the JSON says.
            encoder_hidden_size=vcfg.hidden_size,
            intermediate_size=med_config["intermediate_size"],
            num_hidden_layers=med_config["num_hidden_layers"],
            num_attention_heads=med_config["num_attention_heads"],
            max_position_embeddings=med_config["max_position_embeddings"],
            hidden_act=med_config.get("hidden_act", "gelu"),
            layer_norm_eps=med_config.get("layer_norm_eps", 1e-12),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=med_config.get("pad_token_id", 0),
            bos_token_id=None,
            eos_token_id=None,
            sep_token_id=None,
            is_decoder=True,  # builds the cross-attention blocks; forward passes is_decoder=False
        )
        self.vision = BlipVisionModel(vcfg)
        self.text = BlipTextModel(tcfg, add_pooling_layer=False)
        self.head = AestheticMLP(tcfg.hidden_size)  # the same layers as the LAION aesthetic head
        self.image_size = vcfg.image_size

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        image_embeds = self.vision(pixel_values=pixels).last_hidden_state  # [B, 1 + N, D_v]
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)  # [B, 1 + N]
        text = self.text(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_atts,
            is_decoder=False,
            use_cache=False,
        )
        h = text.last_hidden_state[:, 0, :].float()  # [B, D_t], the [CLS] output
        r = self.head(h.to(self.head.layers[0].weight.dtype)).float()  # [B]
        return (r - REWARD_MEAN) / REWARD_STD


_VOCAB_WHAT = "a folder holding bert-base-uncased's vocab.txt"
VOCAB_MAX_BYTES = 16 * 1024 * 1024  # bert-base-uncased's vocab.txt is 232 KB


def _json_config(field: str, config: dict | str | Path, what: str) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    try:  # a regular UTF-8 file of at most CONFIG_MAX_BYTES holding one JSON object
        return read_json_file(config, what="config file", fix=f"point it at {what}", max_bytes=CONFIG_MAX_BYTES)
    except G2RPOError as exc:
        raise G2RPOError(problem(field, str(config), str(exc))) from None


_MED_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
_VISION_KEYS = (
    "image_size",
    "patch_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "layer_norm_eps",
)


def load_blip_tokenizer(tokenizer_dir: str | Path):
    """``BertTokenizer`` from a local ``vocab.txt`` folder plus BLIP's ``[DEC]``/``[ENC]`` tokens.

    ``from_pretrained`` on the folder, not ``BertTokenizer(vocab_file=...)``: transformers 5
    ignores that keyword and builds a 5-token vocabulary without complaint.
    """
    from transformers import BertTokenizer

    field = "image_reward.tokenizer_dir"
    folder = require_dir(field, tokenizer_dir, _VOCAB_WHAT)
    vocab = require_file(f"{field}/vocab.txt", folder / "vocab.txt", "bert-base-uncased's vocab.txt")
    text = read_text_file(vocab, what="vocabulary", fix=f"point {field} at {_VOCAB_WHAT}", max_bytes=VOCAB_MAX_BYTES)
    lines = len(io.StringIO(text, newline=None).readlines())  # as transformers' load_vocab counts them
    tokenizer = BertTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tokenizer.vocab_size != lines:
        raise G2RPOError(
            problem(
                field,
                str(folder),
                f"the tokenizer read {tokenizer.vocab_size} tokens from a {lines}-line "
                "vocab.txt; pass a folder whose vocab.txt has one token per line",
            )
        )
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


class ImageReward(RewardModel):
    """ImageReward reward in its standardised scale (≈ N(0, 1) over the paper's benchmark)."""

    name = "image_reward"

    def __init__(self, net: ImageRewardNet, tokenizer, *, device="cpu", dtype=torch.float32):
        self.net = net.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.net.head.float()  # the reference runs the MLP on .float() features
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.dtype = dtype

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_path: str | Path,
        *,
        med_config: dict | str | Path,
        vision_config: dict | str | Path | None = None,
        tokenizer_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> ImageReward:
        """Load a published-layout ``ImageReward.pt`` strictly (see the module docstring)."""
        field = "image_reward.weights"
        path = require_file(field, checkpoint_path, "ImageReward.pt (the published state dict)")
        med = _json_config("image_reward.med_config", med_config, "BLIP's med_config.json")
        missing = [k for k in _MED_KEYS if k not in med]
        if missing:
            raise G2RPOError(problem("image_reward.med_config", sorted(med), f"missing BERT keys {missing}"))
        vision = (
            dict(BLIP_LARGE_VISION)
            if vision_config is None
            else _json_config("image_reward.vision_config", vision_config, "a BLIP ViT config JSON")
        )
        unknown = sorted(set(vision) - set(_VISION_KEYS))
        if unknown:
            raise G2RPOError(
                problem("image_reward.vision_config", unknown, f"unknown keys; valid keys: {list(_VISION_KEYS)}")
            )
        vision = {**BLIP_LARGE_VISION, **vision}
        tokenizer = load_blip_tokenizer(tokenizer_dir)
        if len(tokenizer) > med["vocab_size"]:
            raise G2RPOError(
                problem(
                    "image_reward.med_config.vocab_size",
                    med["vocab_size"],
                    f"the tokenizer has {len(tokenizer)} tokens (vocab.txt + [DEC], [ENC]); they must fit",
                )
            )
        net = ImageRewardNet(med, vision)

        state_dict = load_weights_only(field, path)
        if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
            raise G2RPOError(
                problem(field, str(path), "does not hold a flat state dict of tensors; pass ImageReward.pt")
            )
        mapped, unmapped = map_image_reward_keys(state_dict)
        expected = net.state_dict()
        strict_key_check(
            field,
            path,
            set(expected),
            set(mapped) | set(unmapped),
            "Keys are reported after renaming by image_reward.KEY_RULES; check the file and med_config/vision_config",
        )
        shape_check(field, path, expected, mapped, "check med_config / vision_config")
        net.load_state_dict(mapped, strict=True)
        return cls(net, tokenizer, device=device, dtype=dtype)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        size = self.net.image_size
        x = images.to(device=self.device, dtype=torch.float32)
        x = resize_shortest_center_crop(x, size)  # [B, 3, 224, 224]
        x = normalize(x, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD).to(self.dtype)
        tokens = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=MAX_PROMPT_TOKENS, return_tensors="pt"
        )
        return self.net(x, tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device))  # [B]
