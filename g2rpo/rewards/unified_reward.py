"""UnifiedReward: a Qwen2.5-VL vision-language judge asked to rate an image against its prompt
(Wang et al. 2025, "Unified Reward Model for Multimodal Understanding and Generation").

Checkpoint: a transformers ``Qwen2_5_VLForConditionalGeneration`` folder with its processor files
(``config.json``, ``*.safetensors``, ``tokenizer.json``, ``preprocessor_config.json``, a chat
template), as ``CodeGoat24/UnifiedReward-qwen-7b`` is published (:data:`EXPECTED_CHECKPOINT`; the
``-3b`` / ``-32b`` sizes and ``UnifiedReward-2.0-qwen-*`` share the architecture and load the same
way). Loaded with ``from_pretrained(local_files_only=True)`` and held strict: a missing,
unexpected or mis-shaped weight is a :class:`~g2rpo.errors.G2RPOError` naming the keys
(transformers would initialise a missing weight at random with only a log line).

The prompt (:data:`SCORING_PROMPT`), one user turn holding the image and then the text, through the
checkpoint's own chat template. Like UnifiedReward's published pointwise image-generation prompt
it gives the caption, asks for two criteria (agreement with the caption: objects, attributes,
relations; visual quality: clarity, detail, colour, aesthetics) and an integer score from 1 to 5
after ``Final Score:``. Unlike it, the wording is this project's own and it does not ask the judge
to list the caption's elements first: in expectation mode the answer is read at once, so a
reasoning step could not happen anyway.

Two modes (``mode``):

- ``expectation`` (default): the assistant turn is pre-filled with :data:`ANSWER_PREFIX`
  (``"Final Score: "``), so the next token is the score. One forward pass over the batch (left
  padded, the processor's attention mask); at the last position the logits of the score tokens
  ``"1"`` … ``"5"`` alone go through a softmax, and the score is the expectation

      UnifiedReward(x, y) = Σ_v v · p_v,    p = softmax(logits[t_1], …, logits[t_5]),

  a float in [1, 5]: deterministic, always defined, differentiable in the logits. The loader
  checks that each score value is one token and that ``prefix + value`` tokenizes as ``prefix``
  followed by that token (otherwise the answer position would not hold the score).
- ``generate``: no pre-fill; greedy decoding (``do_sample=False``, no repetition penalty) of up to
  ``max_new_tokens`` tokens, then the number after the last ``Final Score:`` in the text
  (:func:`parse_score`). Text without one, or a number outside [1, 5], gives NaN, which
  :meth:`~g2rpo.rewards.base.RewardModel.score` reports by name and count.

Images: the float batch in [0, 1] goes to the checkpoint's ``Qwen2VLImageProcessor`` as tensors
(``do_rescale=False``): resized to multiples of ``patch_size · merge_size`` within its
``min_pixels``/``max_pixels``, normalised, patched. The published inference code resizes PIL
images with ``qwen_vl_utils`` first; here there is no PIL round trip. Gradients do not reach the
images (the processor works on detached copies): this is an evaluation metric.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel, require_dir

__all__ = [
    "UnifiedReward",
    "EXPECTED_CHECKPOINT",
    "SCORING_PROMPT",
    "ANSWER_PREFIX",
    "SCORE_VALUES",
    "MODES",
    "scoring_messages",
    "parse_score",
]

EXPECTED_CHECKPOINT = "CodeGoat24/UnifiedReward-qwen-7b"

SCORING_PROMPT = (
    "You see an image generated from a text caption. Judge it on two criteria:\n"
    "1. Caption agreement: are the objects, their attributes and their relations in the caption "
    "shown correctly?\n"
    "2. Visual quality: clarity, detail, colour and overall aesthetic appeal.\n"
    "Answer with an integer score from 1 (poor) to 5 (excellent) after 'Final Score:'.\n"
    "Text Caption: [{prompt}]"
)
ANSWER_PREFIX = "Final Score: "
SCORE_VALUES: tuple[int, ...] = (1, 2, 3, 4, 5)
MODES = ("expectation", "generate")

_FINAL_SCORE = re.compile(r"final\s+score\s*:\s*\**\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)


def scoring_messages(prompt: str) -> list[dict]:
    """The chat for one image: a user turn holding the image, then :data:`SCORING_PROMPT`."""
    return [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": SCORING_PROMPT.format(prompt=prompt)}],
        }
    ]


def parse_score(text: str) -> float:
    """The number after the last ``Final Score:`` in ``text``; NaN when absent or outside [1, 5]."""
    found = _FINAL_SCORE.findall(text)
    if not found:
        return math.nan
    value = float(found[-1])
    return value if SCORE_VALUES[0] <= value <= SCORE_VALUES[-1] else math.nan


class UnifiedReward(RewardModel):
    """UnifiedReward judge: expected 1–5 score under the judge's score-token distribution."""

    name = "unified_reward"

    def __init__(
        self,
        model,
        processor,
        *,
        mode: str = "expectation",
        max_new_tokens: int = 512,
        device="cpu",
        dtype=torch.float32,
    ):
        if mode not in MODES:
            raise G2RPOError(problem("unified_reward.mode", mode, f"use one of {', '.join(MODES)}"))
        if max_new_tokens < 1:
            raise G2RPOError(problem("unified_reward.max_new_tokens", max_new_tokens, "must be at least 1"))
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.processor = processor
        # Left padding puts every row's answer position at index -1 and is what generate() needs.
        self.processor.tokenizer.padding_side = "left"
        self.mode = mode
        self.max_new_tokens = max_new_tokens
        self.device = torch.device(device)
        self.dtype = dtype
        self.score_token_ids = _score_token_ids(processor.tokenizer)

    @classmethod
    def from_pretrained_dir(
        cls,
        model_dir: str | Path,
        *,
        processor_dir: str | Path | None = None,
        mode: str = "expectation",
        max_new_tokens: int = 512,
        device="cpu",
        dtype=torch.float32,
    ) -> UnifiedReward:
        """Load a Qwen2.5-VL judge folder (and its processor, from ``processor_dir`` or the same folder)."""
        from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

        what = f"a Qwen2.5-VL checkpoint folder such as {EXPECTED_CHECKPOINT} (config.json + *.safetensors)"
        model_path = require_dir("unified_reward.weights", model_dir, what)
        if not (model_path / "config.json").is_file():
            raise G2RPOError(problem("unified_reward.weights", str(model_path), f"has no config.json; pass {what}"))
        if not any(model_path.glob("*.safetensors")) and not any(model_path.glob("pytorch_model*.bin")):
            raise G2RPOError(
                problem(
                    "unified_reward.weights",
                    str(model_path),
                    f"holds no weights (*.safetensors); download the whole {EXPECTED_CHECKPOINT} folder",
                )
            )
        proc_path = require_dir(
            "unified_reward.tokenizer",
            processor_dir or model_path,
            "a folder with the judge's tokenizer, preprocessor_config.json and chat template",
        )
        try:
            model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(
                str(model_path), local_files_only=True, dtype=dtype, output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor of the wrong shape
            raise G2RPOError(
                problem(
                    "unified_reward.weights",
                    str(model_path),
                    f"cannot be loaded as Qwen2_5_VLForConditionalGeneration ({str(exc)[:300]})",
                )
            ) from None
        bad = {k: sorted(info.get(k) or [], key=str) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if any(bad.values()):
            parts = [
                f"{len(v)} {k.replace('_keys', '')} key(s): {', '.join(map(str, v[:8]))}" for k, v in bad.items() if v
            ]
            raise G2RPOError(
                problem(
                    "unified_reward.weights",
                    str(model_path),
                    "; ".join(parts) + f". The weights do not match config.json: pass the published "
                    f"{EXPECTED_CHECKPOINT} folder unchanged",
                )
            )
        try:
            processor = AutoProcessor.from_pretrained(str(proc_path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise G2RPOError(
                problem("unified_reward.tokenizer", str(proc_path), f"holds no usable processor ({str(exc)[:300]})")
            ) from None
        if not getattr(processor, "chat_template", None) or not hasattr(processor, "image_processor"):
            raise G2RPOError(
                problem(
                    "unified_reward.tokenizer",
                    str(proc_path),
                    "needs a Qwen2.5-VL processor with a chat template (chat_template.jinja / chat_template.json)",
                )
            )
        return cls(model, processor, mode=mode, max_new_tokens=max_new_tokens, device=device, dtype=dtype)

    # ------------------------------------------------------------------ inputs

    def inputs(self, images: torch.Tensor, prompts: Sequence[str], *, prefill: bool) -> dict:
        """Processor output for the batch (left padded), on the model's device and dtype."""
        texts = [
            self.processor.apply_chat_template(scoring_messages(p), tokenize=False, add_generation_prompt=True)
            + (ANSWER_PREFIX if prefill else "")
            for p in prompts
        ]
        pixels = images.detach().to(device="cpu", dtype=torch.float32)
        batch = self.processor(text=texts, images=list(pixels), padding=True, return_tensors="pt", do_rescale=False)
        batch = batch.to(self.device)
        batch["pixel_values"] = batch["pixel_values"].to(self.dtype)
        return batch

    # ------------------------------------------------------------------ scoring

    def score_probabilities(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """``[B, len(SCORE_VALUES)]``: softmax over the score tokens' logits at the answer position."""
        batch = self.inputs(images, prompts, prefill=True)
        logits = self.model(**batch).logits[:, -1, :]  # [B, V]: the position after ANSWER_PREFIX
        return torch.softmax(logits[:, self.score_token_ids].float(), dim=-1)  # [B, S]

    def generate_texts(self, images: torch.Tensor, prompts: Sequence[str]) -> list[str]:
        """The judge's greedy answers (without the prompt), one per image."""
        from transformers import GenerationConfig

        batch = self.inputs(images, prompts, prefill=False)
        tokenizer = self.processor.tokenizer
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            eos_token_id=self.model.generation_config.eos_token_id or tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        out = self.model.generate(**batch, generation_config=config)  # [B, T_in + T_new]
        new = out[:, batch["input_ids"].shape[1] :]
        return tokenizer.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        if self.mode == "generate":
            texts = self.generate_texts(images, prompts)
            return torch.tensor([parse_score(t) for t in texts], dtype=torch.float32)
        probs = self.score_probabilities(images, prompts)  # [B, S]
        values = torch.tensor(SCORE_VALUES, dtype=probs.dtype, device=probs.device)  # [S]
        return probs @ values  # [B]


def _score_token_ids(tokenizer) -> list[int]:
    """The token id of each score value; each must be one token that follows ANSWER_PREFIX as-is."""
    prefix = tokenizer(ANSWER_PREFIX, add_special_tokens=False).input_ids
    ids = []
    for value in SCORE_VALUES:
        token = tokenizer(str(value), add_special_tokens=False).input_ids
        joined = tokenizer(ANSWER_PREFIX + str(value), add_special_tokens=False).input_ids
        if len(token) != 1 or joined != prefix + token:
            raise G2RPOError(
                problem(
                    "unified_reward.tokenizer",
                    f"{ANSWER_PREFIX!r} + {str(value)!r} -> {joined}",
                    "the score value must be one token following the answer prefix: use the judge's own "
                    "Qwen2 tokenizer (digits are single tokens)",
                )
            )
        ids.append(token[0])
    return ids
