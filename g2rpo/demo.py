"""The interim ``g2rpo demo``: real G²RPO updates on the toy model (``g2rpo.toy``).

One iteration, written out: rollout (anchor ODE, SDE branches, multi-stride finishes) → exact
rewards of the final latents → advantages → loss terms, each back-propagated, optimiser step →
step stats. Before and after training, the deterministic ODE sample of a fixed evaluation noise
is scored, so "the reward went up" is measured on the same inputs. Writes ``metrics.jsonl`` (one
StepStats per line) and ``reward.png`` under the run folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo import core
from g2rpo.config import load_config, parse_overrides
from g2rpo.seeding import Draws
from g2rpo.strategies import build_strategy
from g2rpo.strategies._shared import make_grid
from g2rpo.strategies.base import StepStats, summarize_step
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.toy import ToyConditioning, ToyReward, ToyVelocityModel, make_toy_problem

__all__ = ["DemoResult", "run_demo", "evaluate_ode_reward"]

LATENT_SHAPE = (4, 4)  # [L, C] packed latents of the toy problem


@dataclass
class DemoResult:
    out_dir: Path
    reward_before: float
    reward_after: float
    history: list[StepStats]


@torch.no_grad()
def evaluate_ode_reward(
    model: ToyVelocityModel, cond: ToyConditioning, reward: ToyReward, sigmas: torch.Tensor, samples: int = 16, seed: int = 1234
) -> float:
    """Mean reward of deterministic ODE samples from a fixed noise (``samples`` per prompt)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.arange(len(cond)).repeat(samples)
    x = torch.randn(prompts.numel(), *LATENT_SHAPE, generator=gen)
    rows = cond[prompts]
    for i in range(sigmas.numel() - 1):
        x = core.ode_step(x, model(x, sigmas[i].expand(x.shape[0]), rows), sigmas[i], sigmas[i + 1])
    return float(reward(x, prompts).mean())


def run_demo(
    iterations: int = 30,
    out_root: Path | str = "runs",
    overrides: list[str] | tuple[str, ...] = (),
    lr: float = 1e-2,
    num_prompts: int = 4,
    seed: int = 0,
    progress: bool = True,
    echo=print,
) -> DemoResult:
    """Train the toy model for ``iterations`` G²RPO iterations; return and write what happened.

    Defaults differ from the paper's (T = 8, G = 8, lr 1e-2): the paper's settings are for Flux at
    scale and move a tiny model too slowly to see (spec §6).
    """
    from tqdm import tqdm

    config = load_config(AlgorithmConfig, overrides={"num_steps": 8, "group_size": 8, **parse_overrides(overrides)})
    model, cond, reward = make_toy_problem(num_prompts=num_prompts, seed=seed)
    strategy = build_strategy(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sigmas = make_grid(config, LATENT_SHAPE[0])
    out_dir = _new_run_dir(Path(out_root), f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")

    echo(f"g2rpo demo: strategy={config.strategy} T={config.num_steps} G={config.group_size} "
         f"M={config.trained_steps} Λ={config.strides} η={config.eta} ε={config.ratio_clip} "
         f"on a toy velocity model ({sum(p.numel() for p in model.parameters())} parameters, "
         f"{num_prompts} prompts, latents {list(LATENT_SHAPE)}), AdamW lr={lr}")
    reward_before = evaluate_ode_reward(model, cond, reward, sigmas)
    history: list[StepStats] = []
    with (out_dir / "metrics.jsonl").open("w") as metrics:
        for iteration in tqdm(range(iterations), desc="G²RPO iterations", disable=not progress):
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
    echo(f"per iteration: {last.sampling_forwards} sampling forwards in {last.model_calls} batched calls, "
         f"{last.training_forwards} training forward/backwards, {last.optimizer_steps} optimiser step(s)")
    echo(f"rollout reward (mean over branches): first {history[0].reward_mean_all:.4f}, last {last.reward_mean_all:.4f}")
    echo(f"ODE-sample reward on fixed noise: before {reward_before:.4f}, after {reward_after:.4f} (best possible 0)")
    echo(f"last loss {last.loss:.4g}, clip fraction {last.clip_fraction:.3f}, ratio mean {last.ratio_mean:.6f}, "
         f"dropped groups {last.dropped_groups}/{last.total_groups}")
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
    ax.set_title("g2rpo demo (toy model)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
