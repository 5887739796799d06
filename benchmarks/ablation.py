"""The paper's ablation on the shapes task, at equal iterations *and* at equal compute.

DanceGRPO, MixGRPO, G²RPO without MGAI and G²RPO, and two compute-saving G²RPO variants
(:mod:`g2rpo.strategies.g2rpo`, docs/core.md) — ``g2rpo_dpm4``: branches finished by DPM-Solver++(2M)
in at most 4 steps per stride; ``g2rpo_half_m``: half of M drawn per prompt each iteration; each about
half of G²RPO's sampling forwards — DiffusionNFT (:mod:`g2rpo.strategies.diffusionnft`; forward-process
training, its old-policy forwards counted as sampling forwards) and BranchGRPO (:mod:`g2rpo.strategies.branchgrpo`;
a tree of b^|M| leaves per prompt rather than G trajectories) are trained from the same pretrained shapes model
(:mod:`g2rpo.models.shapes`, made on first use) with the real :class:`~g2rpo.training.trainer.Trainer`,
under two reward settings:

- ``multi``: ``shapes_colour`` + ``shapes_shape`` (the paper's multi-reward setting: advantages added);
- ``single``: ``shapes_colour`` alone — to see whether optimising one reward hacks the others.

Every run is evaluated on the same held-out prompts (never trained on) with fixed sampling seeds
(deterministic ODE samples, :func:`g2rpo.evaluation.sampling.sample_and_score`) on all five exact
metrics: the in-domain ``shapes_colour`` and ``shapes_shape`` and the out-of-domain
``shapes_position``, ``shapes_background`` and ``jpeg_compressibility`` that nobody trains on.

Compute. One unit is one transformer forward of one image row. An iteration costs its sampling
forwards + training forwards + 2 × training backwards (a backward costs about two forwards), as the
strategies count them (:class:`g2rpo.strategies.base.NFECounters`). VAE decodes and reward calls
are reported apart (``decoded_images``): they are a large part of the wall time on this CPU at 64×64,
a small one at Flux.1-dev size. Wall time is the trainer's own per-phase time (evaluation excluded).

Budget. ``--iterations N`` fixes the equal-iteration point; the compute budget is the most any
method spends in N iterations (read from a first iteration of each). Every run trains until it has
spent the budget, so the cheaper methods run more iterations: the *equal-iteration* table reads
each run at iteration N, the *equal-compute* table at the budget, and the *equal-wall-time* table at
the least wall time any method took for the budget. A run is evaluated at iteration 0 (the shared
base model), at N, at its end, and at ``--evals`` points spread evenly over the budget; between
points the curves are interpolated linearly (stated in the JSON). Means over seeds with a 95 %
Student-t interval (:func:`benchmarks.stats.t_quantile`, any n); the method gaps paired per seed,
Holm-corrected, with the detectable difference: ``python -m benchmarks.paired OUT/ablation.json``.

Learning rates. Each method's own, chosen by a sweep (``--lrs``, ``--sweep-seeds`` seeds each, averaged) on a validation
split of the training prompts — never the held-out split — by the mean gain of the trained rewards at
the compute budget (:func:`choose_learning_rates`); ``--lr`` skips the sweep and trains every method
at one rate. Every method has the same ratio clip (DiffusionNFT has no ratio) and its own published
optimiser stepping (docs/core.md). The strategies' published rates are for Flux.1-dev, not this small model. The
default sweep is 3e-5, 1e-4, 3e-4 and 1e-3: on the previous shipped model a sweep over 1e-4, 3e-4
and 1e-3 chose its lowest value for every method, on this one a sweep over 3e-5, 1e-4 and 3e-4 its
highest, so both ends are kept.

Writes ``benchmarks/results/ablation/ablation.json`` (everything, per run and per eval point),
``ablation.md`` (the tables) and PNG curves (reward vs iteration, vs compute, vs wall time).
Usage: ``python -m benchmarks.ablation`` (default budget: about an hour on 2 cores with
``--jobs 2``); ``--quick`` for a smoke run; ``--iterations``/``--seeds``/``--methods`` to scale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.stats import t_quantile

if TYPE_CHECKING:  # the benchmark's processes import g2rpo where they use it
    from g2rpo.training.drivers import EMA

RESULTS = Path(__file__).resolve().parent / "results" / "ablation"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "g2rpo" / "models" / "shapes_flux"  # the shipped shapes model

IN_DOMAIN = ("shapes_colour", "shapes_shape")
CHECKS = ("shapes_colour_match",)  # the fraction drawn in the asked colour: what shapes_colour asks, read plainly
OUT_OF_DOMAIN = ("shapes_position", "shapes_background", "jpeg_compressibility")
# The learned rewards (g2rpo.rewards.shapes_learned): the analogues of the paper's HPS-v2.1 and CLIP,
# loaded by those heads from the shipped folders. Every run is scored on them as well, so that the
# gap between their gain and the exact rewards' gain (reward hacking) is measured on every run.
LEARNED_WEIGHTS = {
    "hps_v21": str(REPO / "g2rpo" / "models" / "shapes_pref"),
    "clip": str(REPO / "g2rpo" / "models" / "shapes_clip"),
}
LEARNED = tuple(LEARNED_WEIGHTS)
METRICS = IN_DOMAIN + CHECKS + OUT_OF_DOMAIN + LEARNED
CONTROL_METRICS = ("shapes_texture",)  # scores of order 0.01: the tables print them with 4 decimals
REWARD_SETTINGS = {
    "multi": list(IN_DOMAIN),
    "single": ["shapes_colour"],
    "learned": ["hps_v21", "clip"],  # the paper's HPS + CLIP, learned; the exact rewards are ground truth
    "learned_hps": ["hps_v21"],  # the paper's HPS-only row
    # The positive control for MGAI (issue 41 §2): an exact reward whose ranking of a group's branches depends on
    # how they are finished (g2rpo.rewards.shapes, shapes_texture; benchmarks/stride_agreement.py --rewards texture).
    "texture": ["shapes_texture"],
    "texture_task": ["shapes_colour", "shapes_shape", "shapes_texture"],  # the control beside the task's rewards
}


def metrics_for(setting: str) -> tuple[str, ...]:
    """What a run of ``setting`` is scored on: :data:`METRICS`, then its trained rewards that are not among them."""
    return METRICS + tuple(n for n in REWARD_SETTINGS[setting] if n not in METRICS)


def reward_model(name: str) -> dict[str, Any]:
    """A reward model's config entry: a learned reward with its shipped weights, an exact one by name."""
    return {"name": name, "weights": LEARNED_WEIGHTS[name]} if name in LEARNED_WEIGHTS else {"name": name}


