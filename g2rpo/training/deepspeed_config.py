"""The DeepSpeed config, generated from the project's config and validated before any rank starts.

Nobody writes DeepSpeed JSON by hand here: :func:`build_deepspeed_config` derives it from the run
config (ZeRO stage, precision, gradient clipping, the batch arithmetic), and
:func:`validate_deepspeed_config` checks it twice:

1. with DeepSpeed's own parser, ``deepspeed.runtime.config.DeepSpeedConfig`` (batch arithmetic,
   unknown keys *inside* ``zero_optimization``, stage range, bf16 together with fp16), which
   runs without a GPU and without an initialised process group;
2. for unknown *top-level* keys, which DeepSpeed silently accepts (a misspelt
   ``gradient_clippping`` would train without clipping, as measured with DeepSpeed 0.19). The
   known keys are the ones DeepSpeed's parser actually reads, recorded while it parses, plus a
   few it only looks up through ``dict.keys()``.

Batch arithmetic. One DeepSpeed *micro-batch* is one loss term the strategy yields: the loss of
one trained step k over the groups a rank holds (one group = one prompt and its G branches; the
shared-velocity trick makes it a single forward/backward). ``gradient_accumulation_steps`` is the
number of loss terms between two optimiser steps (|M| when the strategy steps once per
iteration, 1 when it steps once per k), and ``train_batch_size = micro × accumulation ×
world_size`` as DeepSpeed requires. The strategy already divides each term by |M| (docs/algorithm.md §5), so
the trainer calls ``engine.backward(loss, scale_wrt_gas=False)``: DeepSpeed must not divide again.

The optimiser is built by the trainer (``deepspeed.optimizer``): on CUDA DeepSpeed's ``FusedAdam``
(a CUDA op; the trainer image pre-builds it for sm_90, elsewhere it JIT-compiles once per machine),
on the CPU ``torch.optim.AdamW`` (DeepSpeed's CPU Adam would JIT-compile for ~50 s), hence
``zero_allow_untested_optimizer``. Stage 3 sets
``stage3_gather_16bit_weights_on_model_save`` so that export can consolidate the weights.
"""

from __future__ import annotations

import copy
import difflib
import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from g2rpo.config import COUNT_MAX, Section
from g2rpo.errors import ConfigError, problem

__all__ = ["DeepSpeedSection", "build_deepspeed_config", "validate_deepspeed_config", "known_top_level_keys"]


class DeepSpeedSection(Section):
    """How DeepSpeed shards and reduces (only read when ``enabled``)."""

    enabled: bool = Field(
        False,
        description="drive training through a DeepSpeed engine (ZeRO); false = plain torch AdamW in one process",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        2,
        description="ZeRO stage: 2 shards optimiser state and gradients, 3 also shards parameters (needed at Flux scale "
        "for full fine-tuning)",
    )
    offload_optimizer: bool = Field(
        False,
        description="keep ZeRO's optimiser state in CPU memory (stage >= 1); frees accelerator memory, costs PCIe",
    )
    offload_param: bool = Field(False, description="keep ZeRO-3's parameter shards in CPU memory (stage 3 only)")
    overlap_comm: bool = Field(True, description="overlap gradient reduction with the backward pass")
    optimizer: Literal["auto", "adamw", "fused_adam"] = Field(
        "auto",
        description="the AdamW implementation: fused_adam = DeepSpeed's FusedAdam (a CUDA op, built on first use), "
        "adamw = torch.optim.AdamW (fused kernels on CUDA); auto = fused_adam on CUDA, adamw on the CPU",
    )
    reduce_bucket_size: int = Field(
        500_000_000,
        gt=0,
        le=COUNT_MAX,
        description="elements per gradient-reduction bucket (DeepSpeed's reduce_bucket_size)",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="further DeepSpeed keys merged over the generated config (checked: unknown top-level keys are an "
        "error; DeepSpeed itself would ignore them)",
    )

    @model_validator(mode="after")
    def _check(self) -> DeepSpeedSection:
        if self.offload_param and self.zero_stage != 3:
            raise ValueError(
                problem(
                    "deepspeed.offload_param", True, f"parameter offload needs zero_stage=3 (got {self.zero_stage})"
                )
            )
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError(problem("deepspeed.offload_optimizer", True, "optimiser offload needs zero_stage >= 1"))
        return self


