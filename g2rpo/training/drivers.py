"""What the trainer's loop drives: the optimiser drivers, LoRA adapters and the EMA of the weights.

A driver owns the optimiser (and, under DeepSpeed, the engine around the policy); the loop in
:mod:`g2rpo.training.trainer` only calls it:

- ``policy`` — what the strategy calls for velocities (the module, or the DeepSpeed engine so that
  ZeRO-3's gather hooks run);
- ``backward(loss, boundary)`` — back-propagate one loss term; ``boundary`` closes the accumulation;
- ``step() -> grad norm`` — clip and step the optimiser;
- ``learning_rate``, ``save(dir)`` / ``load(dir, saved)`` (checkpoints; ``saved`` is the checkpoint's
  :class:`~g2rpo.training.checkpoint.TrainerState`), ``full_state_dict()`` (export).

:class:`TorchDriver` is plain ``torch.optim.AdamW`` + ``clip_grad_norm_`` on one process, fp32.
:class:`DeepSpeedDriver` is a DeepSpeed engine (ZeRO 0–3, bf16 with fp32 master weights) whose
gradient accumulation boundaries come from the strategy's terms; the loss is not rescaled, since the
strategy already divides by |M|. A DeepSpeed checkpoint made at another world size is loaded
through DeepSpeed's *universal checkpoint* (see :meth:`DeepSpeedDriver.load`). :func:`apply_lora` adds peft LoRA adapters (base frozen, seeded
initial values); :class:`EMA` keeps a float32 moving average of the trainable tensors.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.training.checkpoint import TrainerState
from g2rpo.training.deepspeed_config import build_deepspeed_config, validate_deepspeed_config
from g2rpo.training.distributed import DistContext
from g2rpo.training.lora import lora_target_problem
from g2rpo.training.run_config import LoraSection, RunConfig

__all__ = ["TorchDriver", "DeepSpeedDriver", "to_universal", "apply_lora", "EMA", "trainable_tensors"]


# --------------------------------------------------------------------------- drivers


class TorchDriver:
    """Plain single-process optimisation: ``loss.backward()``, clip, ``AdamW.step()``."""

    backend = "torch"

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], config: RunConfig) -> None:
        train = config.train
        self.module = module
        self.params = params
        self.max_grad_norm = train.max_grad_norm
        self.optimizer = torch.optim.AdamW(
            params,
            lr=config.learning_rate,
            betas=tuple(train.adam_betas),
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )

    @property
    def policy(self) -> torch.nn.Module:
        return self.module

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def trainable_state(self) -> dict[str, torch.Tensor]:
        names = {id(p): n for n, p in self.module.named_parameters()}
        return {names[id(p)]: p.detach() for p in self.params}

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir(exist_ok=True)
        torch.save(self.trainable_state(), directory / "torch" / "model.pt")
        torch.save(self.optimizer.state_dict(), directory / "torch" / "optimizer.pt")

    def load(self, directory: Path, saved: TrainerState) -> None:
        # One process always: a plain checkpoint holds whole tensors, whatever saved it.
        weights = torch.load(directory / "torch" / "model.pt", weights_only=True)
        current = self.trainable_state()
        if set(weights) != set(current):
            raise G2RPOError(
                f"checkpoint {directory} holds other trainable tensors than this model "
                f"({len(weights)} vs {len(current)}): resume with the config it was made with"
            )
        with torch.no_grad():
            for name, tensor in current.items():
                tensor.copy_(weights[name])
        self.optimizer.load_state_dict(torch.load(directory / "torch" / "optimizer.pt", weights_only=True))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module holds the full weights


# DeepSpeed's CPU backend builds this op (a shared-memory all-reduce between the ranks of one machine) with
# the C++ compiler at start-up, on every Linux host, and fails outright where there is none.
SHM_COMM_OP = "deepspeed_shm_comm"


def _cpu_comm_without_compiler(deepspeed: Any, ctx: DistContext) -> None:
    """Without a C++ compiler (``$CXX``, else ``c++``: what torch's extension builder runs), mark DeepSpeed's
    shared-memory op not compatible — DeepSpeed's own switch for leaving it out — so its CPU backend
    communicates through gloo instead of failing in ``init_distributed`` (``c++: not found``; seen in the
    cluster tier's TrainJob pods, whose image has no compiler). Rank 0 says so once."""
    if shutil.which(os.environ.get("CXX", "c++")) is not None:
        return
    compatible = deepspeed.ops.__compatible_ops__
    if compatible.get(SHM_COMM_OP, False):
        compatible[SHM_COMM_OP] = False
        if ctx.is_main:
            print(
                f"g2rpo: no C++ compiler ({os.environ.get('CXX', 'c++')}) to build DeepSpeed's {SHM_COMM_OP} op: "
                "its CPU ranks communicate through gloo",
                file=sys.stderr,
                flush=True,
            )


def optimizer_kind(setting: str, device: torch.device) -> str:
    """``adamw`` or ``fused_adam`` for ``deepspeed.optimizer`` on ``device`` (auto: FusedAdam on CUDA)."""
    if setting == "auto":
        return "fused_adam" if device.type == "cuda" else "adamw"
    if setting == "fused_adam" and device.type != "cuda":
        raise G2RPOError(
            problem(
                "deepspeed.optimizer",
                setting,
                f"FusedAdam is a CUDA op and this run trains on {device.type}: use adamw (or auto)",
            )
        )
    return setting


def deepspeed_arch_list(value: str | None) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` as DeepSpeed 0.19's JIT builder can read it: it parses every entry as
    ``MAJOR.MINOR[+PTX]`` and stops on an architecture-specific one that PyTorch accepts, e.g. ``9.0a``
    (``int('0a')``: seen on an H200 image). Such an entry becomes its portable ``9.0``; None stays None."""
    if value is None:
        return None
    entries = [e for e in value.replace(" ", ";").split(";") if e.strip()]
    fixed = []
    for entry in entries:
        arch, ptx = (entry.split("+", 1) + [""])[:2]
        arch = arch.strip().rstrip("abcdefghijklmnopqrstuvwxyz") if "." in arch else arch.strip()
        fixed.append(arch + (f"+{ptx}" if ptx else ""))
    return ";".join(dict.fromkeys(fixed))


def load_fused_adam() -> type:
    """DeepSpeed's ``FusedAdam`` class, its CUDA op loaded (JIT-built on first use and cached; the trainer
    image pre-builds it). A ``TORCH_CUDA_ARCH_LIST`` DeepSpeed cannot parse is rewritten for the build
    (:func:`deepspeed_arch_list`) and the change is said on stderr."""
    original = os.environ.get("TORCH_CUDA_ARCH_LIST")
    readable = deepspeed_arch_list(original)
    if readable != original:
        print(
            f"g2rpo train: TORCH_CUDA_ARCH_LIST={original!r} has entries DeepSpeed cannot parse; FusedAdam is "
            f"built for {readable!r}",
            file=sys.stderr,
            flush=True,
        )
        os.environ["TORCH_CUDA_ARCH_LIST"] = readable
    try:
        from deepspeed.ops.adam import FusedAdam
        from deepspeed.ops.op_builder import FusedAdamBuilder

        FusedAdamBuilder().load()  # the op, here rather than at the first step
        return FusedAdam
    finally:
        if original is not None:
            os.environ["TORCH_CUDA_ARCH_LIST"] = original


def build_optimizer(config: RunConfig, params: list[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    """AdamW over ``params`` with the run's settings, as ``deepspeed.optimizer`` chooses (see deepspeed_config)."""
    train = config.train
    settings = dict(lr=config.learning_rate, betas=tuple(train.adam_betas), eps=train.adam_eps)
    if optimizer_kind(config.deepspeed.optimizer, device) == "fused_adam":
        fused_adam = load_fused_adam()  # loads (or JIT-builds) the CUDA op here, before any step
        return fused_adam(params, weight_decay=train.weight_decay, adam_w_mode=True, **settings)
    return torch.optim.AdamW(params, weight_decay=train.weight_decay, **settings)


class DeepSpeedDriver:
    """A DeepSpeed engine around the policy (ZeRO 0–3), driven through ``backward`` / ``step``."""

    backend = "deepspeed"

    def __init__(
        self, module: torch.nn.Module, params: list[torch.nn.Parameter], config: RunConfig, ctx: DistContext
    ) -> None:
        import deepspeed  # heavy (and JIT-compiles ops): loaded only when a run asks for DeepSpeed

        train = config.train
        self.ds_config = build_deepspeed_config(
            config.deepspeed,
            precision=train.precision,
            max_grad_norm=train.max_grad_norm,
            world_size=ctx.world_size,
            accumulation_steps=1,  # boundaries come from the strategy's terms (set_gradient_accumulation_boundary)
        )
        validate_deepspeed_config(self.ds_config, ctx.world_size)
        optimizer = build_optimizer(config, params, ctx.device)
        if not ctx.distributed:
            # deepspeed.initialize wants a process group even for one rank.
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        if ctx.device.type != "cuda":
            _cpu_comm_without_compiler(deepspeed, ctx)
        deepspeed.init_distributed(dist_backend="nccl" if ctx.device.type == "cuda" else "gloo", verbose=False)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=self.ds_config, dist_init_required=False
        )
        self.module = self.engine.module
        self.zero_stage = config.deepspeed.zero_stage
        self.ctx = ctx

    @property
    def policy(self) -> Any:
        return self.engine  # engine(x, sigma, cond) runs the module's forward with ZeRO's hooks

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss, scale_wrt_gas=False)  # the strategy already scaled each term
        if not boundary:
            self.engine.step()  # a micro-step: DeepSpeed only counts it

    def zero_loss(self, rollout: Any) -> torch.Tensor:
        """A loss of exactly 0 made by one real forward of one row (padding for lock-step ranks).

        A real forward (not 0·Σθ) so that ZeRO-3 gathers and every stage's gradient hooks fire in
        the same order as for a loss term: ZeRO-2 packs gradients into reduction buckets in the
        order they arrive, and ranks must agree on it.
        """
        row = rollout.final_latents[:1]
        cond = rollout.cond[rollout.final_prompt[:1].to(torch.long)]
        sigma = torch.full((1,), 0.5, device=row.device)
        return self.engine(row, sigma, cond).sum() * 0.0

    def step(self) -> float | None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    @property
    def learning_rate(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag="state", save_latest=False)

    def load(self, directory: Path, saved: TrainerState) -> None:
        """Restore weights and optimiser state from the checkpoint ``directory`` (collective).

        At the world size it was saved with, DeepSpeed reads its own shards. At another one (a
        16-rank run resumed on 8) ZeRO's flat shards do not fit the new partitioning, so rank 0 (each
        node's first rank, with node-local folders) first converts them with DeepSpeed's
        ``ds_to_universal`` into the *universal* layout — per parameter name its fp32 master weights, ``exp_avg``, ``exp_avg_sq`` and step — in a scratch
        folder ``iter-NNNNNN.universal`` beside the checkpoint (the checkpoint itself, complete and
        digested, is never written to); every rank then loads its new partition from it, and the
        scratch folder is removed. ZeRO stage 0 does not shard: its one ``mp_rank_00_model_states.pt``
        holds the whole optimiser state, and any world size loads it directly.
        """
        if saved.zero_stage is not None and saved.zero_stage != self.zero_stage:
            # Each stage keeps its own file layout; DeepSpeed's loaders read only their own.
            raise G2RPOError(
                problem(
                    "deepspeed.zero_stage",
                    self.zero_stage,
                    f"checkpoint {directory} was written under ZeRO stage {saved.zero_stage}: resume with "
                    f"deepspeed.zero_stage={saved.zero_stage} (the world size may change; the stage may not)",
                )
            )
        source = directory / "deepspeed"
        if saved.world_size == self.ctx.world_size or self.zero_stage == 0:
            self._load_from(source)
            return
        scratch = directory.with_name(f"{directory.name}.universal")
        # The folder's leader converts: rank 0, or with node-local folders each node's first rank, in its own folder.
        if self.ctx.is_folder_leader:
            if scratch.exists():  # left by a resume killed mid-way: redo it
                shutil.rmtree(scratch)
            to_universal(source / "state", scratch / "state")
        self.ctx.barrier()
        # DeepSpeed reads the flag from its config only inside load_checkpoint; the engine stays
        # built for its own world size, and later saves write ordinary shards again.
        self.engine._config.load_universal_checkpoint = True
        try:
            self._load_from(scratch)
        finally:
            self.engine._config.load_universal_checkpoint = False
        self.ctx.barrier()
        if self.ctx.is_folder_leader:
            shutil.rmtree(scratch)

    def _load_from(self, folder: Path) -> None:
        path, _ = self.engine.load_checkpoint(
            str(folder), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise G2RPOError(f"DeepSpeed found no checkpoint in {folder}: the checkpoint is damaged")

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3: the consolidated 16-bit weights (rank 0; collective call). Else None."""
        if self.zero_stage != 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()


def to_universal(source: Path, target: Path) -> None:
    """Convert the ZeRO checkpoint folder ``source`` (one tag's shards) into DeepSpeed's universal
    layout in ``target`` with DeepSpeed's own converter, in this process (its worker pools would
    fork a process that holds the process group) and with its progress output on stderr."""
    from deepspeed.checkpoint.ds_to_universal import main as convert  # heavy, and only for a resize

    options = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(target),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        # Our checkpoints do not carry the version record the converter asks for (it only
        # describes tensor-parallel slicing, which a pure data-parallel run has none of).
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(sys.stderr):
        convert(options)


# --------------------------------------------------------------------------- LoRA, EMA


def apply_lora(transformer: torch.nn.Module, lora: LoraSection, seed: int | None = None) -> None:
    """Add peft LoRA adapters to ``transformer`` (base weights frozen). A target that matches no
    module is an error listing close module names. peft draws the adapters' initial A from the
    global torch RNG; with ``seed`` that draw is made from ``torch.manual_seed(seed)`` in a forked
    RNG (the caller's RNG state is left as it was), so the same seed gives the same adapters."""
    from peft import LoraConfig  # heavy: loaded only when a run asks for LoRA

    wrong = lora_target_problem(transformer, lora.target_modules)
    if wrong:
        raise G2RPOError(wrong)
    transformer.requires_grad_(False)
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        init_lora_weights="gaussian",
    )
    if seed is None:
        transformer.add_adapter(config)
        return
    with torch.random.fork_rng(devices=[]):  # the transformer is on the CPU here
        torch.manual_seed(seed)
        transformer.add_adapter(config)


def trainable_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of ``module`` that train, by name: what the EMA averages and the export writes."""
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


class EMA:
    """Exponential moving average of named trainable tensors, kept in float32:
    ``θ_ema ← d·θ_ema + (1 − d)·θ`` after each optimiser step.

    With ``warmup`` the s-th update (s = 1, 2, …) uses d_s = min((1 + s)/(10 + s), d), so the average
    follows the first steps closely (0.18 at the first, 0.5 at the eighth) and reaches d after
    (10·d − 1)/(1 − d) steps (81 at d = 0.9): the published ``EMAModuleWrapper`` of DiffusionNFT
    (``flow_grpo/ema.py``, NVlabs/DiffusionNFT at 24af555). The count of updates is checkpointed with
    the tensors."""

    STEPS_KEY = "__ema_updates__"  # the count in state_dict(); no parameter is named so

    def __init__(self, named: dict[str, torch.Tensor], decay: float, warmup: bool = False) -> None:
        self.decay, self.warmup, self.updates = decay, warmup, 0
        self.shadow = {n: t.detach().float().clone() for n, t in named.items()}

    def current_decay(self) -> float:
        """The decay of the next update."""
        if not self.warmup:
            return self.decay
        s = self.updates + 1
        return min((1 + s) / (10 + s), self.decay)

    @torch.no_grad()
    def update(self, named: dict[str, torch.Tensor]) -> None:
        decay = self.current_decay()
        for n, t in named.items():
            self.shadow[n].mul_(decay).add_(t.detach().float(), alpha=1.0 - decay)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.shadow, self.STEPS_KEY: torch.tensor(self.updates)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        updates = state.pop(self.STEPS_KEY, None)
        if set(state) != set(self.shadow):
            raise G2RPOError("the checkpoint's EMA tensors do not match this model's trainable parameters")
        if updates is None and self.warmup:
            raise G2RPOError(
                "the checkpoint's EMA has no count of its updates, which train.ema.warmup needs: it was written "
                "before the count was kept; resume with train.ema.warmup: false, or start the run again"
            )
        self.shadow = {n: t.float().clone() for n, t in state.items()}
        self.updates = int(updates) if updates is not None else 0