# Each method: its algorithm section overrides (on top of the shared settings below).
METHODS: dict[str, dict[str, Any]] = {
    "dancegrpo": {"strategy": "dancegrpo"},
    "mixgrpo": {"strategy": "mixgrpo"},
    "g2rpo_no_mgai": {"strategy": "g2rpo_no_mgai"},
    "g2rpo": {"strategy": "g2rpo"},
    # Compute-saving G²RPO (off by default in the library; docs/core.md): about half the sampling forwards.
    "g2rpo_dpm4": {"strategy": "g2rpo", "g2rpo": {"finish_solver": "dpmpp_2m", "finish_steps": 4}},
    "g2rpo_half_m": {"strategy": "g2rpo", "g2rpo": {"branch_steps_per_iteration": "half"}},  # |M|/2 drawn
    # DiffusionNFT's published KL weight (1e-4) needs a LoRA base as the reference; these runs train in full.
    "diffusionnft": {"strategy": "diffusionnft", "diffusionnft": {"kl_beta": 0.0}},
    # BranchGRPO's published uniform split (4 rounds, b = 2): 16 leaves per prompt whatever group_size is.
    "branchgrpo": {"strategy": "branchgrpo"},
    # Flow-GRPO's KL (β 0.04) is to the LoRA base with its adapters disabled; these runs train in full, so β = 0.
    "flowgrpo": {"strategy": "flowgrpo", "flowgrpo": {"kl_beta": 0.0}},
    # The equal-optimiser-steps arm: DanceGRPO and MixGRPO step twice per iteration as their scripts do (4 and 3
    # trajectories per step of G = 6), the G²RPO family once; these step once, as G²RPO does.
    "dancegrpo_1step": {"strategy": "dancegrpo", "dancegrpo": {"trajectories_per_step": None}},
    "mixgrpo_1step": {"strategy": "mixgrpo", "mixgrpo": {"trajectories_per_step": None}},
    # The paper's granularity ablation (Table 3): Λ = {1} is g2rpo_no_mgai, Λ = {1, 2, 3} is g2rpo.
    "g2rpo_L12": {"strategy": "g2rpo", "g2rpo": {"granularities": [1, 2]}},
    "g2rpo_L13": {"strategy": "g2rpo", "g2rpo": {"granularities": [1, 3]}},
    # Flow-GRPO as published: LoRA adapters on a frozen base, the KL (β 0.04) to the base with its adapters
    # disabled; beside it the same LoRA run without the KL, so the pair isolates what the KL does.
    "flowgrpo_lora": {"strategy": "flowgrpo", "flowgrpo": {"kl_beta": 0.0}},
    "flowgrpo_lora_kl": {"strategy": "flowgrpo", "flowgrpo": {"kl_beta": 0.04}},
    # Issue 41 §1: G²RPO with its strides averaged (α_j = 1/|Λ|), so the summed advantage is clipped at ±5 no more
    # often than one stride's is (the clip confound of G²RPO against without MGAI), and with the reference code's
    # stride finish (σ[:k+2] + σ[k+2::λ], x̂₀ scored at the last-but-one point).
    "g2rpo_mean_strides": {"strategy": "g2rpo", "g2rpo": {"stride_weights": [1 / 3, 1 / 3, 1 / 3]}},
    "g2rpo_ref_finish": {"strategy": "g2rpo", "g2rpo": {"stride_schedule": "reference"}},
    # Issue 41 §3, the frontier baselines at their published settings (docs/core.md): BranchGRPO's split noise × 4
    # (tree_split_noise_scale 4.0 of its script; its split points 0, 3, 6, 9 need T ≥ 10, so at T = 6 the published
    # uniform rule k = r·⌊T/4⌋ stays; its optimiser step every 12 shuffled edges is not built), and DiffusionNFT
    # with its KL (1e-4) to the LoRA base and an EMA of the adapters, evaluated on the EMA weights (METHOD_TRAIN).
    "branchgrpo_published": {"strategy": "branchgrpo", "branchgrpo": {"split_noise_scale": 4.0}},
    "diffusionnft_published": {"strategy": "diffusionnft", "diffusionnft": {"kl_beta": 1e-4}},
    # The two settings those arms lacked: BranchGRPO's optimiser step every 12 shuffled edges, one forward per edge
    # (gradient_accumulation_steps 12 of its script; branchgrpo.edges_per_step), and DiffusionNFT's EMA as its script
    # keeps it, every step with the warm-up min((1 + s)/(10 + s), 0.9) (train.ema.warmup; METHOD_TRAIN).
    "branchgrpo_published_stepping": {
        "strategy": "branchgrpo",
        "branchgrpo": {"split_noise_scale": 4.0, "edges_per_step": 12},
    },
    "diffusionnft_published_warmup": {"strategy": "diffusionnft", "diffusionnft": {"kl_beta": 1e-4}},
    # BranchGRPO with every published setting at once, for T ≥ 10: its script's split points 0, 3, 6, 9 (given at
    # T = 20; at T = 16 the same grid indices), split noise × 4 and an optimiser step every 12 shuffled edges.
    "branchgrpo_published_full": {
        "strategy": "branchgrpo",
        "branchgrpo": {"split_noise_scale": 4.0, "edges_per_step": 12, "branch_steps": [0, 3, 6, 9]},
    },
}
# LoRA on the shapes transformer (inner width 64 = 4 heads × 16): rank 8, an eighth of the width, so the adapters
# are a real low-rank restriction on this small model; alpha = 2 × rank; the attention projections (the default).
LORA_SHAPES = {"enabled": True, "rank": 8, "alpha": 16.0}
# Each method's overrides of the train section (on top of run_config's).
# EMA of the trained weights, decay 0.9 after every optimiser step (the decay of the Flow-GRPO family's
# EMAModuleWrapper). DiffusionNFT's script updates it every step with the wrapper's warm-up (d_s = min((1 + s)/
# (10 + s), 0.9)): EMA_NFT; Flow-GRPO's updates every 8 steps, not built. A run with train.ema is evaluated on the
# EMA weights.
EMA_PUBLISHED = {"enabled": True, "decay": 0.9}
EMA_NFT = {**EMA_PUBLISHED, "warmup": True}
METHOD_TRAIN: dict[str, dict[str, Any]] = {
    "flowgrpo_lora": {"lora": LORA_SHAPES},
    "flowgrpo_lora_kl": {"lora": LORA_SHAPES},
    "diffusionnft_published": {"lora": LORA_SHAPES, "ema": EMA_PUBLISHED},
    "diffusionnft_published_warmup": {"lora": LORA_SHAPES, "ema": EMA_NFT},
}
# The paper's sampler (docs/algorithm.md §6) is T = 16, G = 12 (G²RPO's M = the noisiest half, Λ = {1, 2, 3}); the
# default here is the demo's reduced sampler (configs/shapes-cpu.yaml), which fits 5 seeds × 6 methods
# into hours on 2 cores; ``--num-steps 16 --group-size 12`` is the paper's arm.
SHARED_ALGORITHM = {"num_steps": 6, "group_size": 6, "micro_batch": 256}


