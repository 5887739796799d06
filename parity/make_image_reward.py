"""Golden ImageReward scores from the ``image-reward`` package's own code, on tiny random weights.

Runs inside ``parity/.venv-imagereward`` (see make_parity.sh). The package hard-codes three
things that are patched here, each by replacing one name the package looks up, so that its own
classes build a tiny model:

- ``BLIP.blip_pretrain.create_vit`` → the package's own ``VisionTransformer`` at tiny width/depth
  (``vit='large'`` would be 1024 wide, 24 deep); image size 224 and patch 16 stay as published.
- ``BLIP.blip.BertTokenizer`` → a subclass whose ``from_pretrained('bert-base-uncased')`` reads the
  tiny local vocabulary written here (the original call downloads). ``init_tokenizer`` itself runs
  unchanged and adds ``[DEC]``/``[ENC]``.
- ``ImageReward.ImageReward.MLP`` → the package's ``MLP`` built for the tiny text width instead of
  the literal 768 (its hidden widths 1024/128/64/16 stay).

Then: construct ``ImageReward(med_config=...)``, give every parameter seeded random values, save
its ``state_dict()`` as ``ImageReward.pt`` (the published file's layout: a flat state dict of this
module), load it back with the package's ``ImageReward.load(path, med_config=...)`` and score every
(image, prompt) pair with ``model.score(prompt, image_path)``. ``load`` uses ``strict=False``, so
the generator checks itself that every saved tensor arrived.

Usage: ``python parity/make_image_reward.py OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_inputs as inputs  # noqa: E402

VISION = {"embed_dim": 32, "depth": 2, "num_heads": 2, "patch_size": 16, "image_size": 224, "mlp_ratio": 4}
# BLIP's configs/med_config.json keys at tiny size; vocab_size = tiny vocab + [DEC] + [ENC].
MED_CONFIG = {
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
    "vocab_size": None,  # filled in from the vocabulary
    "encoder_width": VISION["embed_dim"],
    "add_cross_attention": True,
}
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Words split into word pieces on purpose, so WordPiece continuation is part of the check.
WORD_PIECES = {"lighthouse": ["light", "##house"], "cyberpunk": ["cyber", "##punk"], "watercolor": ["water", "##color"]}
UNKNOWN_WORDS = {"zyxwvut"}
NATIVE_SIZES = [(224, 224)] * 4
# Another resolution (a square downscale, a non-square upscale + crop) to measure resize tolerance.
RESIZED_SIZES = [(256, 256), (200, 300)]


def tiny_vocabulary() -> list[str]:
    """Special tokens, punctuation, then every (lower-cased) prompt word or its word pieces."""
    import re

    words: list[str] = []
    for prompt in inputs.PROMPTS:
        for word in re.findall(r"[a-z]+", prompt.lower()):
            if word in UNKNOWN_WORDS:
                continue
            for piece in WORD_PIECES.get(word, [word]):
                if piece not in words:
                    words.append(piece)
    return SPECIAL_TOKENS + [",", ".", "!"] + sorted(words)


def write_tokenizer(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocabulary()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    inputs.write_json(
        folder / "tokenizer_config.json",
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512},
    )
    return len(vocab)


def patch_package(tokenizer_dir: Path) -> None:
    """Point the three hard-coded names at tiny, local versions (see module docstring)."""
    import ImageReward  # noqa: F401  (imports the submodules patched below)

    blip = sys.modules["ImageReward.models.BLIP.blip"]
    blip_pretrain = sys.modules["ImageReward.models.BLIP.blip_pretrain"]
    vit = sys.modules["ImageReward.models.BLIP.vit"]
    reward_module = sys.modules["ImageReward.ImageReward"]

    class LocalBertTokenizer(blip.BertTokenizer):
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            if name != "bert-base-uncased":
                raise ValueError(f"unexpected tokenizer {name!r}")
            return super().from_pretrained(str(tokenizer_dir), *args, local_files_only=True, **kwargs)

    def tiny_create_vit(vit_name, image_size, use_grad_checkpointing=False, ckpt_layer=0, drop_path_rate=0):
        assert vit_name == "large" and image_size == VISION["image_size"]
        encoder = vit.VisionTransformer(
            img_size=image_size,
            patch_size=VISION["patch_size"],
            embed_dim=VISION["embed_dim"],
            depth=VISION["depth"],
            num_heads=VISION["num_heads"],
            mlp_ratio=VISION["mlp_ratio"],
            use_grad_checkpointing=use_grad_checkpointing,
            ckpt_layer=ckpt_layer,
            drop_path_rate=0.1,  # create_vit('large') uses 0.1; inactive in eval mode
        )
        return encoder, VISION["embed_dim"]

    package_mlp = reward_module.MLP

    def tiny_mlp(input_size):
        assert input_size == 768
        return package_mlp(MED_CONFIG["hidden_size"])

    blip.BertTokenizer = LocalBertTokenizer
    blip_pretrain.create_vit = tiny_create_vit
    reward_module.MLP = tiny_mlp


def main(out_dir: Path) -> None:
    inputs.forbid_network()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / "images").glob("*.png"):
        stale.unlink()

    tokenizer_dir = out_dir / "tokenizer"
    MED_CONFIG["vocab_size"] = write_tokenizer(tokenizer_dir) + 2  # + [DEC], [ENC]
    med_config_path = out_dir / "med_config.json"
    inputs.write_json(med_config_path, MED_CONFIG)
    # The same ViT in transformers' BlipVisionConfig keys (BLIP's ViT LayerNorm eps is 1e-6).
    inputs.write_json(
        out_dir / "vision_config.json",
        {
            "image_size": VISION["image_size"],
            "patch_size": VISION["patch_size"],
            "hidden_size": VISION["embed_dim"],
            "num_hidden_layers": VISION["depth"],
            "num_attention_heads": VISION["num_heads"],
            "intermediate_size": VISION["mlp_ratio"] * VISION["embed_dim"],
            "layer_norm_eps": 1e-6,
        },
    )

    patch_package(tokenizer_dir)
    import ImageReward as reward_package

    reward_class = sys.modules["ImageReward.ImageReward"].ImageReward
    torch.manual_seed(inputs.SEED)
    generator = torch.Generator().manual_seed(inputs.SEED)
    model = reward_class(med_config=str(med_config_path), device="cpu")
    inputs.randomize_(model, generator)
    checkpoint_path = out_dir / "ImageReward.pt"
    saved = model.state_dict()
    torch.save(saved, checkpoint_path)

    loaded = reward_package.load(str(checkpoint_path), device="cpu", med_config=str(med_config_path))
    arrived = loaded.state_dict()
    assert set(arrived) == set(saved), sorted(set(arrived) ^ set(saved))
    assert all(torch.equal(arrived[k], saved[k]) for k in saved), "ImageReward.load did not restore every tensor"

    native = inputs.write_images(out_dir / "images", NATIVE_SIZES, "native", generator)
    resized = inputs.write_images(out_dir / "images", RESIZED_SIZES, "resized", generator)
    resized_prompts = inputs.PROMPTS[: len(resized)]
    inputs.write_json(out_dir / "prompts.json", {"native": inputs.PROMPTS, "resized": resized_prompts})

    def reference_scores(images: list[str], prompts: list[str]) -> list[float]:
        with torch.no_grad():
            return [
                float(loaded.score(prompt, str(out_dir / image)))
                for image, prompt in zip(images, prompts, strict=True)
            ]

    token_ids = [loaded.blip.tokenizer(p, padding="max_length", truncation=True, max_length=35).input_ids
                 for p in inputs.PROMPTS]
    inputs.write_json(
        out_dir / "expected.json",
        {
            "reward": "image_reward",
            "reference": "ImageReward.load(ImageReward.pt, med_config=med_config.json).score(prompt, image_path)",
            "checkpoint": checkpoint_path.name,
            "native": {"images": native, "scores": reference_scores(native, inputs.PROMPTS)},
            "resized": {"images": resized, "scores": reference_scores(resized, resized_prompts)},
            "token_ids": token_ids,
            "seed": inputs.SEED,
            "versions": inputs.versions("image-reward", "torchvision", "transformers", "timm", "pillow"),
            "command": inputs.command_line(),
        },
    )
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python parity/make_image_reward.py OUT_DIR")
    main(Path(sys.argv[1]))
