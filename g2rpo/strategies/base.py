"""The interfaces between strategies, models and the trainer.

Three contracts live here; the trainer, the model adapters and each strategy depend on them and on
nothing of each other.

**Velocity model** (:class:`VelocityModel`): ``model(x, sigma, cond) -> v`` with ``x`` the packed
latents ``[B, L, C]`` float32, ``sigma`` a ``[B]`` float32 tensor (rows batched together may sit at
different σ) and ``cond`` a :class:`Conditioning` of batch size B. It returns the velocity
``[B, L, C]`` (float32; the adapter casts to and from its own dtype and rounds the timestep the way
its pipeline does). σ follows the convention of ``g2rpo.core``: 1 is noise, 0 is data.

**Conditioning** (:class:`Conditioning`): the per-prompt model inputs (for Flux: T5 sequence
embeddings and CLIP pooled embeddings). It has a batch size (``len``), can be indexed along the
batch with a LongTensor or a slice, and can repeat each row ``n`` times in place
(``repeat_interleave``). Strategies build every model batch with these operations only, e.g.
``cond[prompt_of_row]`` for rows of several prompts. A result may share storage with the
conditioning it came from — rows that all name one prompt should be a broadcast view, not a copy
(:func:`g2rpo.core.take_rows`; G²RPO conditions hundreds of rows on one prompt) — so models and
strategies read conditionings and never write into them.

**Strategy** (:class:`Strategy`), used by the trainer once per iteration::

    draws = Draws(run_seed, iteration, global_prompt_indices)        # g2rpo.seeding
    rollout = strategy.rollout(model, cond, draws, latent_shape=(L, C))   # under torch.no_grad
    rewards = ...  # decode rollout.final_latents in micro-batches, score with R reward models,
                   # stack to [R, N] and reshape to [R, *rollout.reward_shape]
    advantages = strategy.advantages(rollout, rewards, reward_weights)
    terms = []
    for term in strategy.loss_terms(model, rollout, advantages):
        engine.backward(term.loss)          # the trainer (or DeepSpeed) owns backward ...
        terms.append(term.detached())
        if term.step_optimizer:
            engine.step()                   # ... and the optimiser step
    stats = summarize_step(rollout, rewards, advantages, terms)

``loss_terms`` is a generator: each term holds the graph of its own forward, so the trainer must
run ``backward`` on a term before asking for the next one (memory stays at one forward's
activations). Each term's loss is already scaled so that the *sum* of all backward passes is the
gradient of the iteration's objective; a strategy never calls ``backward`` or ``step``. A strategy
that carries state from one iteration to the next (:class:`StatefulStrategy`: DiffusionNFT's old
policy) also has ``state_dict``/``load_state_dict``, which the trainer writes into checkpoints.

**Final latents layout.** ``rollout.final_latents`` is ``[N, L, C]`` with N = prod(reward_shape),
stored in row-major order of ``reward_shape`` whose axes are named by ``reward_dims`` (e.g.
``("prompt", "step", "stride", "branch")`` = ``[P, |M|, J, G]`` for G²RPO, ``("prompt", "branch")``
for DanceGRPO). ``rollout.final_prompt`` ``[N]`` says which batch position (prompt) each latent
belongs to, so a reward that needs the prompt text can look it up. Rewards come back as
``[R, *reward_shape]``; a NaN/inf reward drops its group (counted, never averaged in).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from g2rpo.seeding import Draws
from g2rpo.strategies.settings import StrategySettings

__all__ = [
    "Conditioning",
    "VelocityModel",
    "ReferenceVelocityModel",
    "Strategy",
    "StatefulStrategy",
    "NFECounters",
    "G2RPOStates",
    "TrajectoryStates",
    "NFTStates",
    "TreeStates",
    "Rollout",
    "Advantages",
    "TermStats",
    "LossTerm",
    "StepStats",
    "summarize_step",
]


# --------------------------------------------------------------------------- model-side protocols


@runtime_checkable
class Conditioning(Protocol):
    """Per-prompt model inputs, indexable and repeatable along the batch (dim 0)."""

    def __len__(self) -> int:
        """Batch size."""
        ...

    def __getitem__(self, index: torch.Tensor | slice) -> Conditioning:
        """Rows ``index``: a LongTensor of batch positions (repeats allowed; on the CPU or the
        model's device, the conditioning moves it where it needs it) or a slice. May be a view
        (read-only use): one prompt repeated is a broadcast of its row."""
        ...

    def repeat_interleave(self, repeats: int) -> Conditioning:
        """Each row repeated ``repeats`` times in place: rows ``[a, a, b, b]`` for ``[a, b]``, 2."""
        ...


@runtime_checkable
class VelocityModel(Protocol):
    """``v = model(x [B, L, C] float32, sigma [B] float32, cond (batch B)) -> [B, L, C] float32``."""

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor: ...


@runtime_checkable
class ReferenceVelocityModel(VelocityModel, Protocol):
    """A velocity model that can also give the frozen reference policy's velocity (for a KL penalty):
    ``model.reference_velocity(x, sigma, cond)``, same shapes, no grad. With LoRA the reference is
    the base model with its adapters disabled (Flow-GRPO's ``disable_adapter()``)."""

    def reference_velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor: ...


# --------------------------------------------------------------------------- records


@dataclass
class NFECounters:
    """Model evaluations in one iteration (per rank), counted as rows (one row = one image).

    ``sampling_forwards``: forwards in the rollout (no grad). ``training_forwards``: forwards with
    grad in the loss. ``training_backwards``: rows whose forward is back-propagated (each training
    forward is back-propagated once, so it equals ``training_forwards``). ``model_calls``: batched
    calls in the rollout (a call of batch B counts B sampling forwards and 1 call).
    """

    sampling_forwards: int = 0
    training_forwards: int = 0
    training_backwards: int = 0
    model_calls: int = 0

    def __add__(self, other: NFECounters) -> NFECounters:
        return NFECounters(
            self.sampling_forwards + other.sampling_forwards,
            self.training_forwards + other.training_forwards,
            self.training_backwards + other.training_backwards,
            self.model_calls + other.model_calls,
        )


@dataclass
class G2RPOStates:
    """What a G²RPO rollout keeps for its loss (K = |M| trained steps per prompt this iteration)."""

    steps: torch.Tensor  # [P, K] long, the grid index k of each slot (sorted per prompt)
    x_k: torch.Tensor  # [P, K, L, C] the anchor's state x[k], shared by the G branches
    branches: torch.Tensor  # [P, K, G, L, C] the SDE samples y_i at σ[k+1]
    log_prob_old: torch.Tensor  # [P, K, G] log π_old(y_i | x[k]), as sampled


@dataclass
class TrajectoryStates:
    """What a whole-trajectory rollout (DanceGRPO, MixGRPO) keeps for its loss (S trained slots)."""

    latents: torch.Tensor  # [P, G, T+1, L, C] every state of every trajectory, x at σ[0] … σ[T]
    log_prob_old: torch.Tensor  # [P, G, T] log π_old of step i (NaN where step i was an ODE step)
    trained_steps: torch.Tensor  # [P, G, S] long, the grid indices each trajectory trains
    window: list[int] | None = None  # MixGRPO: the SDE window this iteration


@dataclass
class NFTStates:
    """What a DiffusionNFT rollout keeps for its forward-process loss (S trained timesteps per sample)."""

    clean: torch.Tensor  # [P, G, L, C] the clean sample x₀ of each trajectory (the one scored)
    steps: torch.Tensor  # [P, G, S] long, the grid index of each trained timestep (σ = sigmas[steps])
    noisy: torch.Tensor  # [P, G, S, L, C] x_t = (1 − σ)·x₀ + σ·ε, ε drawn per (sample, timestep)
    v_old: torch.Tensor  # [P, G, S, L, C] the old policy's velocity at x_t
    v_ref: torch.Tensor | None = None  # [P, G, S, L, C] the reference policy's, when the KL weight is > 0


@dataclass
class TreeStates:
    """What a BranchGRPO rollout keeps for its loss: every node of every prompt's tree, by depth.

    Depth i holds n_i = ``widths[i]`` nodes per prompt (the states at σ[i]); the children of node j
    at depth i are nodes b_i·j … b_i·j + b_i − 1 at depth i + 1, b_i = n_{i+1}/n_i
    (:func:`g2rpo.core.tree_widths`).
    """

    widths: list[int]  # [T+1] nodes per prompt at each depth, 1 at the root, the leaves at T
    latents: list[torch.Tensor]  # T+1 tensors [P, n_i, L, C], the nodes' states x at σ[i]
    log_prob_old: list[torch.Tensor]  # T tensors [P, n_{i+1}], log π_old of the edge into each node of depth i+1
    trained_steps: list[int]  # the grid steps i whose edges (depth i → i+1) train, sorted


@dataclass
class Rollout:
    """What a strategy sampled for a batch of P prompts, and what its loss needs later.

    Common fields are read by the trainer; ``states`` holds the strategy's own typed record
    (:class:`G2RPOStates`, :class:`TrajectoryStates`, :class:`NFTStates` or :class:`TreeStates`), which
    only that strategy's ``advantages``/``loss_terms`` read.
    All tensors are detached (the rollout runs without grad).
    """

    strategy: str
    sigmas: torch.Tensor  # [T+1] the grid, σ[0] = 1 ... σ[T] = 0
    cond: Conditioning  # batch P
    draws: Draws
    final_latents: torch.Tensor  # [N, L, C], N = prod(reward_shape), row-major in reward_shape
    reward_shape: tuple[int, ...]  # e.g. (P, |M|, J, G)
    reward_dims: tuple[str, ...]  # names of reward_shape's axes, e.g. ("prompt", "step", "stride", "branch")
    final_prompt: torch.Tensor  # [N] long, batch position of the prompt of each final latent
    nfe: NFECounters
    states: G2RPOStates | TrajectoryStates | NFTStates | TreeStates

    @property
    def num_prompts(self) -> int:
        return len(self.cond)

    def reward_layout(self, num_rewards: int) -> tuple[int, ...]:
        """The shape rewards must have: ``(R, *reward_shape)``."""
        return (num_rewards, *self.reward_shape)


@dataclass
class Advantages:
    """Advantages of one iteration, in the strategy's own layout.

    ``values``: the clipped, mixed advantage per trained sample (G²RPO ``[P, K, G]``, DanceGRPO
    ``[P, G]``). ``valid``: bool mask of the groups used (same shape without the last axis); a group
    with a NaN/inf reward is invalid, its advantages are 0 and it adds nothing to the loss.
    """

    values: torch.Tensor
    valid: torch.Tensor
    dropped_groups: int
    total_groups: int


@dataclass
class TermStats:
    """Detached numbers of one loss term (for logs and the step's stats)."""

    loss: float  # the term's loss as returned (already scaled)
    clip_fraction: float  # fraction of ratios outside [1 - ε, 1 + ε]
    ratio_mean: float
    ratio_max: float
    num_ratios: int  # how many (sample, step) ratios the term covers
    forwards: int  # training forwards (rows) of this term, each back-propagated once
    step_index: int | None = None  # the grid index k the term trains, where it has one
    kl: float | None = None  # Flow-GRPO: mean KL(π_θ ‖ π_ref) of its SDE steps; DiffusionNFT: mean (v_θ − v_ref)²
    reference_forwards: int = 0  # forwards (rows) of the frozen reference in this term, no grad (Flow-GRPO's KL)


@dataclass
class LossTerm:
    """One backward pass: ``loss`` (scalar with grad), its stats, and whether to step after it."""

    loss: torch.Tensor
    stats: TermStats
    step_optimizer: bool

    def detached(self) -> LossTerm:
        return LossTerm(self.loss.detach(), self.stats, self.step_optimizer)


@dataclass
class StepStats:
    """What one iteration did: the record metrics, logs and tests read.

    ``reward_mean[r][j]``: mean finite reward of model r at stride j (one column for strategies
    without strides); ``reward_std[r][j]`` the standard deviation of the same rewards (population:
    divided by their count). ``loss`` is the sum of the terms' losses (= the objective's value, negated).
    With no loss term (every group dropped) ``clip_fraction``/``ratio_mean``/``ratio_max`` are NaN
    and ``loss`` is 0.
    """

    reward_mean: list[list[float]]
    reward_std: list[list[float]]
    reward_mean_all: float
    advantage_mean: float
    advantage_std: float
    advantage_abs_max: float
    loss: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    sampling_forwards: int
    training_forwards: int
    training_backwards: int
    model_calls: int
    optimizer_steps: int
    dropped_groups: int
    total_groups: int
    # Forwards of the frozen reference policy in the loss (no grad, not back-propagated): Flow-GRPO's KL.
    # DiffusionNFT evaluates its reference in the rollout, so its reference forwards are sampling forwards.
    reference_forwards: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- strategy protocol


@runtime_checkable
class Strategy(Protocol):
    """A credit-assignment strategy (G²RPO, DanceGRPO, MixGRPO). See the module docstring.

    Built as ``cls(config)`` from an :class:`~g2rpo.strategies.config.AlgorithmConfig` whose
    ``strategy`` is ``name``; its own knobs are the ``Settings`` section, ``config.<name>``.
    """

    name: str
    Settings: type[StrategySettings]

    def rollout(
        self,
        model: VelocityModel,
        cond: Conditioning,
        draws: Draws,
        latent_shape: tuple[int, int],
        *,
        device: torch.device | str = "cpu",
    ) -> Rollout:
        """Sample a batch of ``len(cond)`` prompts (no grad); latents are ``[L, C]`` per image."""
        ...

    def advantages(
        self,
        rollout: Rollout,
        rewards: torch.Tensor,
        reward_weights: Sequence[float] | None = None,
    ) -> Advantages:
        """Group-normalised, mixed, clipped advantages from rewards ``[R, *rollout.reward_shape]``.

        ``reward_weights`` ``[R]`` (default all 1) weight the reward models' advantages.
        """
        ...

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        """Yield the iteration's loss terms in order (backward each before taking the next)."""
        ...


@runtime_checkable
class StatefulStrategy(Strategy, Protocol):
    """A strategy that carries state from one iteration to the next (DiffusionNFT's old policy).

    The trainer writes ``state_dict()`` into every checkpoint (``strategy.pt``) and hands it back to
    ``load_state_dict`` on resume, so a resumed run continues the same trajectory. The state holds
    tensors, ints and dicts of them (``torch.load(weights_only=True)`` reads it).
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# --------------------------------------------------------------------------- stats


def summarize_step(
    rollout: Rollout,
    rewards: torch.Tensor,
    advantages: Advantages,
    terms: Sequence[LossTerm],
    reward_weights: Sequence[float] | None = None,
) -> StepStats:
    """Fold a rollout, its rewards, its advantages and the (detached) terms into a StepStats.

    ``reward_weights`` (one per reward model) marks the rewards that train: ``reward_mean_all``
    averages only those with a non-zero weight, so a metric scored at weight 0 to watch it (another
    scale, e.g. JPEG bits) does not move the number a progress bar shows as "the reward".
    """
    rewards = rewards.detach().float().cpu()
    r = rewards.shape[0]
    # Put the stride axis (if any) right after R and flatten the rest.
    dims = ("reward", *rollout.reward_dims)
    if "stride" in dims:
        s = dims.index("stride")
        by_stride = rewards.movedim(s, 1).reshape(r, rewards.shape[s], -1)  # [R, J, rest]
    else:
        by_stride = rewards.reshape(r, 1, -1)  # [R, 1, rest]
    finite = torch.isfinite(by_stride)
    safe = torch.where(finite, by_stride, torch.zeros_like(by_stride))
    counts = finite.sum(-1).clamp_min(1)
    mean = safe.sum(-1) / counts  # [R, J]
    reward_mean = mean.tolist()
    squared = torch.where(finite, (by_stride - mean.unsqueeze(-1)) ** 2, torch.zeros_like(by_stride))
    reward_std = (squared.sum(-1) / counts).sqrt().tolist()  # [R][J]
    trained = rewards
    if reward_weights is not None:
        if len(reward_weights) != r:
            raise ValueError(f"reward_weights has {len(reward_weights)} weights for {r} reward models")
        keep = [i for i, w in enumerate(reward_weights) if w != 0] or list(range(r))
        trained = rewards[keep]
    all_finite = torch.isfinite(trained)
    reward_mean_all = float(torch.where(all_finite, trained, 0).sum() / all_finite.sum().clamp_min(1))

    valid = advantages.valid
    adv = advantages.values[valid] if valid.any() else advantages.values.new_zeros(0)
    adv = adv.detach().float().reshape(-1).cpu()
    num = sum(t.stats.num_ratios for t in terms)
    weighted = lambda f: sum(getattr(t.stats, f) * t.stats.num_ratios for t in terms) / max(num, 1)  # noqa: E731
    training_forwards = sum(t.stats.forwards for t in terms)
    return StepStats(
        reward_mean=reward_mean,
        reward_std=reward_std,
        reward_mean_all=reward_mean_all,
        advantage_mean=float(adv.mean()) if adv.numel() else 0.0,
        advantage_std=float(adv.std()) if adv.numel() > 1 else 0.0,
        advantage_abs_max=float(adv.abs().max()) if adv.numel() else 0.0,
        loss=float(sum(t.stats.loss for t in terms)),
        clip_fraction=weighted("clip_fraction") if terms else math.nan,
        ratio_mean=weighted("ratio_mean") if terms else math.nan,
        ratio_max=max((t.stats.ratio_max for t in terms), default=math.nan),
        sampling_forwards=rollout.nfe.sampling_forwards,
        training_forwards=training_forwards,
        training_backwards=training_forwards,
        model_calls=rollout.nfe.model_calls,
        optimizer_steps=sum(1 for t in terms if t.step_optimizer),
        dropped_groups=advantages.dropped_groups,
        total_groups=advantages.total_groups,
        reference_forwards=sum(t.stats.reference_forwards for t in terms),
    )
