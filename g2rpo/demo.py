"""``g2rpo demo --toy``: G²RPO's core, sketched on a toy velocity model whose reward is exact.

Real G²RPO updates (:mod:`g2rpo.strategies`: rollout → rewards → advantages → loss → AdamW, the loop
of :meth:`g2rpo.training.trainer.Trainer.step` written out small) on the toy model of
:mod:`g2rpo.toy`, with the ODE-sample reward on fixed noise before and after. The project's main job
is the pipeline: ``g2rpo demo`` (without ``--toy``) and ``make demo`` run it through kfp.local
(:mod:`pipelines.local`); this module no longer sequences the pipeline's steps a second time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo import core
from g2rpo.config import load_config, parse_overrides
from g2rpo.progress import progress_bar
from g2rpo.seeding import Draws
from g2rpo.strategies._shared import make_grid
from g2rpo.strategies.base import StepStats, summarize_step
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.registry import build_strategy
from g2rpo.toy import ToyConditioning, ToyReward, ToyVelocityModel, make_toy_problem

__all__ = ["LATENT_SHAPE", "DemoResult", "evaluate_ode_reward", "run_toy_demo"]

LATENT_SHAPE = (4, 4)  # [L, C] packed latents of the toy problem


@dataclass
class DemoResult:
    out_dir: Path
    reward_before: float
    reward_after: float
    history: list[StepStats]


@torch.no_grad()
def evaluate_ode_reward(
    model: ToyVelocityModel,
    cond: ToyConditioning,
    reward: ToyReward,
    sigmas: torch.Tensor,
    samples: int = 16,
    seed: int = 1234,
) -> float:
    """Mean reward of deterministic ODE samples from a fixed noise (``samples`` per prompt)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.arange(len(cond)).repeat(samples)
    x = torch.randn(prompts.numel(), *LATENT_SHAPE, generator=gen)
    rows = cond[prompts]
    for i in range(sigmas.numel() - 1):
        x = core.ode_step(x, model(x, sigmas[i].expand(x.shape[0]), rows), sigmas[i], sigmas[i + 1])
    return float(reward(x, prompts).mean())


def run_toy_demo(
    iterations: int = 30,
    out_root: Path | str = "runs",
    overrides: list[str] | tuple[str, ...] = (),
    lr: float = 1e-2,
    num_prompts: int = 4,
    seed: int = 0,
    progress: bool = True,
    echo=print,
) -> DemoResult:
    """``g2rpo demo --toy``: train the toy model for ``iterations`` G²RPO iterations; return and write what happened.

    Defaults differ from the paper's (T = 8, G = 8, lr 1e-2): the paper's settings are for Flux at
    scale and move a tiny model too slowly to see (docs/algorithm.md §6).
    """
    config = load_config(AlgorithmConfig, overrides={"num_steps": 8, "group_size": 8, **parse_overrides(overrides)})
    model, cond, reward = make_toy_problem(num_prompts=num_prompts, seed=seed)
    strategy = build_strategy(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sigmas = make_grid(config, LATENT_SHAPE[0])
    out_dir = _new_run_dir(Path(out_root), f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")

    echo(
        f"g2rpo demo: strategy={config.strategy} T={config.num_steps} G={config.group_size} "
        f"{_strategy_settings(config)} η={config.eta} ε={config.ratio_clip} "
        f"on a toy velocity model ({sum(p.numel() for p in model.parameters())} parameters, "
        f"{num_prompts} prompts, latents {list(LATENT_SHAPE)}), AdamW lr={lr}"
    )
    reward_before = evaluate_ode_reward(model, cond, reward, sigmas)
    history: list[StepStats] = []
    with (out_dir / "metrics.jsonl").open("w") as metrics:
        for iteration in progress_bar(range(iterations), desc="G²RPO iterations", enabled=progress):
            draws = Draws(seed, iteration, tuple(range(num_prompts)))
            model.eval()
            rollout = strategy.rollout(model, cond, draws, LATENT_SHAPE)
            rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
            advantages = strategy.advantages(rollout, rewards)
            model.train()
            terms = []
            for term in strategy.loss_terms(model, rollout, advantages):
                term.loss.backward()
                terms.append(term.detached())
                if term.step_optimizer:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            stats = summarize_step(rollout, rewards, advantages, terms)
            history.append(stats)
            metrics.write(json.dumps({"iteration": iteration, **stats.as_dict()}) + "\n")
    reward_after = evaluate_ode_reward(model, cond, reward, sigmas)
    _plot(history, out_dir / "reward.png")

    last = history[-1]
    echo(
        f"per iteration: {last.sampling_forwards} sampling forwards in {last.model_calls} batched calls, "
        f"{last.training_forwards} training forward/backwards, {last.optimizer_steps} optimiser step(s)"
    )
    echo(
        f"rollout reward (mean over branches): first {history[0].reward_mean_all:.4f}, last {last.reward_mean_all:.4f}"
    )
    echo(f"ODE-sample reward on fixed noise: before {reward_before:.4f}, after {reward_after:.4f} (best possible 0)")
    echo(
        f"last loss {last.loss:.4g}, clip fraction {last.clip_fraction:.3f}, ratio mean {last.ratio_mean:.6f}, "
        f"dropped groups {last.dropped_groups}/{last.total_groups}"
    )
    echo(f"wrote {out_dir / 'metrics.jsonl'} and {out_dir / 'reward.png'}")
    return DemoResult(out_dir, reward_before, reward_after, history)


def _new_run_dir(root: Path, name: str) -> Path:
    """A fresh folder ``root/name`` (``name-2``, ``name-3``, … if taken): never reuse a run's folder."""
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = root / (name if n == 1 else f"{name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{root / name}: 999 run folders of that name exist; clean up {root}")


def _plot(history: list[StepStats], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    ax.plot([s.reward_mean_all for s in history], marker="o", markersize=3)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean rollout reward")
    ax.set_title("g2rpo demo --toy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _strategy_settings(algo: AlgorithmConfig) -> str:
    """The chosen strategy's own settings for the printout: M and Λ for G²RPO, its section otherwise."""
    if algo.strategy == "g2rpo":
        return f"M={algo.g2rpo.all_branch_steps(algo.num_steps)}, Λ={list(algo.g2rpo.granularities)}"
    section = getattr(algo, algo.strategy)
    return ", ".join(f"{key}={value}" for key, value in section.model_dump().items())
