"""Compute, complete: FLOPs of every phase of one training iteration, per method, on the testbed's real models.

The ablation's compute unit counts transformer forwards only (a backward = 2). What a user pays for
also includes decoding every finished image with the VAE and scoring it with each reward model; on
this testbed those are a large share (G²RPO decodes and scores 9× as many images as DanceGRPO at
T = 6). This counts, with :class:`torch.utils.flop_counter.FlopCounterMode` (matmuls and
convolutions, forward and backward), one iteration of each method on the shipped unseen-scenes
shapes model and the learned rewards, phase by phase:

- ``sampling`` — the rollout's transformer forwards (``strategy.rollout``);
- ``decoding`` — the VAE decodes of the finished latents;
- ``reward`` — scoring every image with shapes_pref (hps_v21 head) and shapes_clip (clip head);
- ``training`` — ``strategy.loss_terms``' forwards and their backwards.

It reports the FLOPs per phase, the transformer-only share (sampling + training) beside the total,
and the ratio of each method's total to the transformer-only count, so the ablation's compute axis
can be read in full FLOPs. ``python -m benchmarks.flops`` writes
``benchmarks/results/flops/flops.json`` and ``flops.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.ablation import LEARNED_WEIGHTS, METHODS, SHARED_ALGORITHM, method_algorithm

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "flops"
MODEL = REPO / "g2rpo" / "models" / "shapes_flux_unseen"


def _count(fn) -> tuple[Any, int]:
    counter = FlopCounterMode(display=False)
    with counter:
        out = fn()
    return out, int(counter.get_total_flops())


def iteration_flops(method: str, num_steps: int, group_size: int, prompts: int, model: Path) -> dict[str, Any]:
    from g2rpo.config import load_config
    from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, decode_latents
    from g2rpo.models.loading import load_pipeline
    from g2rpo.rewards.config import RewardModelConfig
    from g2rpo.rewards.registry import build_reward
    from g2rpo.rewards.scoring import score_rewards
    from g2rpo.seeding import Draws
    from g2rpo.strategies.config import AlgorithmConfig
    from g2rpo.strategies.registry import build_strategy
    from g2rpo.tasks.shapes import all_scenes

    shared = {**SHARED_ALGORITHM, "num_steps": num_steps, "group_size": group_size}
    config = load_config(AlgorithmConfig, overrides=method_algorithm(method, shared))
    strategy = build_strategy(config)
    pipe = load_pipeline(model, dtype="float32")
    velocity = FluxVelocity(pipe.transformer, height=64, width=64, guidance=3.5)
    texts = [s.prompt for s in all_scenes()[:prompts]]
    cond = FluxTextEncoder.from_pipeline(pipe).encode(texts)
    heads = [build_reward(RewardModelConfig(name=n, weights=w)) for n, w in LEARNED_WEIGHTS.items()]
    draws = Draws(0, 0, tuple(range(prompts)))
    velocity.eval()
    with torch.no_grad():
        rollout, sampling = _count(lambda: strategy.rollout(velocity, cond, draws, velocity.latent_shape))
        images, decoding = _count(lambda: decode_latents(pipe.vae, rollout.final_latents, 64, 64, micro_batch=64))
        texts_of = [texts[int(p)] for p in rollout.final_prompt]
        rewards, reward = _count(lambda: score_rewards(heads, images, texts_of, [512] * len(heads)))
    rewards = rewards.reshape(rollout.reward_layout(len(heads)))
    advantages = strategy.advantages(rollout, rewards)
    velocity.train()

    def train() -> int:
        terms = 0
        for term in strategy.loss_terms(velocity, rollout, advantages):
            term.loss.backward()
            terms += 1
        return terms

    _, training = _count(train)
    phases = {"sampling": sampling, "decoding": decoding, "reward": reward, "training": training}
    total = sum(phases.values())
    transformer = sampling + training
    return {
        "method": method,
        "images": int(images.shape[0]),
        "sampling_forwards": int(rollout.nfe.sampling_forwards),
        "phases_flops": phases,
        "total_flops": total,
        "transformer_flops": transformer,
        "total_over_transformer": round(total / transformer, 3) if transformer else None,
        "share": {k: round(v / total, 4) for k, v in phases.items()},
    }


def table(rows: list[dict[str, Any]], num_steps: int, group_size: int, prompts: int) -> str:
    lines = [
        f"# FLOPs of one iteration by phase (T = {num_steps}, G = {group_size}, {prompts} prompts; "
        "torch FlopCounterMode, GFLOP)\n",
        "| method | images | sampling | decoding | reward | training | total | total / transformer-only |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = {k: v / 1e9 for k, v in r["phases_flops"].items()}
        lines.append(
            f"| {r['method']} | {r['images']} | {p['sampling']:.2f} | {p['decoding']:.2f} | {p['reward']:.2f} | "
            f"{p['training']:.2f} | {r['total_flops'] / 1e9:.2f} | {r['total_over_transformer']:.2f}× |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: " + ", ".join(METHODS))
    parser.add_argument("--num-steps", type=int, default=SHARED_ALGORITHM["num_steps"])
    parser.add_argument("--group-size", type=int, default=SHARED_ALGORITHM["group_size"])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration (the ablation's)")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for method in args.methods.split(","):
        rows.append(iteration_flops(method, args.num_steps, args.group_size, args.prompts, args.model))
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"flops-T{args.num_steps}-G{args.group_size}"
    (args.out / f"{stem}.json").write_text(
        json.dumps({"settings": vars(args) | {"model": str(args.model), "out": str(args.out)}, "rows": rows}, indent=1)
        + "\n"
    )
    md = table(rows, args.num_steps, args.group_size, args.prompts)
    (args.out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
