"""How much the official inference's 8-bit input moves each reward head's score.

Every reference implementation scores a PIL image (uint8; MixGRPO's UnifiedReward client a JPEG at
quality 95); g2rpo's heads score the float decoder output. This measures, per head,
``max |score(x) − score(round(255·x)/255)|`` over a batch of smooth random images (bicubic-upsampled
noise, like decoded images and unlike white noise) at two sizes, with the tiny random weights of
``g2rpo.rewards.tiny``: the size of the difference the audit in docs/rewards.md calls "uint8 round
trip". Scores are in each head's native scale; a tiny random head's score spread is not the
published model's, so the table reports the spread (std over the batch) next to the difference.

    python -m benchmarks.uint8_round_trip [--n 8] [--output benchmarks/results/uint8_round_trip.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.report import provenance, write_result
from g2rpo.rewards import tiny
from g2rpo.rewards.config import RewardModelConfig
from g2rpo.rewards.registry import build_reward

PROMPTS = ["a red cube on a blue sphere", "a cat in the snow", "two dogs on a beach at sunset", "a lighthouse"]


def smooth_images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """``[n, 3, size, size]`` in [0, 1]: 8×8 uniform noise upsampled bicubically (clamped)."""
    coarse = torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    return F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)


def heads(folder: Path) -> dict:
    hps = tiny.write_tiny_hps(folder / "hps")
    aes = tiny.write_tiny_aesthetic(folder / "aes")
    entries = [
        RewardModelConfig(name="hps_v21", weights=str(hps["checkpoint"]), arch_config=str(hps["open_clip_config"])),
        RewardModelConfig(name="clip", weights=str(tiny.write_tiny_open_clip_dir(folder / "clip", seed=1)["dir"])),
        RewardModelConfig(name="pickscore", weights=str(tiny.write_tiny_pickscore_dir(folder / "pick")["dir"])),
        RewardModelConfig(name="image_reward", weights=str(tiny.write_tiny_image_reward(folder / "ir")["checkpoint"])),
        RewardModelConfig(name="aesthetic", weights=str(aes["mlp"]), backbone=str(aes["clip_dir"])),
    ]
    return {entry.name: build_reward(entry) for entry in entries}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="images per size")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/uint8_round_trip.json"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, head in heads(Path(tmp)).items():
            for size in (64, 256):
                images = smooth_images(args.n, size)  # [N, 3, S, S]
                prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.n)]
                exact = head.score(images, prompts)  # [N]
                rounded = head.score((images * 255).round() / 255, prompts)  # [N]
                rows.append(
                    {
                        "reward": name,
                        "size": size,
                        "max_abs_diff": float((exact - rounded).abs().max()),
                        "score_std": float(exact.std()),
                    }
                )
    result = {**provenance("benchmarks.uint8_round_trip", argv, started), "n": args.n, "rows": rows}
    write_result(result, args.output, table)
    return result


def table(result: dict) -> str:
    lines = ["| reward | size | max abs(Δ score) | score std over the batch |", "| --- | ---: | ---: | ---: |"]
    lines += [
        f"| {r['reward']} | {r['size']}² | {r['max_abs_diff']:.1e} | {r['score_std']:.1e} |" for r in result["rows"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