@dataclass(frozen=True)
class RunSpec:
    method: str
    rewards: str
    seed: int
    budget: float  # compute units
    equal_iteration: int
    eval_every: float  # compute units between eval points
    lr: float
    prompts_per_iteration: int
    model: str
    train_prompts: str
    heldout: tuple[str, ...]
    eval_seeds: tuple[int, ...]
    work: str
    algorithm: tuple[tuple[str, Any], ...] = tuple(SHARED_ALGORITHM.items())
    stage: str = "main"  # "probe", "sweep" (validation split) or "main" (held-out split)
    model_sha256: str = ""
    # Dense early readings (issue 41 §1): this many more eval points spread evenly over the first early_fraction of
    # the budget, on top of the every-eval_every ones. 0 (the default) leaves the schedule and the run key as before.
    early_evals: int = 0
    early_fraction: float = 0.2
    # Validation during training (issue 41 §1, early stopping; benchmarks/early_stopping.py): at every reading also
    # score this many training prompts, evenly spaced as ``train.validation`` picks them, × its default seeds (0, 1)
    # on the trained rewards. 0 (the default): none, and the run keys of earlier invocations are kept.
    train_validation: int = 0


def early_points(spec: RunSpec) -> list[float]:
    """The compute thresholds of the dense early readings: (i / n) · early_fraction · budget for i = 1..n."""
    n = spec.early_evals
    return [spec.budget * spec.early_fraction * i / n for i in range(1, n + 1)] if n > 0 else []


def compute_of(stats: Any) -> int:
    """Compute units of one iteration: sampling and reference forwards (no grad) + training forwards + 2 × backwards."""
    return (
        int(stats.sampling_forwards)
        + int(stats.reference_forwards)  # no grad, like a sampling forward (Flow-GRPO's KL reference)
        + int(stats.training_forwards)
        + 2 * int(stats.training_backwards)
    )


