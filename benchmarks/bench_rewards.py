"""Reward-head throughput: batched torch scoring vs one image at a time through PIL, as the
reference packages score.

For every registered head, tiny weights are written in the published layouts
(:mod:`g2rpo.rewards.tiny`) and N decoded-looking images (float [0, 1], larger than the model's
input so that preprocessing resizes) are scored two ways with the *same* loaded model:

- ``batched``: ``head.score(images, prompts)`` — one call, torch preprocessing on the batch.
- ``per_image_pil``: what hpsv2 / image-reward / the PickScore model card / the G²RPO scripts do:
  convert each image to a uint8 PIL image, run the reference package's kind of transform (PIL
  resize for open_clip, ImageReward and PickScore's processor; ToTensor + tensor resize for
  hpsv2; the Qwen2.5-VL processor on the PIL image for UnifiedReward), tokenize the one prompt,
  forward a batch of 1. Weight-free heads: ``score`` per image.

Timing: ``time.perf_counter``, one warm-up, the best of ``--repeats`` runs, ``torch`` on
``--threads`` threads. Writes ``benchmarks/results/bench_rewards.json`` and prints a table.

Both paths must compute the same reward: the images hold uint8 levels (k/255), so the PIL
conversion is lossless, and each row records ``max_abs_diff`` = max |batched − per-image| over the
images. It is float rounding for hps_v21 (hpsv2 resizes the tensor with the same kernel) and the
weight-free heads, and the PIL-vs-torch resize difference for the heads whose references resize a
PIL image (docs/rewards.md, "Resizing").

What the ratio means at tiny size: the models here are ~10⁵–10⁶ parameters, so a forward costs
about as much as the Python, tokenizer and PIL work around it; the ratio measures how much
per-call overhead batching removes. At full size (ViT-H-14, ≈ 1 B parameters, seconds per image
on a CPU) the forward dominates and the CPU ratio tends to ~1×; on a GPU, batching keeps the
device busy instead, which this CPU benchmark does not measure.

Usage: ``python -m benchmarks.bench_rewards [--n 32] [--size 64] [--repeats 3] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _pil(image: torch.Tensor):
    from PIL import Image

    array = (image.permute(1, 2, 0).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return Image.fromarray(array)


def _time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _per_image_open_clip(head, transform):
    """hpsv2 / open_clip reference loop: PIL → transform → encode (batch of 1) → cosine."""

    def run(images, prompts):
        out = []
        with torch.no_grad():
            for image, prompt in zip(images, prompts):
                x = transform(_pil(image)).unsqueeze(0)
                f_img = torch.nn.functional.normalize(head.model.encode_image(x), dim=-1)
                f_txt = torch.nn.functional.normalize(head.model.encode_text(head.tokenizer([prompt])), dim=-1)
                out.append(float((f_img * f_txt).sum()))
        return out

    return run


def build_cases(folder: Path):
    from torchvision import transforms as T

    from g2rpo.rewards import tiny
    from g2rpo.rewards.base import normalize, resize_longest_pad
    from g2rpo.rewards.config import RewardModelConfig
    from g2rpo.rewards.registry import build_reward

    hps = tiny.write_tiny_hps(folder / "hps")
    clip = tiny.write_tiny_open_clip_dir(folder / "clip")
    pick = tiny.write_tiny_pickscore_dir(folder / "pick")
    ir = tiny.write_tiny_image_reward(folder / "ir")
    aes = tiny.write_tiny_aesthetic(folder / "aes")

    cases = {}

    head = build_reward(RewardModelConfig(name="hps_v21", weights=str(hps["checkpoint"].parent)))
    size = head.preprocess_cfg["size"][0]
    mean, std = head.preprocess_cfg["mean"], head.preprocess_cfg["std"]
    hps_transform = T.Compose([T.ToTensor(), lambda x: normalize(resize_longest_pad(x[None], size), mean, std)[0]])
    cases["hps_v21"] = (head, _per_image_open_clip(head, hps_transform))

    from open_clip.transform import PreprocessCfg, image_transform_v2

    head = build_reward(RewardModelConfig(name="clip", weights=str(clip["dir"])))
    transform = image_transform_v2(PreprocessCfg(**head.preprocess_cfg), is_train=False)
    cases["clip"] = (head, _per_image_open_clip(head, transform))

    head = build_reward(RewardModelConfig(name="pickscore", weights=str(pick["dir"])))
    from transformers.models.clip import CLIPImageProcessorPil

    processor = CLIPImageProcessorPil.from_pretrained(str(pick["dir"]))

    def pickscore_single(images, prompts, head=head):
        out = []
        with torch.no_grad():
            for image, prompt in zip(images, prompts):
                px = processor(images=_pil(image), return_tensors="pt").pixel_values
                text = head.tokenizer([prompt], padding=True, truncation=True, max_length=77, return_tensors="pt")
                i = head.model.get_image_features(pixel_values=px).pooler_output
                t = head.model.get_text_features(**text).pooler_output
                i, t = i / i.norm(dim=-1, keepdim=True), t / t.norm(dim=-1, keepdim=True)
                out.append(float(head.model.logit_scale.exp() * (i * t).sum()))
        return out

    cases["pickscore"] = (head, pickscore_single)

    head = build_reward(RewardModelConfig(name="image_reward", weights=str(ir["checkpoint"])))
    from g2rpo.rewards.base import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    n_px = head.net.image_size
    ir_transform = T.Compose(
        [
            T.Resize(n_px, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(n_px),
            T.ToTensor(),
            T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
        ]
    )

    def image_reward_single(images, prompts, head=head):
        out = []
        with torch.no_grad():
            for image, prompt in zip(images, prompts):
                x = ir_transform(_pil(image)).unsqueeze(0)
                tok = head.tokenizer(prompt, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
                out.append(float(head.net(x, tok.input_ids, tok.attention_mask)[0]))
        return out

    cases["image_reward"] = (head, image_reward_single)

    head = build_reward(RewardModelConfig(name="aesthetic", weights=str(aes["mlp"]), backbone=str(aes["clip_dir"])))
    aes_transform = image_transform_v2(PreprocessCfg(**head.clip.preprocess_cfg), is_train=False)

    def aesthetic_single(images, prompts, head=head):
        out = []
        with torch.no_grad():
            for image in images:
                e = head.clip.model.encode_image(aes_transform(_pil(image)).unsqueeze(0))
                out.append(float(head.mlp(e / e.norm(dim=-1, keepdim=True))[0]))
        return out

    cases["aesthetic"] = (head, aesthetic_single)

    from g2rpo.rewards.unified_reward import judge_messages, parse_answer

    # A random judge writes no score; this one is rewired to answer, so both paths parse a number.
    ur = tiny.write_tiny_unified_reward(folder / "unified_reward", answer="Final Score: 2.35")
    metric = "unified_reward_score"
    head = build_reward(RewardModelConfig(name=metric, weights=str(ur["dir"]), max_new_tokens=12))

    def unified_reward_single(images, prompts, head=head):
        """The published inference code's shape: one PIL image and one chat per generate call."""
        out = []
        with torch.no_grad():
            for image, prompt in zip(images, prompts):
                chat = head.processor.apply_chat_template(
                    judge_messages("score", prompt), tokenize=False, add_generation_prompt=True
                )
                inputs = head.processor(text=[chat], images=[_pil(image)], return_tensors="pt")
                ids = head.model.generate(**inputs, max_new_tokens=12)[0, inputs["input_ids"].shape[1] :]
                out.append(parse_answer(metric, head.processor.tokenizer.decode(ids, skip_special_tokens=True)))
        return out

    cases[metric] = (head, unified_reward_single)

    for name in ("jpeg_compressibility", "sharpness", "total_variation"):
        head = build_reward(name)
        cases[name] = (
            head,
            lambda images, prompts, head=head: [
                head.score(images[i : i + 1], prompts[i : i + 1]) for i in range(len(prompts))
            ],
        )
    return cases


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="images per measurement (default 32)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (default 64; tiny models take 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs, best kept (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--output", default=str(RESULTS / "bench_rewards.json"), help="JSON output path")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (args.n, 3, args.size, args.size)).float() / 255.0  # uint8 levels: PIL-lossless
    prompts = [f"a photo of a cat number {i} sitting on a red chair" for i in range(args.n)]

    rows = []
    with tempfile.TemporaryDirectory(prefix="g2rpo-bench-rewards-") as tmp:
        cases = build_cases(Path(tmp))
        for name, (head, single) in cases.items():
            batched_s = _time(lambda head=head: head.score(images, prompts), args.repeats)
            single_s = _time(lambda single=single: single(images, prompts), args.repeats)
            batched = head.score(images, prompts)
            per_image = torch.tensor([float(v) for v in single(images, prompts)])
            rows.append(
                {
                    "reward": name,
                    "batched_images_per_s": args.n / batched_s,
                    "per_image_pil_images_per_s": args.n / single_s,
                    "speedup": single_s / batched_s,
                    "max_abs_diff": float((batched - per_image).abs().max()),
                }
            )
    result = {
        "benchmark": "bench_rewards",
        "n_images": args.n,
        "image_size": args.size,
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "note": "tiny random-weight models (≈1e5–1e6 parameters): the ratio measures per-call overhead removed by batching, not model compute",
        "rows": rows,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{'reward':<22}{'batched img/s':>15}{'per-image PIL img/s':>22}{'ratio':>8}{'max |Δ score|':>15}")
    for row in rows:
        print(
            f"{row['reward']:<22}{row['batched_images_per_s']:>15.1f}{row['per_image_pil_images_per_s']:>22.1f}"
            f"{row['speedup']:>7.1f}×{row['max_abs_diff']:>15.2e}"
        )
    print(
        f"({args.n} images of {args.size}×{args.size}, {args.threads} thread(s), best of {args.repeats}; JSON: {out})"
    )
    return result


if __name__ == "__main__":
    main()
