"""UnifiedReward: a Qwen2.5-VL vision-language judge that rates an image against its caption
(Wang et al. 2025, "Unified Reward Model for Multimodal Understanding and Generation"), asked and
read exactly as its authors' inference code asks and reads it.

Checkpoint: a transformers ``Qwen2_5_VLForConditionalGeneration`` folder with its processor files
(``config.json``, ``*.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``preprocessor_config.json``, a chat template), as ``CodeGoat24/UnifiedReward-qwen-7b`` is
published (:data:`EXPECTED_CHECKPOINT`; ``-3b`` / ``-32b`` load the same way). Loaded with
``from_pretrained(local_files_only=True)`` and held strict: a missing, unexpected or mis-shaped
weight is a :class:`~g2rpo.errors.G2RPOError` naming the keys (transformers would initialise a
missing weight at random with only a log line).

Two tasks, each an instruction the checkpoint was fine-tuned on. The instruction text is part of
the model's interface, like its tokenizer: other wording is another metric. Both strings are the
authors', character for character (sources and commits in docs/rewards.md):

- ``score`` (:data:`POINT_SCORE_INSTRUCTION`, UnifiedReward's
  ``inference_qwen/image_generation/qwen_point_score_image_generation.py``, also MixGRPO's
  ``QUESTION_TEMPLATE_SCORE``): list the caption's elements as ``element (type): 0/1``, then a
  1–5 score after ``Final Score:`` — the judge answers with decimals (``Final Score: 2.33``).
- ``semantic`` (:data:`SEMANTIC_INSTRUCTION`, ``qwen_point_score_ACS_image_generation.py``, also
  MixGRPO's ``QUESTION_TEMPLATE_SEMANTIC``): word-wise scores, then ``Alignment Score (1-5): X``,
  ``Coherence Score (1-5): Y``, ``Style Score (1-5): Z``. MixGRPO's published evaluation
  (``scripts/evaluate/eval_reward.sh``) uses this task and reports the Alignment score.

Each metric (:data:`METRICS`) names its task and the line it reads: ``unified_reward_score``,
``unified_reward_alignment``, ``unified_reward_coherence``, ``unified_reward_style``.

The chat: one user turn holding the image, then the instruction with the caption in
``Text Caption: [...]``, through the checkpoint's own chat template with the generation prompt
(Qwen2.5-VL's adds its default system turn). The answer: ``model.generate`` with the checkpoint's
``generation_config.json`` as loaded (what the official script's ``model.generate(**inputs,
max_new_tokens=...)`` uses), the official ``max_new_tokens`` (512 for ``score``, 4096 for
``semantic``), decoded with ``skip_special_tokens=True``. The number: the *first* match of the
official pattern, ``Final Score:\\s*([0-5](?:\\.\\d+)?)`` (or ``Alignment Score \\(1-5\\):\\s*…``;
Coherence and Style by the same pattern), case-sensitive, as MixGRPO's ``extract_final_score`` /
``extract_alignment_score`` (:func:`parse_answer`). No match is a failed item: MixGRPO records
success=False, stores 0.0 and leaves the item out of the mean; here its score is NaN, which
:meth:`~g2rpo.rewards.base.RewardModel.score` reports by name and count, so no caller can average
a failure as a 0.

dtype: ``"auto"`` by default, the checkpoint's stored dtype (bfloat16 for the published judges),
as the official script's ``torch_dtype="auto"``.

Images: the float batch in [0, 1] is first rounded to 8-bit levels (the official path hands the
processor a PIL image: uint8), then goes to the checkpoint's ``Qwen2VLImageProcessor`` as tensors
(``do_rescale=False``): resized to multiples of ``patch_size · merge_size`` within its
``min_pixels``/``max_pixels`` (the same bounds as ``qwen_vl_utils``), normalised, patched. Not
reproduced: ``qwen_vl_utils`` resizes the PIL image itself (PIL bicubic on uint8) where here the
processor resizes the float tensor, and MixGRPO's client sends JPEG at quality 95. Gradients do not
reach the images: this is an evaluation metric.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel, require_dir

__all__ = [
    "UnifiedReward",
    "EXPECTED_CHECKPOINT",
    "POINT_SCORE_INSTRUCTION",
    "SEMANTIC_INSTRUCTION",
    "Task",
    "TASKS",
    "METRICS",
    "judge_messages",
    "parse_answer",
]

EXPECTED_CHECKPOINT = "CodeGoat24/UnifiedReward-qwen-7b"

# The authors' instructions, verbatim (the checkpoint was fine-tuned on them); ``{prompt}`` is the
# caption. Sources and commits: docs/rewards.md, "UnifiedReward".
POINT_SCORE_INSTRUCTION = (
    "You are given a text caption and a generated image based on that caption. Your task is to evaluate this "
    "image based on two key criteria:\n"
    "1. Alignment with the Caption: Assess how well this image aligns with the provided caption. Consider the "
    "accuracy of depicted objects, their relationships, and attributes as described in the caption.\n"
    "2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail preservation, "
    "color accuracy, and overall aesthetic appeal.\n"
    "Extract key elements from the provided text caption, evaluate their presence in the generated image using "
    "the format: 'element (type): value' (where value=0 means not generated, and value=1 means generated), and "
    "assign a score from 1 to 5 after 'Final Score:'.\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)

SEMANTIC_INSTRUCTION = (
    "You are presented with a generated image and its associated text caption. Your task is to analyze the image "
    "across multiple dimensions in relation to the caption. Specifically:\n\n"
    "1. Evaluate each word in the caption based on how well it is visually represented in the image. Assign a "
    "numerical score to each word using the format:\n"
    '   Word-wise Scores: [["word1", score1], ["word2", score2], ..., ["wordN", scoreN], ["[No_mistakes]", '
    "scoreM]]\n"
    "   - A higher score indicates that the word is less well represented in the image.\n"
    "   - The special token [No_mistakes] represents whether all elements in the caption were correctly depicted. "
    "A high score suggests no mistakes; a low score suggests missing or incorrect elements.\n\n"
    "2. Provide overall assessments for the image along the following axes (each rated from 1 to 5):\n"
    "- Alignment Score: How well the image matches the caption in terms of content.\n"
    "- Coherence Score: How logically consistent the image is (absence of visual glitches, object distortions, "
    "etc.).\n"
    "- Style Score: How aesthetically appealing the image looks, regardless of caption accuracy.\n\n"
    "Output your evaluation using the format below:\n\n"
    "---\n\n"
    'Word-wise Scores: [["word1", score1], ..., ["[No_mistakes]", scoreM]]\n\n'
    "Alignment Score (1-5): X\n"
    "Coherence Score (1-5): Y\n"
    "Style Score (1-5): Z\n\n"
    "Your task is provided as follows:\n"
    "Text Caption: [{prompt}]"
)


@dataclass(frozen=True)
class Task:
    """One instruction the judge was trained on and how long its answer may be."""

    name: str
    instruction: str
    max_new_tokens: int  # the official script's


TASKS: dict[str, Task] = {
    "score": Task("score", POINT_SCORE_INSTRUCTION, 512),
    "semantic": Task("semantic", SEMANTIC_INSTRUCTION, 4096),
}

# metric name -> (task, the label whose number is read). MixGRPO's patterns: one digit 0–5 and an
# optional decimal part, first match, case-sensitive.
_NUMBER = r"\s*([0-5](?:\.\d+)?)"
METRICS: dict[str, tuple[str, re.Pattern[str]]] = {
    "unified_reward_score": ("score", re.compile(r"Final Score:" + _NUMBER)),
    "unified_reward_alignment": ("semantic", re.compile(r"Alignment Score \(1-5\):" + _NUMBER)),
    "unified_reward_coherence": ("semantic", re.compile(r"Coherence Score \(1-5\):" + _NUMBER)),
    "unified_reward_style": ("semantic", re.compile(r"Style Score \(1-5\):" + _NUMBER)),
}


def judge_messages(task: str, prompt: str) -> list[dict]:
    """The chat for one image: a user turn holding the image, then the task's instruction."""
    text = TASKS[task].instruction.format(prompt=prompt)
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def parse_answer(metric: str, text: str) -> float:
    """The number the official parser reads for ``metric`` from the judge's answer; NaN if none."""
    match = METRICS[metric][1].search(text)
    return float(match.group(1)) if match else math.nan


