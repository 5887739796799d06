"""``g2rpo demo``: the project's main job, end to end, on the shapes task, on the CPU.

The sequence (:func:`run_demo`) is the pipeline's, each stage one step function of
:mod:`g2rpo.steps`, with URIs (a local ``file://`` store under the run folder) passing between them:

1. **model** — the shapes model (:mod:`g2rpo.models.shapes`: a tiny ``FluxPipeline`` of real
   diffusers/transformers classes pretrained on the 360 scenes of :mod:`g2rpo.tasks.shapes`),
   pretrained into ``model`` on first use and reused after, when its marker records the same
   pretraining settings;
2. **config** — ``configs/shapes-cpu.yaml`` loaded through :func:`g2rpo.config.load_config` with the
   run's paths, ``iterations`` and ``seed``, then the user's ``--set``;
3. **prepare** — :data:`DEMO_PROMPTS` of the task's scenes (:func:`g2rpo.tasks.shapes.sample_scenes`)
   validated by :func:`g2rpo.steps.prepare.prepare_data`: every prompt trains and is evaluated;
4. **evaluate the base model** — deterministic ODE samples of the prompts × fixed seeds, decoded and
   scored with every reward of the run, published (:func:`g2rpo.steps.evaluate.evaluate`);
5. **train** — :func:`g2rpo.steps.train.train` (G²RPO rollout → decode → rewards → advantages →
   loss → AdamW; ``metrics.jsonl``, checkpoints, export) on the in-domain rewards ``shapes_colour`` and
   ``shapes_shape`` (weight 1; the paper's multi-reward setting); the out-of-domain metrics
   ``shapes_position``, ``shapes_background`` and ``jpeg_compressibility`` have weight 0: scored, never
   trained on. The export is published as an artifact;
6. **evaluate the published export** on the same prompts and seeds → ``eval_grid.png`` (before |
   after, the 64×64 images) and ``reward.png`` (each reward per iteration);
7. **register and promote** — a registry version with the export's per-prompt scores
   (:func:`g2rpo.steps.register.register`), then the promotion gates
   (:func:`g2rpo.steps.promote.decide_and_promote`) for a first version: each in-domain reward must
   reach the base model's mean on the same evaluation set, and each out-of-domain metric may fall
   below it by at most its tolerance (:data:`OUT_OF_DOMAIN_TOLERANCE`), so the version becomes
   champion iff training raised what it trained on without hacking the rest;
8. **summary** — what ran, every metric before/after, where every output is.

The settings are far from the paper's (printed at the start; docs/demo.md has the measurements).

``g2rpo demo --toy`` (:func:`run_toy_demo`) keeps the earlier demo: real G²RPO updates on the toy
velocity model of :mod:`g2rpo.toy`, whose reward is exact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from g2rpo import core
from g2rpo.artifacts.promotion import Decision, format_decision, load_gates
from g2rpo.config import deep_merge, load_config, parse_overrides
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.sampling import EvalResult, save_before_after_grid
from g2rpo.models.shapes import ShapesPretraining, check_shapes_model, ensure_shapes_model
from g2rpo.progress import progress_bar
from g2rpo.seeding import Draws
from g2rpo.steps.evaluate import evaluate
from g2rpo.steps.prepare import prepare_data
from g2rpo.steps.promote import decide_and_promote, floor_gates_from, write_gates
from g2rpo.steps.register import register
from g2rpo.steps.train import matching_evaluation, read_iteration_records, train
from g2rpo.strategies import build_strategy
from g2rpo.strategies._shared import make_grid
from g2rpo.strategies.base import StepStats, summarize_step
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.tasks.shapes import sample_scenes, write_prompts
from g2rpo.toy import ToyConditioning, ToyReward, ToyVelocityModel, make_toy_problem
from g2rpo.training.run_config import RunConfig

__all__ = [
    "DEFAULT_MODEL",
    "DEMO_ITERATIONS",
    "DEMO_PROMPTS",
    "EVAL_SEEDS",
    "MODEL_NAME",
    "OUT_OF_DOMAIN_TOLERANCE",
    "DemoResult",
    "FluxDemoResult",
    "run_demo",
    "run_toy_demo",
    "evaluate_ode_reward",
    "shapes_config_path",
]

MODEL_NAME = "g2rpo-demo"  # the registry's model name
DEFAULT_MODEL = "runs/shapes-flux"  # the pretrained shapes model, made here on first use
DEMO_ITERATIONS = 30
# The prompts: a few scenes, each seen about 15 times in the demo's iterations (all 360 would be seen
# once at most: measured, 30 iterations then move a held-out set by no more than its noise).
DEMO_PROMPTS = 8
PROMPTS_SEED = 0  # the same scenes whatever the run's seed, so runs compare
EVAL_SEEDS = (0, 1, 2)
# Largest fall below the base model's mean that an out-of-domain metric may show and still pass:
# 0.05 of the [0, 1] shapes scores; 0.25 bits per pixel of JPEG compressibility (about a tenth of
# the shapes model's). As configs/shapes-gates.yaml.
OUT_OF_DOMAIN_TOLERANCE = {"shapes_position": 0.05, "shapes_background": 0.05, "jpeg_compressibility": 0.25}
FLOOR_GATES_COMMENT = """g2rpo demo: promotion gates for a first version (no champion yet).
floor = the untrained shapes model's mean on the same prompts and seeds: the trained
(in-domain) rewards must reach it; each out-of-domain metric (not trained on) may fall at most
max_regression below it. Promoted iff training raised what it trained on without hacking the rest."""
# The paper's / reference code's values of the settings the demo shrinks (spec §6), for the printout.
PAPER_SETTINGS = {
    "algorithm.num_steps": 16,
    "algorithm.group_size": 12,
    "algorithm.g2rpo.granularities": [1, 2, 3],
    "algorithm.ratio_clip": 1e-4,
    "model.height": 720,
    "train.learning_rate": 2e-6,
    "train.precision": "bf16",
    "rewards": "hps_v21 + clip",
}


@dataclass
class FluxDemoResult:
    """What :func:`run_demo` did; the numbers are the evaluations' own."""

    run_dir: Path
    before_means: dict[str, float]  # metric -> mean over the fixed (prompt, seed) set, base model
    after_means: dict[str, float]  # the same set, trained model
    before: EvalResult  # the base model's images and scores
    after: EvalResult  # the published export's
    train_summary: dict[str, Any]
    export_uri: str
    registry_uri: str
    version: int
    decision: Decision
    outputs: dict[str, Path]


