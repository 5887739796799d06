"""PickScore: a CLIP ViT-H-14 fine-tuned on Pick-a-Pic preferences (Kirstain et al. 2023).

Algorithm (the PickScore model card's inference code): with a transformers ``CLIPModel``,

    PickScore(x, y) = exp(logit_scale) · <f_img(x) / |f_img(x)|, f_txt(y) / |f_txt(y)|>

(``exp(logit_scale) = 100`` in the published model, so scores sit around 18–23).

Weights: a local folder in transformers layout (``config.json`` + ``model.safetensors`` /
``pytorch_model.bin``, as ``yuvalkirstain/PickScore_v1`` on the Hub), loaded with
``CLIPModel.from_pretrained(folder, local_files_only=True)`` and held strict: a missing, unexpected
or mis-shaped weight is a :class:`~g2rpo.errors.G2RPOError` naming the keys (transformers itself
would initialise a missing weight at random with only a log line). The processor (tokenizer files and
``preprocessor_config.json``) comes from ``processor_dir``; the model card takes it from
``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``. When None, the model folder must hold them.

Preprocessing reproduced: the processor's ``CLIPImageProcessor`` settings — resize the shorter
side to ``size.shortest_edge`` (or squash to ``size.height × size.width``) with its ``resample``
(3 = bicubic), center-crop to ``crop_size``, normalise with ``image_mean``/``image_std`` —
applied in torch to the whole batch. The model card (transformers 4) ran the PIL processor on
uint8 images; transformers 5's default ``CLIPImageProcessor`` runs torchvision on tensors. Both
are compared in tests/rewards (identity resize: equal to float precision; a real resize: see
docs/rewards.md). Text: ``padding=True, truncation=True, max_length=77`` as in the model card.
"""

from __future__ import annotations

from pathlib import Path

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel, normalize, require_dir, resize_shortest_center_crop, resize_squash

__all__ = ["PickScore", "image_processor_settings"]

_RESAMPLE = {2: "bilinear", 3: "bicubic", 0: "nearest"}


def image_processor_settings(processor) -> dict:
    """The subset of a ``CLIPImageProcessor`` this head reproduces, as plain values."""
    size = dict(processor.size)
    crop = dict(processor.crop_size) if processor.do_center_crop else None
    resample = int(processor.resample) if processor.resample is not None else 3
    if resample not in _RESAMPLE:
        raise G2RPOError(problem("pickscore.preprocessor_config.resample", resample, "use 3 (bicubic) or 2 (bilinear)"))
    if not processor.do_resize or not processor.do_normalize or not processor.do_rescale:
        raise G2RPOError(
            problem(
                "pickscore.preprocessor_config",
                "do_resize/do_rescale/do_normalize off",
                "this head reproduces CLIP's standard processor: enable all three",
            )
        )
    return {
        "size": size,
        "crop_size": crop,
        "interpolation": _RESAMPLE[resample],
        "mean": tuple(processor.image_mean),
        "std": tuple(processor.image_std),
    }


class PickScore(RewardModel):
    """PickScore reward: logit scale times the cosine of transformers CLIP embeddings."""

    name = "pickscore"

    def __init__(self, model, tokenizer, settings: dict, *, device="cpu", dtype=torch.float32):
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.settings = settings
        self.device = torch.device(device)
        self.dtype = dtype

    @classmethod
    def from_pretrained_dir(
        cls,
        model_dir: str | Path,
        *,
        processor_dir: str | Path | None = None,
        device="cpu",
        dtype=torch.float32,
    ) -> PickScore:
        from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel

        model_path = require_dir(
            "pickscore.weights", model_dir, "a transformers CLIPModel folder (config.json + weights)"
        )
        if not (model_path / "config.json").is_file():
            raise G2RPOError(
                problem(
                    "pickscore.weights", str(model_path), "has no config.json; pass a CLIPModel save_pretrained folder"
                )
            )
        proc_path = require_dir(
            "pickscore.processor",
            processor_dir or model_path,
            "a folder with preprocessor_config.json and CLIP tokenizer files",
        )
        if not (proc_path / "preprocessor_config.json").is_file():
            raise G2RPOError(
                problem(
                    "pickscore.processor",
                    str(proc_path),
                    "has no preprocessor_config.json; pass the CLIP processor folder (laion/CLIP-ViT-H-14-laion2B-s32B-b79K)",
                )
            )
        try:
            model, info = CLIPModel.from_pretrained(
                str(model_path), local_files_only=True, dtype=dtype, output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor of the wrong shape
            raise G2RPOError(
                problem("pickscore.weights", str(model_path), f"cannot be loaded as a CLIPModel ({str(exc)[:300]})")
            ) from None
        # transformers initialises missing weights at random and drops unexpected ones with only a
        # log line; here either is an error (its own position_ids buffers are already filtered out).
        bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if any(bad.values()):
            parts = [
                f"{len(v)} {k.replace('_keys', '')} key(s): {', '.join(map(str, v[:8]))}" for k, v in bad.items() if v
            ]
            raise G2RPOError(
                problem(
                    "pickscore.weights",
                    str(model_path),
                    "; ".join(parts) + ". The folder's weights do not match its config.json: pass the published "
                    "PickScore_v1 folder unchanged",
                )
            )
        tokenizer = AutoTokenizer.from_pretrained(str(proc_path), local_files_only=True)
        settings = image_processor_settings(CLIPImageProcessor.from_pretrained(str(proc_path), local_files_only=True))
        return cls(model, tokenizer, settings, device=device, dtype=dtype)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """``CLIPImageProcessor`` (resize, crop, normalise) on a float batch in [0, 1]."""
        s = self.settings
        size, crop = s["size"], s["crop_size"]
        if "shortest_edge" in size:
            edge = size["shortest_edge"]
            if crop is not None and crop["height"] == crop["width"] == edge:
                x = resize_shortest_center_crop(images, edge, interpolation=s["interpolation"])
            else:
                from torchvision.transforms import InterpolationMode
                from torchvision.transforms import functional as TF

                x = TF.resize(images, edge, interpolation=InterpolationMode(s["interpolation"]), antialias=True)
                if crop is not None:
                    x = TF.center_crop(x, [crop["height"], crop["width"]])
        else:
            x = resize_squash(images, (size["height"], size["width"]), interpolation=s["interpolation"])
            if crop is not None:
                from torchvision.transforms import functional as TF

                x = TF.center_crop(x, [crop["height"], crop["width"]])
        return normalize(x, s["mean"], s["std"])  # [B, 3, S, S]

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        x = self.preprocess(images.to(device=self.device, dtype=torch.float32)).to(self.dtype)
        text = self.tokenizer(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt").to(
            self.device
        )
        image_embeds = _features(self.model.get_image_features(pixel_values=x))  # [B, D]
        text_embeds = _features(self.model.get_text_features(**text))  # [B, D]
        image_embeds = image_embeds / image_embeds.norm(dim=-1, keepdim=True)
        text_embeds = text_embeds / text_embeds.norm(dim=-1, keepdim=True)
        return self.model.logit_scale.exp() * (image_embeds * text_embeds).sum(dim=-1)  # [B]


def _features(out) -> torch.Tensor:
    """transformers 5 returns an output object from ``get_*_features`` (projected: pooler_output)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output