def method_algorithm(method: str, shared: dict[str, Any]) -> dict[str, Any]:
    """The algorithm section of ``method``: the shared settings plus its own; ``"half"`` for
    ``branch_steps_per_iteration`` is half of M (the noisiest half of the grid), rounded down, at least 1."""
    section = {**shared, **METHODS[method]}
    own = dict(section.get("g2rpo", {}))
    if own.get("branch_steps_per_iteration") == "half":
        own["branch_steps_per_iteration"] = max(1, math.ceil(shared["num_steps"] / 2) // 2)
        section["g2rpo"] = own
    return section


def run_config(spec: RunSpec, out: Path) -> Any:
    from g2rpo.config import load_config
    from g2rpo.training.run_config import RunConfig

    raw = {
        "algorithm": method_algorithm(spec.method, dict(spec.algorithm)),
        "model": {"path": spec.model, "create_tiny": False, "height": 64, "width": 64},
        "data": {"prompts": spec.train_prompts},
        "rewards": {"models": [reward_model(n) for n in REWARD_SETTINGS[spec.rewards]], "batch_size": 512},
        "train": {
            "iterations": 10**6,
            "prompts_per_iteration": spec.prompts_per_iteration,
            "seed": spec.seed,
            "learning_rate": spec.lr,
            "precision": "fp32",
            "gradient_checkpointing": False,
            "device": "cpu",
            "checkpoint_every": 10**6,
            "decode_micro_batch": 64,
            "progress": False,
            **METHOD_TRAIN.get(spec.method, {}),
        },
        "deepspeed": {"enabled": False},
        "output": {"dir": str(out), "export": False},
    }
    return load_config(RunConfig, None, raw)


# train.validation's default seeds (g2rpo.training.run_config.ValidationSection)
TRAIN_VALIDATION_SEEDS = (0, 1)


class Evaluator:
    """Deterministic held-out evaluation of a live trainer on every metric (exact and learned)."""

    def __init__(
        self,
        spec: RunSpec,
        trainer: Any,
        prompts: tuple[str, ...] | None = None,
        seeds: tuple[int, ...] | None = None,
        metrics: tuple[str, ...] | None = None,
    ) -> None:
        """The held-out set and every metric by default; ``prompts``, ``seeds`` and ``metrics`` for another set
        (the validation during training of :func:`train_one`)."""
        from g2rpo.models.loading import load_text_encoder
        from g2rpo.rewards.registry import build_reward
        from g2rpo.strategies._shared import make_grid

        self.prompts = list(spec.heldout if prompts is None else prompts)
        self.seeds = list(spec.eval_seeds if seeds is None else seeds)
        encoder = load_text_encoder(spec.model, dtype="float32")
        self.cond = encoder.encode(self.prompts)
        from g2rpo.rewards.config import RewardModelConfig

        self.metrics = metrics_for(spec.rewards) if metrics is None else metrics
        self.rewards = {name: build_reward(RewardModelConfig(**reward_model(name))) for name in self.metrics}
        self.sigmas = make_grid(trainer.config.algorithm, trainer.policy.latent_shape[0])
        self.spec = spec

    def __call__(self, trainer: Any) -> dict[str, float]:
        from g2rpo.evaluation.sampling import sample_and_score

        velocity = trainer.policy.velocity
        was_training = velocity.training
        velocity.eval()
        with ema_weights(trainer.learner.ema, trainer.learner.trainable()):
            result = self._sample(trainer, sample_and_score)
        velocity.train(was_training)
        per_prompt = {  # each held-out prompt's mean over the eval seeds: prompt-sampling variance
            name: [round(float(v), 5) for v in result.scores[name].float().mean(1)] for name in self.metrics
        }
        return {**{name: result.mean(name) for name in self.metrics}, "per_prompt": per_prompt}

    def _sample(self, trainer: Any, sample_and_score: Any) -> Any:
        return sample_and_score(
            trainer.policy.velocity,
            trainer.policy.vae,
            self.cond,
            self.prompts,
            self.seeds,
            self.rewards,
            self.sigmas,
            micro_batch=256,
            decode_micro_batch=64,
            reward_batch=512,
        )


@contextmanager
def ema_weights(ema: EMA | None, live: dict[str, torch.Tensor]) -> Iterator[None]:
    """The EMA's weights in place of the trained tensors ``live`` for the duration (nothing without an EMA):
    a run with ``train.ema`` is evaluated as its method publishes, on the EMA; the trained weights come back bit
    for bit afterwards."""
    if ema is None:
        yield
        return
    saved = {name: tensor.detach().clone() for name, tensor in live.items()}
    with torch.no_grad():
        for name, tensor in live.items():
            tensor.copy_(ema.shadow[name].to(tensor.dtype))
    try:
        yield
    finally:
        with torch.no_grad():
            for name, tensor in live.items():
                tensor.copy_(saved[name])


def train_one(spec: RunSpec) -> dict[str, Any]:
    """Train one (method, rewards, seed) until it has spent ``spec.budget``; eval points on the way."""
    from g2rpo.training.trainer import Trainer

    torch.set_num_threads(1)
    out = Path(spec.work) / f"{spec.method}-{spec.rewards}-s{spec.seed}-lr{spec.lr:g}-{spec.stage}"
    trainer = Trainer(run_config(spec, out)).setup()
    heldout = Evaluator(spec, trainer)
    validation_flops: int | None = None
    if spec.train_validation:
        from g2rpo.training.validation import validation_prompt_indices

        train = Path(spec.train_prompts).read_text().splitlines()
        chosen = tuple(train[i] for i in validation_prompt_indices(spec.train_validation, len(train)))
        trained = tuple(REWARD_SETTINGS[spec.rewards])
        validator = Evaluator(spec, trainer, prompts=chosen, seeds=TRAIN_VALIDATION_SEEDS, metrics=trained)

    validation_seconds: list[float] = []

    def evaluate(trainer: Any) -> dict[str, Any]:
        nonlocal validation_flops
        values = heldout(trainer)
        if spec.train_validation and validation_flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
            with counter:  # the first pass counted (sampling, decodes, scoring): early stopping pays each one
                values["validation"] = validator(trainer)
            validation_flops = int(counter.get_total_flops())
        elif spec.train_validation:  # the others timed (the counter's own overhead would skew the first)
            started = time.perf_counter()
            values["validation"] = validator(trainer)
            validation_seconds.append(time.perf_counter() - started)
        return values

    points = [{"iteration": 0, "compute": 0, "seconds": 0.0, "decoded_images": 0, **evaluate(trainer)}]
    compute, seconds, decoded, next_eval = 0, 0.0, 0, spec.eval_every
    early = early_points(spec) if spec.stage == "main" else []
    iterations: list[dict[str, Any]] = []
    # Until the budget is spent *and* the equal-iteration point is reached: a method dearer per iteration
    # than the budget's pace is read at iteration N on its own curve, not at its end.
    # (A sweep run is read at the budget only, so it stops there.)
    reach = spec.equal_iteration if spec.stage == "main" else 0
    while compute < spec.budget or trainer.iteration < reach:
        record = trainer.step()
        compute += compute_of(record.stats)
        seconds += sum(record.seconds.values())
        decoded += int(record.extra["decoded_images"])
        iterations.append(
            {
                "iteration": trainer.iteration,
                "compute": compute,
                "seconds": seconds,
                "train_reward_mean": record.stats.reward_mean_all,
                "sampling_forwards": record.stats.sampling_forwards,
                "training_forwards": record.stats.training_forwards,
                "reference_forwards": record.stats.reference_forwards,
                "training_backwards": record.stats.training_backwards,
            }
        )
        due = compute >= next_eval or trainer.iteration == spec.equal_iteration or compute >= spec.budget
        if early and compute >= early[0]:
            due = True
            early = [x for x in early if x > compute]
        if due:
            while next_eval <= compute:
                next_eval += spec.eval_every
            point = {"iteration": trainer.iteration, "compute": compute, "seconds": seconds, "decoded_images": decoded}
            points.append({**point, **evaluate(trainer)})
    shutil.rmtree(out, ignore_errors=True)
    return {
        "method": spec.method,
        "rewards": spec.rewards,
        "seed": spec.seed,
        "iterations": trainer.iteration,
        "compute": compute,
        "seconds": seconds,
        "decoded_images": decoded,
        "per_iteration": iterations,
        "evals": points,
        **(
            {
                "validation_flops_per_pass": validation_flops,
                "validation_seconds_per_pass": statistics.median(validation_seconds),  # under the runs' own load
            }
            if validation_flops is not None
            else {}
        ),
    }


def cost_per_iteration(spec: RunSpec, timed: int = 3) -> dict[str, Any]:
    """``spec.method``'s cost per iteration, measured alone (the probes run one at a time): its
    compute units, and the median over ``timed`` iterations after a warm-up one of its seconds, in
    all and per phase (sampling, decoding, reward, training)."""
    from g2rpo.training.trainer import Trainer

    torch.set_num_threads(1)
    load = os.getloadavg()[0]  # recorded beside the timing: "alone" is one probe at a time, not a quiet machine
    out = Path(spec.work) / f"probe-{spec.method}"
    trainer = Trainer(run_config(spec, out)).setup()
    first = trainer.step()  # the warm-up: first calls allocate and initialise
    records = [trainer.step() for _ in range(timed)]
    phases = {phase: statistics.median(r.seconds[phase] for r in records) for phase in first.seconds}
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:  # every phase: transformer forwards/backwards, VAE decodes, reward scoring
        trainer.step()
    shutil.rmtree(out, ignore_errors=True)
    return {
        "compute": compute_of(first.stats),
        "flops": int(counter.get_total_flops()),
        "seconds": statistics.median(sum(r.seconds.values()) for r in records),
        "phases": phases,
        "decoded_images": int(first.extra["decoded_images"]),
        "load_average": round(load, 2),
    }


def attach_quiet_seconds(runs: list[dict[str, Any]], cost: dict[str, dict[str, Any]]) -> None:
    """Give every run and eval point ``quiet_seconds`` = iterations × its method's seconds per
    iteration measured alone (:func:`cost_per_iteration`): the wall-time axis the tables read, free of
    the machine's load while the runs trained (their own ``seconds`` stay beside it); and ``flops`` =
    iterations × its FLOPs per iteration, every phase counted (the equal-FLOPs view)."""
    for run in runs:
        per_iteration, flops = cost[run["method"]]["seconds"], cost[run["method"]].get("flops")
        run["quiet_seconds"] = run["iterations"] * per_iteration
        for point in run["evals"]:
            point["quiet_seconds"] = point["iteration"] * per_iteration
        if flops is not None:  # full FLOPs (every phase, torch's FlopCounterMode) of the method's iterations
            run["flops"] = run["iterations"] * flops
            for point in run["evals"]:
                point["flops"] = point["iteration"] * flops


def wall_axis(runs: list[dict[str, Any]]) -> str:
    """``quiet_seconds`` when every run has it (:func:`attach_quiet_seconds`), else the measured ``seconds``."""
    return "quiet_seconds" if runs and all("quiet_seconds" in r for r in runs) else "seconds"


# ----------------------------------------------------------------------------- summaries


def interpolate(points: list[dict[str, Any]], axis: str, at: float, metric: str) -> float:
    """``metric`` at ``axis`` = ``at`` on the piecewise-linear curve through the eval points."""
    xs = [p[axis] for p in points]
    if at <= xs[0]:
        return points[0][metric]
    for a, b in zip(points, points[1:]):
        if a[axis] <= at <= b[axis]:
            if b[axis] == a[axis]:
                return b[metric]
            w = (at - a[axis]) / (b[axis] - a[axis])
            return a[metric] + w * (b[metric] - a[metric])
    return points[-1][metric]


def mean_ci(values: list[float]) -> dict[str, float]:
    """Mean and the half-width of its 95 % Student-t interval (0 for one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    half = t_quantile(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": mean, "ci95": half, "n": n}


def summarise(runs: list[dict[str, Any]], equal_iteration: int) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for setting in REWARD_SETTINGS:
        subset = [r for r in runs if r["rewards"] == setting]
        if not subset:
            continue
        methods = list(dict.fromkeys(r["method"] for r in subset))
        budget = min(r["compute"] for r in subset)  # every run reached it
        axis = wall_axis(subset)
        wall = min(
            statistics.median(r[axis] for r in subset if r["method"] == m) for m in methods
        )  # the fastest method's median wall time for the budget
        views = {"equal_iterations": ("iteration", equal_iteration), "equal_compute": ("compute", budget)}
        views["equal_wall_time"] = (axis, wall)
        out: dict[str, Any] = {"budget_compute": budget, "wall_seconds": wall, "wall_axis": axis}
        if all("flops" in r for r in subset):  # every run reached the least any run spent
            out["budget_flops"] = min(r["flops"] for r in subset)
            views["equal_flops"] = ("flops", out["budget_flops"])
        for view, (axis, at) in views.items():
            out[view] = {
                m: {
                    metric: mean_ci([interpolate(r["evals"], axis, at, metric) for r in subset if r["method"] == m])
                    for metric in metrics_for(setting)
                }
                for m in methods
            }
        out["cost"] = {
            m: {
                "compute_per_iteration": mean_ci(
                    [r["compute"] / max(r["iterations"], 1) for r in subset if r["method"] == m]
                ),
                "seconds_per_iteration": mean_ci(
                    [r["seconds"] / max(r["iterations"], 1) for r in subset if r["method"] == m]
                ),
                "iterations_for_budget": mean_ci([r["iterations"] for r in subset if r["method"] == m]),
                "decoded_images_per_iteration": mean_ci(
                    [r["decoded_images"] / max(r["iterations"], 1) for r in subset if r["method"] == m]
                ),
            }
            for m in methods
        }
        out["base"] = {metric: subset[0]["evals"][0][metric] for metric in metrics_for(setting)}
        table[setting] = out
    return table


def markdown(summary: dict[str, Any], equal_iteration: int) -> str:
    lines = []
    titles = {
        "equal_iterations": f"at {equal_iteration} iterations",
        "equal_compute": "at equal compute (the budget)",
        "equal_wall_time": "at equal wall time",
        "equal_flops": "at equal full FLOPs (transformer, VAE decodes and reward scoring)",
    }
    for setting, out in summary.items():
        lines.append(f"## rewards: {setting} ({' + '.join(REWARD_SETTINGS[setting])})\n")
        lines.append(
            f"budget {out['budget_compute']:.0f} compute units"
            + (f" ({out['budget_flops'] / 1e9:.0f} GFLOP in full)" if "budget_flops" in out else "")
            + f"; equal wall time = {out['wall_seconds']:.0f} s ({out.get('wall_axis', 'seconds')}); "
            "mean ± 95 % CI over seeds; in-domain first, then out-of-domain\n"
        )
        metrics = metrics_for(setting)
        base = " | ".join(f"{out['base'][m]:.3f}" for m in metrics)
        for view, title in titles.items():
            if view not in out:
                continue
            lines.append(f"### {title}\n")
            lines.append("| method | " + " | ".join(metrics) + " |")
            lines.append("|---" * (len(metrics) + 1) + "|")
            lines.append(f"| base model | {base} |")
            for method, row in out[view].items():
                cells = " | ".join(
                    f"{row[m]['mean']:.4f} ± {row[m]['ci95']:.4f}"
                    if m in CONTROL_METRICS
                    else f"{row[m]['mean']:.3f} ± {row[m]['ci95']:.3f}"
                    for m in metrics
                )
                lines.append(f"| {method} | {cells} |")
            lines.append("")
        lines.append("### cost\n")
        lines.append(
            "| method | compute / iteration | s / iteration | iterations for the budget | decoded / iteration |"
        )
        lines.append("|---|---|---|---|---|")
        for method, c in out["cost"].items():
            lines.append(
                f"| {method} | {c['compute_per_iteration']['mean']:.0f} | {c['seconds_per_iteration']['mean']:.2f} | "
                f"{c['iterations_for_budget']['mean']:.1f} | {c['decoded_images_per_iteration']['mean']:.0f} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Held-out curves per reward setting and axis: mean over seeds (line, a marker at each reading
    point), its 95 % Student-t interval (band), the base model (dashed), one legend for all panels.

    Each method's curve runs to the median of its seeds' ends; a seed that ended earlier is read at
    its end beyond it (said in the title), so no curve stops at its shortest seed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter, MaxNLocator

    written = []
    axes_spec = (
        ("iteration", "iterations"),
        ("compute", "compute (transformer forward units)"),
        ("seconds", "wall time (s, one thread)"),
    )
    if wall_axis(runs) == "quiet_seconds":
        axes_spec = (*axes_spec[:2], ("quiet_seconds", "wall time (s): iterations × s/iteration measured alone"))
    if runs and all("flops" in r for r in runs):
        axes_spec = (*axes_spec, ("flops", "full FLOPs (transformer + VAE + rewards)"))
    for setting in REWARD_SETTINGS:
        subset = [r for r in runs if r["rewards"] == setting]
        if not subset:
            continue
        methods = list(dict.fromkeys(r["method"] for r in subset))
        colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
        metrics = metrics_for(setting)
        base = {m: statistics.fmean(r["evals"][0][m] for r in subset) for m in metrics}
        for axis, label in axes_spec:
            fig, grid = plt.subplots(2, math.ceil(len(metrics) / 2), figsize=(3.6 * math.ceil(len(metrics) / 2), 6.4))
            panels = list(grid.flat)
            for ax, metric in zip(panels, metrics):
                for method in methods:
                    mine = [r for r in subset if r["method"] == method]
                    end = statistics.median(max(p[axis] for p in r["evals"]) for r in mine)
                    xs = sorted({p[axis] for r in mine for p in r["evals"] if p[axis] <= end} | {end})
                    stats = [mean_ci([interpolate(r["evals"], axis, x, metric) for r in mine]) for x in xs]
                    mean = [s["mean"] for s in stats]
                    ax.plot(xs, mean, color=colours[method], lw=1.4)
                    read = [x for x in xs if any(p[axis] == x for r in mine for p in r["evals"])]
                    ax.plot(read, [mean[xs.index(x)] for x in read], "o", ms=2.5, color=colours[method])
                    low = [s["mean"] - s["ci95"] for s in stats]
                    high = [s["mean"] + s["ci95"] for s in stats]
                    ax.fill_between(xs, low, high, color=colours[method], alpha=0.12, lw=0)
                ax.axhline(base[metric], color="black", ls="--", lw=0.8)
                domain = "trained on" if metric in REWARD_SETTINGS[setting] else "held-out check"
                kind = "learned" if metric in LEARNED else "exact"
                ax.set_title(f"{metric} ({kind})\n{domain}", fontsize=9)
                ax.set_xlabel(label, fontsize=8)
                ax.xaxis.set_major_locator(MaxNLocator(5))  # 690k compute units, 1.8e13 FLOPs: short ticks
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
                ax.tick_params(labelsize=7)
            for ax in panels[len(metrics) :]:
                ax.axis("off")
            for row in grid:
                row[0].set_ylabel("held-out mean score", fontsize=8)
            handles = [Line2D([], [], color=colours[m], lw=1.4, marker="o", ms=3, label=m) for m in methods]
            handles += [
                Patch(color="grey", alpha=0.3, label="95 % t-interval over seeds"),
                Line2D([], [], color="black", ls="--", lw=0.8, label="base model"),
            ]
            fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
            seeds = len({r["seed"] for r in subset})
            fig.suptitle(
                f"shapes ablation, rewards: {setting} ({' + '.join(REWARD_SETTINGS[setting])}); {seeds} seed{'s' * (seeds != 1)}; "
                "markers: reading points; curves to each method's median end",
                fontsize=10,
            )
            fig.tight_layout(rect=(0, 0.07, 1, 0.96))
            path = folder / f"{setting}_vs_{axis}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


# ----------------------------------------------------------------------------- the command


def split_prompts(heldout: int, validation: int) -> tuple[list[str], list[str], list[str]]:
    """(train, validation, held-out) prompts of the shapes task. The held-out prompts are the ones the
    pipeline's prepare step holds out (:func:`g2rpo.data.split_prompts`, split seed 0 — what ``make
    demo`` evaluates on at the same count); the validation prompts — for choosing each method's learning
    rate — are the prepare split's next ``validation`` prompts, never trained on either."""
    from g2rpo.data import split_prompts as prepare_split
    from g2rpo.tasks.shapes import all_scenes

    prompts = [s.prompt for s in all_scenes()]
    rest, held = prepare_split(prompts, heldout, seed=0)
    train, valid = prepare_split(rest, validation, seed=0)
    return train, valid, held


