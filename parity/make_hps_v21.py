"""Golden HPS-v2.1 scores from the ``hpsv2`` package's own code, on tiny random weights.

Runs inside ``parity/.venv-hpsv2`` (see make_parity.sh). Steps:

1. Register a tiny open_clip config (same keys as hpsv2's bundled ``ViT-H-14.json``) in hpsv2's
   bundled open_clip (``add_model_config``) and build it with the exact keyword arguments of
   ``hpsv2.img_score.initialize_model`` (``precision='amp'``, ``light_augmentation=True``,
   ``output_dict=True``, ...), only the model name and ``pretrained=None`` differ.
2. Give every parameter seeded random values; token-embedding rows of tokens no prompt uses are
   set to zero so that the 49408-row table compresses in git (the CLIP tokenizer is fixed, so the
   vocabulary cannot shrink).
3. Save ``{"state_dict": model.state_dict()}`` as ``HPS_v2.1_compressed.pt`` — the key the hpsv2
   code reads (``checkpoint['state_dict']`` in ``img_score.score``).
4. Score every (image, prompt) pair with ``hpsv2.img_score.score(path, prompt, cp=...)``: the
   package's function reloads the checkpoint strictly, preprocesses with its ``preprocess_val``,
   tokenizes with ``get_tokenizer('ViT-H-14')`` and returns ``diag(image_features @ text_features.T)``.
   Its ``initialize_model`` is skipped by filling ``img_score.model_dict`` first, which is the only
   way to avoid its ViT-H-14 download.

Usage: ``python parity/make_hps_v21.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_inputs as inputs  # noqa: E402

ARCH = "HPS-tiny-parity"
# ViT-H-14's config keys (hpsv2/src/open_clip/model_configs/ViT-H-14.json) at tiny size.
MODEL_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 8, "heads": 2, "layers": 2},
}
NATIVE_SIZES = [(64, 64)] * 4
# Another resolution (a square downscale and a non-square image) to measure resize tolerance.
RESIZED_SIZES = [(96, 96), (48, 80)]


def main(out_dir: Path) -> None:
    inputs.forbid_network()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / "images").glob("*.png"):
        stale.unlink()

    from hpsv2 import img_score
    from hpsv2.src import open_clip

    with tempfile.TemporaryDirectory() as tmp:
        config_file = Path(tmp) / f"{ARCH}.json"
        config_file.write_text(json.dumps(MODEL_CFG), encoding="utf-8")
        open_clip.add_model_config(config_file)

    torch.manual_seed(inputs.SEED)
    generator = torch.Generator().manual_seed(inputs.SEED)
    # The keyword arguments of hpsv2.img_score.initialize_model, with the tiny architecture.
    model, _, preprocess_val = open_clip.create_model_and_transforms(
        ARCH,
        None,
        precision="amp",
        device="cpu",
        jit=False,
        force_quick_gelu=False,
        force_custom_text=False,
        force_patch_dropout=False,
        force_image_size=None,
        pretrained_image=False,
        image_mean=None,
        image_std=None,
        light_augmentation=True,
        aug_cfg={},
        output_dict=True,
        with_score_predictor=False,
        with_region_predictor=False,
    )
    inputs.randomize_(model, generator)

    tokenizer = open_clip.get_tokenizer("ViT-H-14")
    used_tokens = torch.unique(tokenizer(inputs.PROMPTS))  # includes <start>, <end> and padding 0
    with torch.no_grad():
        keep = torch.zeros(model.token_embedding.weight.shape[0], dtype=torch.bool)
        keep[used_tokens] = True
        model.token_embedding.weight[~keep] = 0.0

    checkpoint_path = out_dir / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint_path)
    inputs.write_json(out_dir / "open_clip_config.json", {"model_cfg": MODEL_CFG})

    native = inputs.write_images(out_dir / "images", NATIVE_SIZES, "native", generator)
    resized = inputs.write_images(out_dir / "images", RESIZED_SIZES, "resized", generator)
    resized_prompts = inputs.PROMPTS[: len(resized)]
    inputs.write_json(out_dir / "prompts.json", {"native": inputs.PROMPTS, "resized": resized_prompts})

    img_score.model_dict["model"] = model
    img_score.model_dict["preprocess_val"] = preprocess_val

    def reference_scores(images: list[str], prompts: list[str]) -> list[float]:
        return [
            float(img_score.score(str(out_dir / image), prompt, cp=str(checkpoint_path), hps_version="v2.1")[0])
            for image, prompt in zip(images, prompts, strict=True)
        ]

    inputs.write_json(
        out_dir / "expected.json",
        {
            "reward": "hps_v21",
            "reference": "hpsv2.img_score.score(image_path, prompt, cp=HPS_v2.1_compressed.pt)",
            "checkpoint": checkpoint_path.name,
            "arch": ARCH,
            "native": {"images": native, "scores": reference_scores(native, inputs.PROMPTS)},
            "resized": {"images": resized, "scores": reference_scores(resized, resized_prompts)},
            # open_clip BPE ids as hpsv2 tokenizes them, trailing padding dropped.
            "token_ids": [[t for t in row if t != 0] for row in tokenizer(inputs.PROMPTS).tolist()],
            "seed": inputs.SEED,
            "versions": inputs.versions("hpsv2", "torchvision", "pillow", "protobuf"),
            "command": inputs.command_line(),
        },
    )
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python parity/make_hps_v21.py OUT_DIR")
    main(Path(sys.argv[1]))