def build_deepspeed_config(
    section: DeepSpeedSection,
    *,
    precision: Literal["fp32", "bf16"],
    max_grad_norm: float,
    world_size: int,
    accumulation_steps: int,
    micro_batch_size: int = 1,
) -> dict[str, Any]:
    """The DeepSpeed config dict for one run (see the module docstring for the batch arithmetic).

    ``micro_batch_size``: groups a rank holds per loss term; ``accumulation_steps``: loss terms per
    optimiser step; ``train_batch_size = micro_batch_size × accumulation_steps × world_size``.
    """
    zero: dict[str, Any] = {
        "stage": section.zero_stage,
        "overlap_comm": section.overlap_comm,
        "contiguous_gradients": True,
        "reduce_bucket_size": section.reduce_bucket_size,
    }
    if section.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if section.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if section.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    config: dict[str, Any] = {
        "train_batch_size": micro_batch_size * accumulation_steps * world_size,
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": accumulation_steps,
        "gradient_clipping": float(max_grad_norm),
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,  # the trainer logs; DeepSpeed's own prints only add noise
        "wall_clock_breakdown": False,
    }
    return _deep_merge(config, section.extra)


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Top-level keys DeepSpeed reads only through ``param_dict.keys()`` or in modules outside the
# config parser (so recording lookups does not see them).
_KEYS_READ_ELSEWHERE = frozenset(
    {
        "optimizer",
        "scheduler",
        "aio",
        "activation_checkpointing",
        "flops_profiler",
        "autotuning",
        "sequence_parallel_size",
        "zero_optimization",
        "checkpoint",
        "nvme_path",
    }
)

_known_keys_cache: frozenset[str] | None = None


class _RecordingDict(dict):
    """A dict that notes every key looked up in it (to learn which keys DeepSpeed reads)."""

    def __init__(self, *args: Any, seen: set[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set() if seen is None else seen

    def __copy__(self) -> _RecordingDict:
        return _RecordingDict(self, seen=self.seen)

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.seen.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)


def known_top_level_keys() -> frozenset[str]:
    """Every top-level key this DeepSpeed version's config parser reads (computed once)."""
    global _known_keys_cache
    if _known_keys_cache is None:
        from deepspeed.runtime.config import DeepSpeedConfig

        probe = _RecordingDict({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1})
        with _quiet_deepspeed():
            DeepSpeedConfig(probe)
        _known_keys_cache = frozenset(probe.seen) | _KEYS_READ_ELSEWHERE
    return _known_keys_cache


class _quiet_deepspeed:
    """Silence DeepSpeed's INFO logging while parsing (it logs every config it sees)."""

    def __enter__(self) -> None:
        from deepspeed.utils import logger

        self._logger = logger
        self._level = logger.level
        logger.setLevel(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        self._logger.setLevel(self._level)


def validate_deepspeed_config(config: dict[str, Any], world_size: int) -> None:
    """Raise :class:`ConfigError` listing every problem with ``config`` for ``world_size`` ranks.

    Checks our own batch arithmetic, then unknown top-level keys (with the closest valid names),
    then DeepSpeed's parser. The parser sees the config as if for one rank when no process group
    is initialised (it reads the world size from ``torch.distributed``), so the arithmetic for
    ``world_size`` is checked here explicitly.
    """
    problems: list[str] = []
    known = known_top_level_keys()
    for key in config:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            problems.append(
                problem(
                    f"deepspeed.{key}", config[key], "DeepSpeed ignores this unknown top-level key; remove it" + hint
                )
            )
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if all(isinstance(v, int) for v in (micro, accumulation, total)):
        if total != micro * accumulation * world_size:
            problems.append(
                problem(
                    "deepspeed.train_batch_size",
                    total,
                    f"must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × world_size = "
                    f"{micro} × {accumulation} × {world_size} = {micro * accumulation * world_size}",
                )
            )
    if not problems:
        problems += _deepspeed_parser_problems(config, world_size)
    if problems:
        raise ConfigError(problems, source="generated DeepSpeed config")


def _deepspeed_parser_problems(config: dict[str, Any], world_size: int) -> list[str]:
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeed's parser takes the world size from deepspeed.comm (1 before it is initialised),
    # whatever torch.distributed says; state the batch as it will count it.
    try:
        from deepspeed import comm

        parser_world = comm.get_world_size() if comm.is_initialized() else 1
    except Exception:
        parser_world = 1
    as_parsed = dict(config)
    if isinstance(config.get("train_batch_size"), int) and parser_world != world_size:
        as_parsed["train_batch_size"] = config["train_batch_size"] // max(world_size, 1) * parser_world
    try:
        with _quiet_deepspeed():
            DeepSpeedConfig(as_parsed)
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        message = " ".join(str(exc).split()) or exc.__class__.__name__
        return [f"deepspeed: DeepSpeed rejects the config: {message}"]
    except Exception as exc:  # pydantic ValidationError from DeepSpeed's sub-configs
        message = " ".join(str(exc).split()) or exc.__class__.__name__
        return [f"deepspeed: DeepSpeed rejects the config: {message[:400]}"]
    return []