def ensure_model(path: Path) -> tuple[Path, dict[str, Any]]:
    """The shapes model at ``path`` and its marker (settings, losses): an existing folder must hold a
    shapes model (made with any settings: a quicker one for a smoke run is fine, the JSON records which)."""
    from g2rpo.errors import G2RPOError, problem
    from g2rpo.models.tiny import TINY_MARKER

    marker = path / TINY_MARKER
    record = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else {}
    if record.get("task") != "shapes":
        raise G2RPOError(problem("--model", str(path), "holds no shapes model: name a folder made by pretrain-shapes"))
    return path, record


def run_key(spec: RunSpec) -> str:
    """The file name of a finished run: what it trained, how, and on which evaluation set."""
    what = f"{spec.method}-{spec.rewards}-s{spec.seed}-lr{spec.lr:g}-{spec.stage}"
    digest = hashlib.sha256(
        json.dumps(
            [
                spec.budget,
                spec.equal_iteration,
                spec.prompts_per_iteration,
                spec.algorithm,
                spec.heldout,
                spec.eval_seeds,
                spec.eval_every,
                spec.model_sha256,
                *([spec.early_evals, spec.early_fraction] if spec.early_evals else []),  # old keys unchanged
                *(["train_validation", spec.train_validation] if spec.train_validation else []),
            ],
            default=str,
        ).encode()
    ).hexdigest()[:10]
    return f"{what}-{digest}"


