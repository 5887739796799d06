"""Print |ours − reference| for every parity fixture image (a Markdown table for docs/parity.md).

Runs in the main ``.venv`` (the project's heads), not in a reference env:

    OMP_NUM_THREADS=1 .venv/bin/python parity/report_differences.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "rewards"))
import test_rewards_parity as parity  # noqa: E402  (fixture loaders shared with the tests)


def heads():
    from g2rpo.rewards.hps import HPSv21
    from g2rpo.rewards.image_reward import ImageReward

    folder, expected, prompts = parity.read_fixture("hps_v21")
    yield (
        "hps_v21",
        HPSv21.from_checkpoint(folder / expected["checkpoint"], open_clip_config=folder / "open_clip_config.json"),
        folder,
        expected,
        prompts,
    )
    folder, expected, prompts = parity.read_fixture("image_reward")
    yield (
        "image_reward",
        ImageReward.from_checkpoint(
            folder / expected["checkpoint"],
            med_config=folder / "med_config.json",
            vision_config=folder / "vision_config.json",
            tokenizer_dir=folder / "tokenizer",
        ),
        folder,
        expected,
        prompts,
    )


def main() -> None:
    print("| reward | image | reference | ours | abs diff |")
    print("|---|---|---|---|---|")
    for name, head, folder, expected, prompts in heads():
        for group in ("native", "resized"):
            for image, prompt, reference in zip(
                expected[group]["images"], prompts[group], expected[group]["scores"], strict=True
            ):
                ours = head.score(parity.load_png(folder / image), [prompt]).item()
                print(f"| {name} | {Path(image).name} | {reference:.8f} | {ours:.8f} | {abs(ours - reference):.1e} |")


if __name__ == "__main__":
    main()
