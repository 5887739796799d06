"""Do the strides disagree? The per-stride advantages of G²RPO's first rollout, compared with their sum.

MGAI (docs/algorithm.md §4) adds, for each branch, the group-normalised advantages of the same
branch finished at several strides λ ∈ Λ. It can only matter when the strides rank a group's
branches differently; if every stride ranks them alike, the summed advantage is a rescaled
single-stride one, which AdamW's normalisation makes the same update.

For one G²RPO rollout of the base model (the first iteration of a run: the same draws the
trainer makes for ``train.seed``), this scores every finished image with the reward setting's
models and, for every group (prompt p, branch step k; G branches), compares

    A_λ[g] = Σ_r w_r · groupnorm_G(R_r[p, k, λ, g])     (each stride's advantage, rewards combined)
    A_Σ[g] = Σ_λ A_λ[g]                                   (what G²RPO trains on)

by their Pearson correlation over g and the fraction of branches whose signs agree, reported as
medians (and quartiles) over the groups, per stride and per reward. The sum contains each stride,
so that part-whole correlation is high even for unrelated strides (≈ 1/√J for J independent ones);
two figures without that overlap are reported beside it: the *pairwise* correlation corr(A_λ, A_μ)
over every pair of strides, and the *leave-one-out* correlation corr(A_λ, Σ_{μ≠λ} A_μ). It also reports how much a
branch's reward moves with the stride relative to how much it moves across branches: the *stride
jitter* = mean over branches of std_λ R / std_g R (0: the stride never changes a score), and the
*residual* jitter, the same after each stride's group mean is taken out (what group normalisation
leaves: a finish that shifts every branch alike changes no advantage).

Usage: ``python -m benchmarks.stride_agreement --rewards learned --num-steps 6 --group-size 6
--prompts 32`` (and ``--num-steps 16 --group-size 12 --prompts 8``); results in
``benchmarks/results/stride_agreement/``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "stride_agreement"
MODEL = REPO / "g2rpo" / "models" / "shapes_flux_unseen"
CLIP = REPO / "g2rpo" / "models" / "shapes_clip"
PREF = REPO / "g2rpo" / "models" / "shapes_pref"
# Reward settings: (name, weights folder or None for the exact, weight-free heads).
SETTINGS: dict[str, list[tuple[str, str | None]]] = {
    "exact": [("shapes_colour", None), ("shapes_shape", None)],
    "learned": [("hps_v21", str(PREF)), ("clip", str(CLIP))],
    # the positive control for MGAI (issue 41 §2): fine texture, decided by the last steps (g2rpo.rewards.shapes)
    "texture": [("shapes_texture", None)],
    # the same beside the task's exact rewards: a learnable part (colour, shape) and a part the finish decides
    "texture_task": [("shapes_colour", None), ("shapes_shape", None), ("shapes_texture", None)],
}


def _quartiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(q[1], 4), "q1": round(q[0], 4), "q3": round(q[2], 4)}


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a - a.mean(), b - b.mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else None


def agreement(rewards: torch.Tensor, strides: list[int], names: list[str]) -> dict[str, Any]:
    """The figures above from rewards ``[R, P, K, J, G]`` (pure: tested on hand-made tensors)."""
    from g2rpo import core

    adv = core.group_advantages(rewards.double())  # [R, P, K, J, G]
    groups: dict[str, torch.Tensor] = {"all rewards": adv.sum(0)}  # [P, K, J, G]
    if len(names) > 1:
        groups.update({name: adv[r] for r, name in enumerate(names)})
    out: dict[str, Any] = {}
    for label, a in groups.items():
        per_stride = {}
        summed = a.sum(2)  # [P, K, G]
        for j, lam in enumerate(strides):
            corr, signs = [], []
            for p in range(a.shape[0]):
                for k in range(a.shape[1]):
                    c = _pearson(a[p, k, j], summed[p, k])
                    if c is None:
                        continue  # a constant group: no ranking to agree with
                    corr.append(c)
                    nonzero = summed[p, k] != 0
                    signs.append(float((a[p, k, j].sign() == summed[p, k].sign())[nonzero].double().mean()))
            rest = [  # corr(A_λ, Σ_{μ≠λ} A_μ): the other strides' verdict, without A_λ in it
                c
                for p in range(a.shape[0])
                for k in range(a.shape[1])
                if (c := _pearson(a[p, k, j], summed[p, k] - a[p, k, j])) is not None
            ]
            per_stride[f"stride {lam}"] = {
                "groups": len(corr),
                "correlation": _quartiles(corr) if corr else None,
                "sign_agreement": _quartiles(signs) if signs else None,
                "leave_one_out": _quartiles(rest) if rest else None,
            }
        pairs = {}
        for i, lam in enumerate(strides):
            for j in range(i + 1, len(strides)):
                values = [
                    c
                    for p in range(a.shape[0])
                    for k in range(a.shape[1])
                    if (c := _pearson(a[p, k, i], a[p, k, j])) is not None
                ]
                pairs[f"{lam}-{strides[j]}"] = _quartiles(values) if values else None
        if pairs:
            per_stride["pairwise"] = pairs
        out[label] = per_stride
    r = rewards.double()  # [R, P, K, J, G]
    across_strides = r.std(3).mean(-1)  # [R, P, K]: mean over branches of std over strides
    across_branches = r.std(-1).mean(3)  # [R, P, K]: std over branches, mean over strides
    ratio = across_strides / across_branches.clamp_min(1e-12)
    out["stride_jitter"] = {name: _quartiles(ratio[i].flatten().tolist()) for i, name in enumerate(names)}
    # What group normalisation leaves: a stride that moves every branch alike (a sharper or blurrier
    # finish) changes no advantage, so the residual jitter takes each stride's group mean out first.
    centred = r - r.mean(-1, keepdim=True)  # [R, P, K, J, G]
    residual = centred.std(3).mean(-1) / across_branches.clamp_min(1e-12)  # [R, P, K]
    out["residual_stride_jitter"] = {name: _quartiles(residual[i].flatten().tolist()) for i, name in enumerate(names)}
    return out


def measure(
    setting: str,
    num_steps: int,
    group_size: int,
    prompts: int,
    seed: int,
    model: Path,
    granularities: list[int] | None = None,
    prompt_order: str = "first",
) -> dict[str, Any]:
    from g2rpo.config import load_config
    from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, decode_latents
    from g2rpo.models.loading import load_pipeline
    from g2rpo.rewards.config import RewardModelConfig
    from g2rpo.rewards.registry import build_reward
    from g2rpo.rewards.scoring import score_rewards
    from g2rpo.seeding import Draws
    from g2rpo.strategies.config import AlgorithmConfig
    from g2rpo.strategies.registry import build_strategy
    from g2rpo.tasks.shapes import all_scenes, unseen_scenes

    started = time.monotonic()
    config = load_config(
        AlgorithmConfig,
        overrides={
            "strategy": "g2rpo",
            "num_steps": num_steps,
            "group_size": group_size,
            "micro_batch": 256,
            **({"g2rpo": {"granularities": granularities}} if granularities else {}),
        },
    )
    strategy = build_strategy(config)
    pipe = load_pipeline(model, dtype="float32")
    velocity = FluxVelocity(pipe.transformer, height=64, width=64, guidance=3.5).eval()
    unseen = unseen_scenes(96)
    training = [s.prompt for s in all_scenes() if s not in unseen]  # training prompts only
    # "first": the first in the task's order (one shape and colour for a few dozen prompts); "spread": a seeded
    # sample over every attribute (the texture control asks by size, so it needs both sizes)
    texts = training[:prompts] if prompt_order == "first" else random.Random(seed).sample(training, prompts)
    cond = FluxTextEncoder.from_pipeline(pipe).encode(texts)
    draws = Draws(seed, 0, tuple(range(prompts)))
    with torch.no_grad():
        rollout = strategy.rollout(velocity, cond, draws, velocity.latent_shape)
        images = decode_latents(pipe.vae, rollout.final_latents, 64, 64, micro_batch=64)
    heads = [build_reward(RewardModelConfig(name=n, weights=w) if w else n, device="cpu") for n, w in SETTINGS[setting]]
    finished_prompts = [texts[int(p)] for p in rollout.final_prompt]
    rewards = score_rewards(heads, images, finished_prompts, [512] * len(heads))  # [R, N]
    rewards = rewards.reshape(rollout.reward_layout(len(heads)))  # [R, P, K, J, G]
    strides = list(strategy.strides)
    return {
        "rewards": setting,
        "reward_models": [n for n, _ in SETTINGS[setting]],
        "num_steps": num_steps,
        "group_size": group_size,
        "strides": strides,
        "prompts": prompts,
        "prompt_order": prompt_order,
        "branch_steps_per_prompt": int(rollout.reward_shape[1]),
        "groups": prompts * int(rollout.reward_shape[1]),
        "seed": seed,
        "model": model.name,
        "seconds": round(time.monotonic() - started, 1),
        "agreement": agreement(rewards, strides, [n for n, _ in SETTINGS[setting]]),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "# Do the strides disagree?\n",
        "Each stride's advantage (rewards combined) against the summed one G²RPO trains on, over the groups of "
        "one rollout of the base model (training prompts); medians [quartiles] over groups. "
        "Stride jitter: mean over branches of std over strides / std over branches (0 = strides never change a score).\n",
        "| rewards | T | G | groups | stride | correlation with Σ | leave-one-out | sign agreement |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def q(x: dict[str, float] | None) -> str:
        return f"{x['median']:.3f} [{x['q1']:.3f}, {x['q3']:.3f}]" if x else "—"

    for r in results:
        for stride, figures in r["agreement"]["all rewards"].items():
            if stride == "pairwise":
                continue
            lines.append(
                f"| {r['rewards']} | {r['num_steps']} | {r['group_size']} | {figures['groups']} | {stride.split()[1]} | "
                f"{q(figures['correlation'])} | {q(figures.get('leave_one_out'))} | {q(figures['sign_agreement'])} |"
            )
    lines += ["", "| rewards | T | G | strides | pairwise correlation corr(A_λ, A_μ) |", "|---|---|---|---|---|"]
    for r in results:
        for pair, x in r["agreement"]["all rewards"].get("pairwise", {}).items():
            lines.append(f"| {r['rewards']} | {r['num_steps']} | {r['group_size']} | {pair} | {q(x)} |")
    lines += ["", "| rewards | T | G | reward | stride jitter | residual stride jitter |", "|---|---|---|---|---|---|"]
    for r in results:
        residual = r["agreement"].get("residual_stride_jitter", {})
        for name, q in r["agreement"]["stride_jitter"].items():
            rq = residual.get(name)
            rest = f"{rq['median']:.3f} [{rq['q1']:.3f}, {rq['q3']:.3f}]" if rq else "—"
            lines.append(
                f"| {r['rewards']} | {r['num_steps']} | {r['group_size']} | {name} | "
                f"{q['median']:.3f} [{q['q1']:.3f}, {q['q3']:.3f}] | {rest} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rewards", default="exact,learned", help=f"settings, comma-separated: {', '.join(SETTINGS)}")
    parser.add_argument("--arms", default="6x6x32,16x12x8", help="T x G x prompts, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="the run seed whose first rollout is measured")
    parser.add_argument("--granularities", default=None, help="Λ, comma-separated (default G²RPO's [1, 2, 3])")
    parser.add_argument("--model", type=Path, default=MODEL, help="the base shapes model")
    parser.add_argument(
        "--prompt-order",
        choices=("first", "spread"),
        default="first",
        help="the first training prompts in the task's order (default) or a seeded sample over all attributes",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for arm in args.arms.split(","):
        t, g, p = (int(x) for x in arm.split("x"))
        for setting in args.rewards.split(","):
            lam = [int(v) for v in args.granularities.split(",")] if args.granularities else None
            result = measure(setting, t, g, p, args.seed, args.model, lam, args.prompt_order)
            print(json.dumps({k: v for k, v in result.items() if k != "agreement"}), flush=True)
            results.append(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stride_agreement.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.out / "stride_agreement.md").write_text(table(results), encoding="utf-8")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