def run_all(specs: list[RunSpec], folder: Path, jobs: int, label: str, train: bool = True) -> list[dict[str, Any]]:
    """Every spec's run, trained now unless ``folder`` already holds it (each run is written there
    when it finishes, so an interrupted benchmark resumes where it stopped). ``train=False``: only
    the runs already there."""
    folder.mkdir(parents=True, exist_ok=True)
    done = {spec: folder / f"{run_key(spec)}.json" for spec in specs}
    todo = [spec for spec, path in done.items() if not path.is_file()] if train else []
    if not train:
        specs = [spec for spec in specs if done[spec].is_file()]
    print(
        f"{label}: {len(specs) - len(todo)} of {len(specs)} runs already in {folder}; training {len(todo)}", flush=True
    )
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for spec, run in zip(todo, pool.map(train_one, todo)):
            final = ", ".join(f"{k} {run['evals'][-1][k]:.3f}" for k in (*IN_DOMAIN, *CHECKS))
            print(
                f"  {run['method']:<14} {run['rewards']:<6} lr {spec.lr:g} seed {run['seed']}: {run['iterations']} "
                f"iterations, {run['seconds']:.0f} s, final {final}",
                flush=True,
            )
            tmp = done[spec].with_suffix(".tmp")
            tmp.write_text(json.dumps({**run, "lr": spec.lr, "stage": spec.stage}, indent=1) + "\n")
            tmp.replace(done[spec])
    return [json.loads(done[spec].read_text()) for spec in specs]