def shapes_config_path() -> Path:
    """``configs/shapes-cpu.yaml`` of this checkout (the demo's base config)."""
    path = Path(__file__).resolve().parents[1] / "configs" / "shapes-cpu.yaml"
    if not path.is_file():
        raise G2RPOError(
            problem("config", str(path), "not found: run the demo from a g2rpo checkout (pip install -e .)")
        )
    return path


def run_demo(
    iterations: int = DEMO_ITERATIONS,
    out_root: Path | str = "runs",
    overrides: list[str] | tuple[str, ...] = (),
    seed: int = 0,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    model: Path | str = DEFAULT_MODEL,
    pretraining: ShapesPretraining | None = None,
) -> FluxDemoResult:
    """Pretrain the shapes model if needed; prepare, evaluate the base model, train, evaluate the
    export, register, promote; report. ``model`` is the shapes model's folder (``pretraining`` its
    settings, default the shipped model's, checked against an existing one's marker).

    Each stage is one step function of :mod:`g2rpo.steps`; what passes between them is URIs.
    """
    started = time.perf_counter()
    pretraining = pretraining or ShapesPretraining()
    config_path = shapes_config_path()
    user = parse_overrides(overrides)
    model_dir = Path(deep_merge({"model": {"path": str(model)}}, user)["model"]["path"]).resolve()
    if model_dir.exists():
        check_shapes_model(model_dir, pretraining)  # before anything is written
    run_dir = _new_run_dir(Path(out_root), f"demo-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}").resolve()
    store = (run_dir / "store").as_uri()
    base = {
        "model": {"path": str(model_dir)},
        "data": {"prompts": str(run_dir / "data" / "train.jsonl")},
        "train": {"iterations": iterations, "seed": seed, "progress": progress},
        "output": {"dir": str(run_dir / "train")},
    }
    config = load_config(RunConfig, config_path, deep_merge(base, user))
    algo = config.algorithm
    if not config.output.export:
        raise G2RPOError(problem("output.export", False, "the demo publishes and registers the export: leave it true"))

    echo(f"g2rpo demo → {run_dir}")
    if model_dir.exists():
        echo(f"[1/8] shapes model: {model_dir} (pretrained before; its settings match)")
    else:
        echo(
            f"[1/8] shapes model: pretraining into {model_dir} ({pretraining.vae_steps} VAE steps, "
            f"{pretraining.flow_steps} flow-matching steps; once, reused by later runs)"
        )
        ensure_shapes_model(model_dir, pretraining, log=lambda line: echo(f"      {line}"), progress=progress)
    echo(f"[2/8] config {config_path.name}; far from the paper's: {_departures(config)}")

    source = write_prompts(run_dir / "source" / "shapes-prompts.txt", sample_scenes(DEMO_PROMPTS, seed=PROMPTS_SEED))
    data = prepare_data(str(source), run_dir / "data", test_size=0, seed=seed)
    echo(
        f"[3/8] prepare: {data.read} shapes prompts (drawn with seed {PROMPTS_SEED}) → {data.train_prompts} "
        f"(every prompt trains and is evaluated)"
    )

    evaluation = matching_evaluation(config, str(data.train_prompts), seeds=EVAL_SEEDS)
    echo(
        f"[4/8] evaluate the base model: the {data.train} prompts × seeds {list(EVAL_SEEDS)}, "
        f"ODE T={algo.num_steps}, every reward"
    )
    before = evaluate(config.model.path, evaluation, f"{store}/evaluations/base")

    trained_on = [spec.name for spec in config.rewards.models if spec.weight]
    echo(
        f"[5/8] G²RPO training: {iterations} iterations × {config.train.prompts_per_iteration} prompts on "
        f"{' + '.join(trained_on)}"
    )
    trained = train(config, publish_uri=f"{store}/exports/{MODEL_NAME}", producer="g2rpo demo")
    records = read_iteration_records(trained.metrics_path)

    echo(f"[6/8] evaluate the published export on the same prompts and seeds: {trained.export_uri}")
    after = evaluate(
        trained.export_uri,
        evaluation,
        f"{store}/evaluations/export",
        base_model_uri=config.model.path,
        baseline_uri=before.output_uri,
    )
    metrics = [spec.name for spec in config.rewards.models]  # trained first, as the config lists them
    before_means = {m: before.evaluation.mean(m) for m in metrics}
    after_means = {m: after.evaluation.mean(m) for m in metrics}
    shown = trained_on[-1] if trained_on else metrics[0]
    outputs = {
        "data": data.output_dir,
        "metrics": trained.metrics_path,
        "checkpoints": trained.checkpoints_dir,
        "export": trained.export_dir,
        "eval_grid": save_before_after_grid(
            before.evaluation, after.evaluation, run_dir / "eval_grid.png", reward=shown
        ),
        "reward_plot": save_reward_curves(
            records,
            run_dir / "reward.png",
            before_means,
            after_means,
            trained_on,
            title=f"g2rpo demo: shapes task, {algo.strategy}",
        ),
    }

    echo("[7/8] register the export with its scores; gates: the base model's means as floors")
    registry_uri = (run_dir / "registry").as_uri()
    licence = json.loads((trained.export_dir / "base_model.json").read_text())["license"]["name"]
    registered = register(
        registry_uri,
        MODEL_NAME,
        export_uri=trained.export_uri,
        eval_uri=after.output_uri,
        source_run=run_dir.name,
        config_hash=trained.config_hash,
        base_model=config.model.base_model_name,
        licence=str(licence),
    )
    held_out = {m: OUT_OF_DOMAIN_TOLERANCE.get(m, 0.0) for m in metrics if m not in trained_on}
    outputs["gates"], gates_sha = write_gates(
        floor_gates_from(before_means, out_of_domain=held_out), run_dir / "gates.yaml", comment=FLOOR_GATES_COMMENT
    )
    gates, _ = load_gates(outputs["gates"])
    promoted = decide_and_promote(
        registry_uri, MODEL_NAME, registered.version, gates, gates_sha256=gates_sha, reason="g2rpo demo"
    )
    echo(format_decision(promoted.decision))
    outputs["registry"] = run_dir / "registry"
    outputs["evaluations"] = run_dir / "store" / "evaluations"
    outputs["report"] = run_dir / "store" / "evaluations" / "export" / "report.html"  # export vs base, paired

    last = records[-1]
    echo(f"[8/8] summary ({time.perf_counter() - started:.0f} s)")
    echo(
        f"  ran: {algo.strategy}, T={algo.num_steps}, G={algo.group_size}, {_strategy_settings(algo)}, "
        f"η={algo.eta}, ε={algo.ratio_clip}, lr={config.learning_rate}, {trained.summary['iterations']} "
        f"iterations × {config.train.prompts_per_iteration} prompts, {config.model.height}×{config.model.width}"
    )
    echo(
        f"  per iteration: {last['sampling_forwards']} sampling forwards in {last['model_calls']} batched calls, "
        f"{last['training_forwards']} training forward/backwards, {last['decoded_images']} images decoded and scored"
    )
    echo(f"  ODE-sample rewards on the fixed set ({data.train} prompts × {len(EVAL_SEEDS)} seeds; higher is better):")
    for m in metrics:
        role = "trained" if m in trained_on else "not trained"
        echo(
            f"    {m:<22} {role:<11} before {before_means[m]:.4f}, after {after_means[m]:.4f} "
            f"(Δ {after_means[m] - before_means[m]:+.4f})"
        )
    champion = f"v{promoted.champion}" if promoted.champion is not None else "none"
    echo(f"  registry: {MODEL_NAME} v{registered.version}, champion = {champion}")
    for label, path in outputs.items():
        echo(f"  {label:<12} {path}")
    echo(f"  {'export_uri':<12} {trained.export_uri}")
    return FluxDemoResult(
        run_dir=run_dir,
        before_means=before_means,
        after_means=after_means,
        before=before.evaluation,
        after=after.evaluation,
        train_summary=trained.summary,
        export_uri=trained.export_uri,
        registry_uri=registered.registry_uri,
        version=registered.version,
        decision=promoted.decision,
        outputs=outputs,
    )