class UnifiedReward(RewardModel):
    """UnifiedReward judge: its generated answer to the official instruction, parsed officially."""

    def __init__(
        self,
        model,
        processor,
        *,
        metric: str = "unified_reward_score",
        max_new_tokens: int | None = None,
        device="cpu",
    ):
        if metric not in METRICS:
            raise G2RPOError(problem("unified_reward.metric", metric, f"use one of {', '.join(METRICS)}"))
        if max_new_tokens is not None and max_new_tokens < 1:
            raise G2RPOError(problem(f"{metric}.max_new_tokens", max_new_tokens, "must be at least 1"))
        self.name = metric
        self.task = TASKS[METRICS[metric][0]]
        self.max_new_tokens = max_new_tokens or self.task.max_new_tokens
        self.model = model.to(device=device).eval().requires_grad_(False)
        self.processor = processor
        # Left padding puts every row's prompt flush against its answer, which generate() needs.
        self.processor.tokenizer.padding_side = "left"
        self.device = torch.device(device)
        self.dtype = self.model.dtype

    @classmethod
    def from_pretrained_dir(
        cls,
        model_dir: str | Path,
        *,
        processor_dir: str | Path | None = None,
        metric: str = "unified_reward_score",
        max_new_tokens: int | None = None,
        device="cpu",
        dtype: torch.dtype | str = "auto",
    ) -> UnifiedReward:
        """Load a Qwen2.5-VL judge folder (and its processor, from ``processor_dir`` or the same
        folder); ``dtype="auto"`` keeps the checkpoint's stored dtype, as the official loader."""
        from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

        if metric not in METRICS:  # before loading gigabytes
            raise G2RPOError(problem("unified_reward.metric", metric, f"use one of {', '.join(METRICS)}"))
        what = f"a Qwen2.5-VL checkpoint folder such as {EXPECTED_CHECKPOINT} (config.json + *.safetensors)"
        field = f"{metric}.weights"
        model_path = require_dir(field, model_dir, what)
        if not (model_path / "config.json").is_file():
            raise G2RPOError(problem(field, str(model_path), f"has no config.json; pass {what}"))
        if not any(model_path.glob("*.safetensors")) and not any(model_path.glob("pytorch_model*.bin")):
            raise G2RPOError(
                problem(
                    field,
                    str(model_path),
                    f"holds no weights (*.safetensors); download the whole {EXPECTED_CHECKPOINT} folder",
                )
            )
        proc_path = require_dir(
            f"{metric}.tokenizer",
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
                    field, str(model_path), f"cannot be loaded as Qwen2_5_VLForConditionalGeneration ({str(exc)[:300]})"
                )
            ) from None
        bad = {k: sorted(info.get(k) or [], key=str) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if any(bad.values()):
            parts = [
                f"{len(v)} {k.replace('_keys', '')} key(s): {', '.join(map(str, v[:8]))}" for k, v in bad.items() if v
            ]
            raise G2RPOError(
                problem(
                    field,
                    str(model_path),
                    "; ".join(parts) + f". The weights do not match config.json: pass the published "
                    f"{EXPECTED_CHECKPOINT} folder unchanged",
                )
            )
        try:
            processor = AutoProcessor.from_pretrained(str(proc_path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise G2RPOError(
                problem(f"{metric}.tokenizer", str(proc_path), f"holds no usable processor ({str(exc)[:300]})")
            ) from None
        if not getattr(processor, "chat_template", None) or not hasattr(processor, "image_processor"):
            raise G2RPOError(
                problem(
                    f"{metric}.tokenizer",
                    str(proc_path),
                    "needs a Qwen2.5-VL processor with a chat template (chat_template.jinja / chat_template.json)",
                )
            )
        return cls(model, processor, metric=metric, max_new_tokens=max_new_tokens, device=device)

    # ------------------------------------------------------------------ inputs

    def chat_text(self, prompt: str) -> str:
        """The templated text the judge reads for one caption (the image as one ``<|image_pad|>``)."""
        messages = judge_messages(self.task.name, prompt)
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def inputs(self, images: torch.Tensor, prompts: Sequence[str]) -> dict:
        """Processor output for the batch (left padded), on the model's device and dtype."""
        # 8-bit levels, as the PIL image the official code hands the processor.
        pixels = (images.detach().to(device="cpu", dtype=torch.float32) * 255.0).round() / 255.0
        texts = [self.chat_text(p) for p in prompts]
        batch = self.processor(text=texts, images=list(pixels), padding=True, return_tensors="pt", do_rescale=False)
        batch = batch.to(self.device)
        batch["pixel_values"] = batch["pixel_values"].to(self.dtype)
        return batch

    # ------------------------------------------------------------------ scoring

    def generate_ids(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """``[B, T_new]``: the judge's answer tokens (right-padded), under the checkpoint's
        generation config with the task's ``max_new_tokens``."""
        batch = self.inputs(images, prompts)
        config = self.model.generation_config
        pad = config.pad_token_id if config.pad_token_id is not None else self.processor.tokenizer.pad_token_id
        out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, pad_token_id=pad)  # [B, T_in + T_new]
        return out[:, batch["input_ids"].shape[1] :]

    def generate_texts(self, images: torch.Tensor, prompts: Sequence[str]) -> list[str]:
        """The judge's answers (without the prompt), one per image, decoded as the official script."""
        new = self.generate_ids(images, prompts)
        return self.processor.tokenizer.batch_decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        texts = self.generate_texts(images, prompts)
        return torch.tensor([parse_answer(self.name, t) for t in texts], dtype=torch.float32)  # [B]