def choose_learning_rates(
    sweep: list[dict[str, Any]], rewards: str, budget: float | None = None
) -> dict[str, dict[str, Any]]:
    """Per method, the swept learning rate whose validation objective — the mean over the trained
    rewards of the gain over the base model at the compute budget (the first eval point at or past
    ``budget``; without it, the run's last), averaged over the sweep's seeds — is highest; ``interior``
    says whether both its neighbours in the sweep are worse (a choice at an end of the sweep may be
    truncated), and ``objectives`` keeps every rate's figure."""
    by: dict[str, dict[float, list[float]]] = {}
    for run in sweep:
        base = run["evals"][0]
        end = next((p for p in run["evals"] if budget is not None and p["compute"] >= budget), run["evals"][-1])
        objective = statistics.fmean(end[m] - base[m] for m in REWARD_SETTINGS[rewards])
        by.setdefault(run["method"], {}).setdefault(float(run["lr"]), []).append(objective)
    chosen: dict[str, dict[str, Any]] = {}
    for method, per_lr in by.items():
        lrs = sorted(per_lr)
        means = {lr: statistics.fmean(v) for lr, v in per_lr.items()}
        best = max(lrs, key=lambda lr: means[lr])
        i = lrs.index(best)
        chosen[method] = {
            "lr": best,
            "objective": means[best],
            "interior": 0 < i < len(lrs) - 1,
            "seeds": len(per_lr[best]),
            "objectives": {f"{lr:g}": round(means[lr], 5) for lr in lrs},
        }
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="pretrained shapes model (default: the shipped one)"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: " + ", ".join(METHODS))
    parser.add_argument(
        "--rewards", default="multi", help=f"reward settings, comma-separated: {', '.join(REWARD_SETTINGS)}"
    )
    parser.add_argument("--seeds", type=int, default=8, help="training seeds per (method, rewards)")
    parser.add_argument("--iterations", type=int, default=30, help="the equal-iteration point N (sets the budget)")
    parser.add_argument(
        "--prompts-per-iteration", type=int, default=8, help="prompts per iteration (default 8, the demo recipe's)"
    )
    parser.add_argument(
        "--lrs",
        default="3e-5,1e-4,3e-4,1e-3",
        help="learning rates swept per method on the validation split",
    )
    parser.add_argument(
        "--method-lrs",
        action="append",
        default=[],
        metavar="METHOD=LR,LR,...",
        help="this method's own swept rates instead of --lrs (repeatable), e.g. diffusionnft=1e-4,3e-4,1e-3",
    )
    parser.add_argument("--sweep-seeds", type=int, default=2, help="seeds per swept learning rate (default 2)")
    parser.add_argument("--lr", type=float, default=None, help="skip the sweep: one learning rate for every method")
    parser.add_argument("--heldout", type=int, default=64, help="held-out scenes (never trained on)")
    parser.add_argument("--eval-seeds", type=int, default=4, help="sampling seeds per held-out scene")
    parser.add_argument("--validation", type=int, default=32, help="validation scenes for the learning-rate sweep")
    parser.add_argument("--evals", type=int, default=4, help="eval points spread over the budget")
    parser.add_argument(
        "--early-evals",
        type=int,
        default=0,
        help="more eval points spread over the first --early-fraction of the budget (dense early readings; "
        "default 0: none, and the run keys of earlier invocations are kept)",
    )
    parser.add_argument("--early-fraction", type=float, default=0.2, help="the early part of the budget (default 0.2)")
    parser.add_argument(
        "--train-validation",
        type=int,
        default=0,
        metavar="N",
        help="at every reading of a main run also score N training prompts (evenly spaced) × seeds 0, 1 on the "
        "trained rewards, as train.validation does: the record benchmarks.early_stopping reads (default 0: none)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    parser.add_argument("--num-steps", type=int, default=SHARED_ALGORITHM["num_steps"], help="T (paper 16)")
    parser.add_argument("--group-size", type=int, default=SHARED_ALGORITHM["group_size"], help="G (paper 12)")
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        help="compute budget in units (default: the most any method spends in --iterations iterations); fixing it "
        "lets a later invocation with more methods reuse the runs of an earlier one",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 methods, 1 seed, 1 iteration, T=4, G=4")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (finished runs in OUT/per_run/)")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="train nothing: summarise the finished runs in OUT/per_run/ (the seeds every method has finished)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.methods, args.rewards, args.seeds, args.iterations, args.evals = "dancegrpo,g2rpo", "multi", 1, 1, 1
        args.heldout, args.eval_seeds, args.num_steps, args.group_size = 4, 1, 4, 4
        args.validation, args.prompts_per_iteration, args.lr = 4, 1, args.lr or 3e-4
    algorithm = {**SHARED_ALGORITHM, "num_steps": args.num_steps, "group_size": args.group_size}
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    settings = args.rewards.split(",")
    if any(s not in REWARD_SETTINGS for s in settings):
        parser.error(f"--rewards: choose from {', '.join(REWARD_SETTINGS)}")
    lrs = [args.lr] if args.lr is not None else [float(v) for v in args.lrs.split(",")]
    method_lrs = {m: lrs for m in methods}
    for item in args.method_lrs:
        name, _, values = item.partition("=")
        if name not in methods or not values:
            parser.error(f"--method-lrs {item!r}: expected METHOD=LR,LR,... with METHOD one of --methods ({methods})")
        if args.lr is not None:
            parser.error("--method-lrs: not with --lr (which skips the sweep)")
        try:
            method_lrs[name] = [float(v) for v in values.split(",")]
        except ValueError:
            parser.error(f"--method-lrs {item!r}: the rates must be numbers, e.g. {name}=1e-4,3e-4,1e-3")

    started = time.monotonic()
    model, model_record = ensure_model(args.model)
    model_sha = hashlib.sha256(b"".join(sorted(f.read_bytes() for f in model.rglob("*.safetensors")))).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="g2rpo-ablation-"))
    train, validation, heldout = split_prompts(args.heldout, args.validation)
    train_file = args.out / "train-prompts.txt"
    train_file.write_text("\n".join(train) + "\n")

    def spec(method: str, rewards: str, seed: int, lr: float, stage: str, budget: float = 0.0) -> RunSpec:
        prompts = validation if stage == "sweep" else heldout
        return RunSpec(
            method=method,
            rewards=rewards,
            seed=seed,
            budget=budget,
            equal_iteration=args.iterations,
            eval_every=budget / max(args.evals, 1),
            early_evals=args.early_evals,
            early_fraction=args.early_fraction,
            train_validation=args.train_validation if stage == "main" else 0,
            lr=lr,
            prompts_per_iteration=args.prompts_per_iteration,
            model=str(model),
            train_prompts=str(train_file),
            heldout=tuple(prompts),
            eval_seeds=tuple(range(args.eval_seeds if stage == "main" else 2)),
            work=str(work),
            algorithm=tuple(algorithm.items()),
            stage=stage,
            model_sha256=model_sha,
        )

    try:
        probes_file = args.out / "probes.json"
        # The probes of methods already measured under the same settings are kept; only new methods are probed.
        same = [algorithm, args.prompts_per_iteration, model_sha, settings[0], "timed alone"]
        probes = json.loads(probes_file.read_text()) if probes_file.is_file() else {}
        stored = json.loads(probes["key"]) if "key" in probes else None
        kept = probes["cost"] if stored is not None and stored[1:] == json.loads(json.dumps(same)) else {}
        missing = [m for m in methods if m not in kept]
        if missing or set(kept) != set(methods):
            with ProcessPoolExecutor(max_workers=1) as pool:  # one at a time: the wall-time view reads these
                costs = dict(
                    zip(
                        missing,
                        pool.map(cost_per_iteration, [spec(m, settings[0], 0, lrs[0], "probe") for m in missing]),
                    )
                )
            cost = {m: kept[m] if m in kept else costs[m] for m in methods}
            probes = {"key": json.dumps([methods, *same]), "cost": cost}
            probes_file.write_text(json.dumps(probes, indent=1) + "\n")
        budget = args.budget or max(p["compute"] for p in probes["cost"].values()) * args.iterations
        print(f"compute per iteration: { {m: p['compute'] for m, p in probes['cost'].items()} }; budget {budget}")
        chosen: dict[str, dict[str, dict[str, Any]]] = {}
        for setting in settings:
            # A method given one rate is not swept (an arm run at a rate chosen elsewhere, stated).
            chosen[setting] = {m: {"lr": v[0], "objective": None} for m, v in method_lrs.items() if len(v) == 1}
            swept = [m for m in methods if len(method_lrs[m]) > 1]
            if not swept:
                continue
            sweep = run_all(
                [
                    spec(m, setting, seed, lr, "sweep", budget)
                    for seed in range(args.sweep_seeds)
                    for i in range(max(map(len, method_lrs.values())))
                    for m in swept
                    for lr in method_lrs[m][i : i + 1]
                ],
                args.out / "per_run",
                args.jobs,
                f"learning-rate sweep ({setting}, validation split)",
                train=not args.partial,
            )
            if {r["method"] for r in sweep} != set(swept):
                raise SystemExit(f"--partial: the learning-rate sweep ({setting}) has not finished for every method")
            chosen[setting].update(choose_learning_rates(sweep, setting, budget))
            print(
                f"chosen learning rates ({setting}): "
                f"{ {m: (c['lr'], 'fixed' if c['objective'] is None else 'interior' if c['interior'] else 'AT AN END') for m, c in chosen[setting].items()} }"
            )
        # Seed-major order: the methods share the machine's load alike, and a partial run has whole seeds.
        specs = [
            spec(m, s, seed, chosen[s][m]["lr"], "main", budget)
            for seed in range(args.seeds)
            for s in settings
            for m in methods
        ]
        runs = run_all(specs, args.out / "per_run", args.jobs, "main runs (held-out split)", train=not args.partial)
        if args.partial:  # whole seeds only: every method of every setting finished
            complete = {
                seed
                for seed in range(args.seeds)
                if sum(r["seed"] == seed for r in runs) == len(methods) * len(settings)
            }
            runs = [r for r in runs if r["seed"] in complete]
            if not runs:
                raise SystemExit("--partial: no seed has finished for every method yet")
            print(f"--partial: {len(complete)} complete seed(s) of {args.seeds}: {sorted(complete)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    attach_quiet_seconds(runs, probes["cost"])
    summary = summarise(runs, args.iterations)
    pngs = plot(runs, args.out)
    result = {
        "benchmark": "ablation",
        "command": " ".join(["python -m benchmarks.ablation", *(sys.argv[1:] if argv is None else argv)]),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "algorithm": algorithm,
            "methods": {
                m: {**METHODS[m], **({"train": METHOD_TRAIN[m]} if m in METHOD_TRAIN else {})} for m in methods
            },
            "swept_learning_rates": method_lrs,
            "reward_settings": {s: REWARD_SETTINGS[s] for s in settings},
            "compute_unit": "one transformer forward of one row; a backward counts 2",
            "interpolation": "linear between eval points",
            "heldout_prompts": heldout,
            "validation_prompts": validation,
        },
        "learning_rates": chosen,
        "partial": args.partial,
        "seeds_summarised": sorted({r["seed"] for r in runs}),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "jobs": args.jobs},
        "model": {
            "path": str(model),
            "sha256_of_weights": model_sha,
            "pretraining": model_record.get("settings"),
            **{k: model_record.get(k) for k in ("seed", "vae_loss", "flow_loss", "transformer_parameters")},
        },
        "probe_cost_per_iteration": probes["cost"],
        "budget_compute": budget,
        "summary": summary,
        "power": power(summary),
        "runs": runs,
        "plots": [p.name for p in pngs],
        "runtime_seconds": time.monotonic() - started,
    }
    (args.out / "ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(summary, args.iterations) + probe_markdown(probes["cost"])
    (args.out / "ablation.md").write_text(table + f"\nruntime {result['runtime_seconds']:.0f} s\n")
    print(table)
    print(
        f"runtime {result['runtime_seconds']:.0f} s; wrote {args.out / 'ablation.json'}, ablation.md, {len(pngs)} PNGs"
    )
    return 0


# A probe (one thread) and the one before it hold the 1-minute load average near 1; above 1.5 another job ran.
PROBE_LOAD_LIMIT = 1.5


def probe_markdown(cost: dict[str, dict[str, Any]]) -> str:
    """The per-phase seconds of one iteration measured alone (the equal-wall-time views read these, not
    the runs' own seconds, which two to four runs sharing the cores inflate), with the load average at
    each probe's start and a warning naming the probes that were not taken on a quiet machine."""
    phases = list(dict.fromkeys(ph for c in cost.values() for ph in c["phases"]))
    lines = [
        "\n### seconds per iteration alone (probes; the wall-time views read these)\n",
        "| method | s / iteration | " + " | ".join(phases) + " | load average at start |",
        "|---" * (len(phases) + 3) + "|",
    ]
    for method, c in cost.items():
        cells = " | ".join(f"{c['phases'].get(ph, 0.0):.2f}" for ph in phases)
        load = c.get("load_average")  # probes from before the load was recorded have none
        lines.append(
            f"| {method} | {c['seconds']:.2f} | {cells} | {'not recorded' if load is None else f'{load:.2f}'} |"
        )
    busy = [m for m, c in cost.items() if (c.get("load_average") or 0.0) > PROBE_LOAD_LIMIT]
    if busy:
        lines.append(
            f"\n**Warning:** probes of {', '.join(busy)} started at a load average above {PROBE_LOAD_LIMIT}: the "
            "machine was not quiet, so the wall-time views are skewed. Delete probes.json and rerun the command "
            "on an idle machine (finished runs are reused; only the probes are retaken)."
        )
    return "\n".join(lines) + "\n"


def power(summary: dict[str, Any]) -> dict[str, Any]:
    """Per reward setting and view, the best method's gain over the base model on each trained reward
    and the largest 95 % half-width among the methods: the issue asks for half-width ≤ gain / 3."""
    out: dict[str, Any] = {}
    for setting, table in summary.items():
        for view in ("equal_iterations", "equal_compute", "equal_wall_time"):
            for metric in REWARD_SETTINGS[setting]:
                rows = table[view]
                gain = max(r[metric]["mean"] for r in rows.values()) - table["base"][metric]
                half = max(r[metric]["ci95"] for r in rows.values())
                out[f"{setting}/{view}/{metric}"] = {
                    "best_gain": gain,
                    "max_ci95": half,
                    "powered": bool(gain > 0 and half <= gain / 3),
                }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