def save_reward_curves(
    records: list[dict[str, Any]],
    path: Path,
    before: dict[str, float],
    after: dict[str, float],
    trained_on: list[str],
    title: str = "",
) -> Path:
    """A PNG with one panel per reward: its rollout mean per iteration (training prompts, before that
    iteration's update) and the fixed-set ODE evaluation before (at 0) and after (at N); the panels of
    the rewards not in ``trained_on`` say "not trained on"."""
    import matplotlib  # optional heavy plotting dependency, loaded when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = records[0]["reward_names"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.0), dpi=100, squeeze=False)
    for r, (ax, name) in enumerate(zip(axes[0], names, strict=True)):
        curve = [sum(rec["reward_mean"][r]) / len(rec["reward_mean"][r]) for rec in records]
        ax.plot(range(len(curve)), curve, marker="o", markersize=2, label="rollout mean")
        if name in before and name in after:
            ax.plot([0, len(curve)], [before[name], after[name]], "s--", color="tab:red", label="fixed-set eval")
        ax.set_title(f"{name}{'' if name in trained_on else ' (not trained on)'}", fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if r == 0:
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _strategy_settings(algo: AlgorithmConfig) -> str:
    """The chosen strategy's own settings for the printout: M and Λ for G²RPO, its section otherwise."""
    if algo.strategy == "g2rpo":
        return f"M={algo.g2rpo.all_branch_steps(algo.num_steps)}, Λ={list(algo.g2rpo.granularities)}"
    section = getattr(algo, algo.strategy)
    return ", ".join(f"{key}={value}" for key, value in section.model_dump().items())


def _departures(config: Any) -> str:
    """``name=this run (paper value)`` for each setting the demo shrinks."""
    current = {
        "algorithm.num_steps": config.algorithm.num_steps,
        "algorithm.group_size": config.algorithm.group_size,
        "algorithm.g2rpo.granularities": config.algorithm.g2rpo.granularities,
        "algorithm.ratio_clip": config.algorithm.ratio_clip,
        "model.height": config.model.height,
        "train.learning_rate": config.learning_rate,
        "train.precision": config.train.precision,
        "rewards": " + ".join(spec.name for spec in config.rewards.models if spec.weight),
    }
    return ", ".join(f"{k}={current[k]} (paper {v})" for k, v in PAPER_SETTINGS.items() if current[k] != v) or "none"


# --------------------------------------------------------------------------- g2rpo demo --toy

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
    scale and move a tiny model too slowly to see (spec §6).
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
