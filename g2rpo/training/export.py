"""The end of a run: which weights are exported, and where.

:func:`export_run` writes ``output.dir/export`` (rank 0; collective under ZeRO-3): the last iteration's
weights, or with a validation ``selection`` (``train.validation.select_best``) the best validated
checkpoint's, loaded first; with ``output.export_ema`` the EMA weights. A run resumed and trained
longer after an earlier export writes ``export-iter-NNNNNN`` beside it; a complete export of this
iteration (a re-run of a finished job) is kept as it is. The files are
:func:`g2rpo.training.checkpoint.export_model`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from g2rpo.models.loading import base_model_record
from g2rpo.training.checkpoint import FLUX_DEV_LICENSE, CheckpointManager, export_model, is_complete, manifest_metadata
from g2rpo.training.distributed import DistContext
from g2rpo.training.drivers import EMA, DeepSpeedDriver, TorchDriver
from g2rpo.training.run_config import RunConfig
from g2rpo.training.run_dir import RunDir
from g2rpo.training.validation import Selection

__all__ = ["export_run"]


def export_run(
    cfg: RunConfig,
    run_dir: RunDir,
    *,
    iteration: int,
    selection: Selection | None,
    checkpoints: CheckpointManager,
    driver: TorchDriver | DeepSpeedDriver,
    ema: EMA | None,
    transformer: torch.nn.Module,
    trainable: Callable[[], dict[str, torch.Tensor]],  # the trainable parameters by name, looked up when needed
    ctx: DistContext,
    config_hash: str,
) -> Path:
    """Export the trained transformer (or LoRA adapters) of a run at ``iteration``; returns the folder.

    Every rank calls it: the ranks decide on the same state of the disk, load a selected checkpoint
    and gather ZeRO-3 weights together; rank 0 writes.
    """
    if selection is not None and not cfg.train.validation.select_best:
        selection = None
    chosen = iteration if selection is None else selection.iteration
    directory = run_dir.export
    if is_complete(directory) and (manifest_metadata(directory) or {}).get("iterations") != iteration:
        # A longer run resumed after an earlier export: keep that one, write beside it.
        directory = run_dir.export_beside(iteration)
    already = is_complete(directory)  # e.g. a re-run of a finished job
    # Every rank decides on the same state of the disk, before rank 0 writes anything.
    ctx.barrier()
    if already:
        return directory
    if chosen != iteration:
        checkpoints.load(checkpoints.path(chosen), driver, ema)
    gathered = driver.full_state_dict()  # collective under ZeRO-3
    if ctx.is_main:
        state_dict = None
        if gathered is not None:
            prefix = "transformer."
            state_dict = {k[len(prefix) :]: v for k, v in gathered.items() if k.startswith(prefix)}
        if cfg.output.export_ema and ema is not None:
            # Training is over: the module's weights may take the EMA values for the export.
            with torch.no_grad():
                for name, tensor in trainable().items():
                    tensor.copy_(ema.shadow[name].to(tensor.dtype))
        record = base_model_record(cfg.model.path)
        export_model(
            transformer,
            directory,
            base_model=cfg.model.base_model_name,
            config_hash=config_hash,
            lora=cfg.train.lora.enabled,
            state_dict=state_dict,
            license_info=_license_of(record),
            extra={
                "base_model_record": record,
                "iterations": iteration,
                "ema": cfg.output.export_ema,
                "selected_iteration": chosen,
                "selection_reason": "the last iteration" if selection is None else selection.reason,
            },
        )
    ctx.barrier()
    return directory


def _license_of(record: dict[str, Any]) -> dict[str, Any]:
    """The licence block of an export, from the models layer's record of the base model."""
    if record.get("kind") == "tiny":
        return {"name": record.get("licence"), "url": record.get("licence_url"), "note": record.get("note")}
    return FLUX_DEV_LICENSE
