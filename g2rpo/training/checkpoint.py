"""Resumable checkpoints, and the exported model.

A **resumable checkpoint** ``<output.dir>/checkpoints/iter-000040/`` holds::

    deepspeed/            engine.save_checkpoint(...): per-rank ZeRO shards + optimiser state
      (or torch/        model.pt + optimizer.pt in plain single-process mode)
    ranks/rank-00000.pt   every rank's RNG states (torch CPU, CUDA, python, numpy)
    ema.pt                the EMA weights, when EMA is on
    strategy.pt           the strategy's state across iterations, when it has one (DiffusionNFT's old policy)
    trainer_state.json    iteration done, data cursor, config hash, world size, backend
    manifest.json         written LAST, by rank 0, after every rank has finished writing
                          (node-local folders: by each node's first rank, over its node's part)

A checkpoint counts as complete only when its manifest exists and every file it lists is there
with the listed size. A directory without a manifest — a run killed while writing — is never
resumed from; the next save of that iteration replaces it (it holds nothing that was ever
complete), and nothing complete is ever overwritten.

Resume also checks every file's sha256 against the manifest (reading every byte, on every rank)
before it trusts a checkpoint: ``train.resume=auto`` takes the newest complete checkpoint that
matches (:meth:`CheckpointManager.latest_verified`); a newer one that does not is reported and
moved aside to ``iter-NNNNNN.damaged`` (the only case where a complete checkpoint leaves the
list), and when none matches resume stops with the list of mismatches. A checkpoint named in
``train.resume`` that does not match is refused. Where a run resumes from, or whether its folder
lets it start afresh, is :meth:`CheckpointManager.resume_point`.

**Node-local folders** (``output.node_local``: a multi-node run whose nodes share no volume). Each
node's ranks write their files of a checkpoint into that node's own ``output.dir``, and the first
rank of each node seals the node's **part** with a manifest of its files (metadata ``kind:
resumable-checkpoint-part`` and the node's index): global rank 0's part holds the project's files
(``trainer_state.json``, EMA, strategy, validation) and DeepSpeed's model states, every node's part
its ranks' ZeRO shards and RNG files. A part is never resumed from (:meth:`CheckpointManager.complete`
lists whole checkpoints only); the whole exists only in the S3 mirror, which publishes every node's
part under one manifest, last (:mod:`g2rpo.training.mirror`), and restores the whole into each
node's folder before a resume. Retention, the overwrite guard and "already saved" treat a sealed
part like a whole checkpoint, each node in its own folder.

Retention: the last ``keep_last`` complete checkpoints, plus every iteration listed in
``keep_iterations`` (explicitly named ones) and the best validated one so far
(:attr:`CheckpointManager.protected`, :mod:`g2rpo.training.validation`), are kept; older ones are
removed after a newer one is complete. A run with validation also stores its validation history in
each checkpoint (``validation.json``), so a resume continues it.

Resume refuses a checkpoint made under another config hash (model + algorithm + data sections;
run length and output paths may change) with an error naming both hashes and the fix.

Resume at **another world size** (a 16-rank run preempted and restarted on 8) continues the run:
the DeepSpeed driver converts the ZeRO shards to DeepSpeed's universal checkpoint (per parameter:
fp32 master weights, Adam moments, step) and each rank loads its new partition from it; the
iteration and data cursor are global, so the prompt stream continues where it stopped. The
per-rank RNG files are used only at the world size that wrote them (see :meth:`CheckpointManager.load`).

The **exported model** (``<output.dir>/export/``) is what evaluation and the registry use: the
consolidated transformer in diffusers layout (``save_pretrained`` → safetensors; ZeRO-3 gathers the
16-bit weights first), or with LoRA the adapters alone (peft format), plus ``base_model.json``
naming the base model and its licence — FLUX.1-dev weights are under the FLUX.1 [dev]
Non-Commercial License, and a fine-tune is a derivative under the same terms.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from g2rpo import __version__
from g2rpo.artifacts.manifest import read_manifest, write_dir_manifest
from g2rpo.artifacts.manifest import verify as verify_manifest
from g2rpo.artifacts.ownership import check_replaceable
from g2rpo.artifacts.storage import FileStore
from g2rpo.config import CONFIG_MAX_BYTES
from g2rpo.errors import G2RPOError, problem, write_failure
from g2rpo.seeding import derive_seed
from g2rpo.textfile import RECORD_MAX_BYTES, read_json_file, read_text_file

if TYPE_CHECKING:  # run_dir imports this module (is_complete): the annotation only
    from g2rpo.training.run_dir import RunDir

__all__ = [
    "TrainerState",
    "CheckpointManager",
    "MANIFEST",
    "is_complete",
    "is_part",
    "PART_KIND",
    "verify",
    "manifest_metadata",
    "capture_rng",
    "restore_rng",
    "seed_rng",
    "export_model",
    "FLUX_DEV_LICENSE",
]

MANIFEST = "manifest.json"
PART_KIND = "resumable-checkpoint-part"  # the manifest metadata kind of one node's part (output.node_local)
_NAME = re.compile(r"^iter-(\d{6,})$")
FLUX_DEV_LICENSE = {
    "name": "FLUX.1 [dev] Non-Commercial License",
    "url": "https://huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/LICENSE.md",
    "note": "FLUX.1-dev weights are licensed for non-commercial use; a fine-tune (full or LoRA) is a derivative "
    "of them and carries the same terms.",
}


@dataclass
class TrainerState:
    """The project's part of a checkpoint (DeepSpeed's own files hold weights and optimiser)."""

    iteration: int  # iterations completed; a resume continues with this index
    data_cursor: int  # prompts consumed from the global stream = iteration × prompts_per_iteration
    config_hash: str
    world_size: int
    backend: str  # "deepspeed" or "torch"
    zero_stage: int | None = None


# --------------------------------------------------------------------------- RNG


def capture_rng() -> dict[str, Any]:
    """Every RNG state of this process (the draws themselves are keyed, see g2rpo.seeding; this
    covers anything else, e.g. dropout)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_rng(seed: int) -> None:
    """Seed every RNG :func:`capture_rng` covers from one number."""
    torch.manual_seed(seed)  # also every CUDA device
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass


# --------------------------------------------------------------------------- manifests
# The manifest format and its checks are the storage layer's (g2rpo.artifacts.manifest); a local directory
# is a FileStore.


def manifest_metadata(directory: str | Path) -> dict[str, Any] | None:
    """The manifest's metadata, or None when there is no readable manifest."""
    try:
        return dict(read_manifest(FileStore(directory), "").metadata)
    except G2RPOError:
        return None


def is_complete(directory: str | Path) -> bool:
    """True when ``directory`` has a valid manifest and every listed file is there with its size."""
    directory = Path(directory)
    return (directory / MANIFEST).is_file() and incomplete_reason(directory) is None


def is_part(directory: str | Path) -> bool:
    """True when ``directory``'s manifest seals one node's part of a checkpoint, not the whole (output.node_local)."""
    return (manifest_metadata(directory) or {}).get("kind") == PART_KIND


def incomplete_reason(directory: str | Path) -> str | None:
    """Why ``directory``'s manifest is unreadable or does not match its files' sizes, or None when it
    does (a directory without a manifest gives the missing manifest as its reason)."""
    try:
        verify_manifest(FileStore(directory), "", deep=False)
    except G2RPOError as exc:
        return " ".join(str(exc).split())
    return None


def verify(directory: str | Path) -> None:
    """Check every file's sha256 against the manifest (reads every byte); raises listing mismatches."""
    verify_manifest(FileStore(directory), "", deep=True)


def _digest_refusal(directory: Path, damage: str) -> str:
    return (
        f"checkpoint {directory} does not match its manifest's sha256 (its files changed after they were "
        f"written): {damage}; resume from another checkpoint (train.resume=auto picks the newest that "
        "matches) or restore this one from a copy"
    )


def _read_trainer_state(directory: Path) -> TrainerState:
    """``trainer_state.json`` of a checkpoint, refused naming the file and what is wrong when damaged."""
    path = directory / "trainer_state.json"
    fix = "resume from another checkpoint (train.resume=auto picks the newest intact one) or restore it from a copy"
    value = read_json_file(path, what="checkpoint state", fix=fix, max_bytes=RECORD_MAX_BYTES)
    names = {f.name for f in fields(TrainerState)}
    required = {f.name for f in fields(TrainerState) if f.default is MISSING}
    unknown, missing = sorted(set(value) - names), sorted(required - set(value))
    if unknown or missing:
        raise G2RPOError(
            f"checkpoint state {str(path)!r} "
            + "; ".join(
                ([f"lacks {', '.join(missing)}"] if missing else [])
                + ([f"has unknown field(s) {', '.join(unknown)}"] if unknown else [])
            )
            + f" (a TrainerState has {', '.join(sorted(names))}): {fix}"
        )
    return TrainerState(**value)


# --------------------------------------------------------------------------- manager


class CheckpointManager:
    """Save, find, load and prune the resumable checkpoints of one run (all ranks call save/load)."""

    def __init__(
        self,
        root: str | Path,
        *,
        config_hash: str,
        keep_last: int,
        keep_iterations: Iterable[int] = (),
        rank: int = 0,
        world_size: int = 1,
        barrier: Any = None,
        node_local: bool = False,
        leader: bool | None = None,
        node_rank: int = 0,
    ) -> None:
        self.root = Path(root)
        # With node-local folders (output.node_local) each node's first rank makes, seals and prunes its
        # node's part in its own folder (``leader``, ``node_rank``); otherwise rank 0 does, for all.
        self.node_local = node_local
        self.leader = rank == 0 if leader is None else leader
        self.node_rank = node_rank
        self.config_hash = config_hash
        self.keep_last = keep_last
        self.keep_iterations = set(keep_iterations)
        self.rank = rank
        self.world_size = world_size
        self._barrier = barrier or (lambda: None)
        self._verified: set[Path] = set()  # checkpoints whose digests matched in this process
        # Kept by prune like keep_iterations, but set by the trainer as the run goes: the best
        # validated checkpoint so far (g2rpo.training.validation), which the export may need.
        self.protected: set[int] = set()

    @staticmethod
    def name(iteration: int) -> str:
        return f"iter-{iteration:06d}"

    def path(self, iteration: int) -> Path:
        return self.root / self.name(iteration)

    def has_complete(self, iteration: int) -> bool:
        """Whether the checkpoint of ``iteration`` is saved here: complete (:func:`is_complete`), or with
        node-local folders this node's sealed part of it."""
        return is_complete(self.path(iteration))

    def sealed(self) -> list[tuple[int, Path]]:
        """Checkpoints whose manifest matches their files, oldest first: whole ones and (node-local
        folders) this node's parts."""
        found = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                match = _NAME.match(child.name)
                if match and child.is_dir() and is_complete(child):
                    found.append((int(match.group(1)), child))
        return sorted(found)

    def complete(self) -> list[tuple[int, Path]]:
        """Complete, whole checkpoints — the ones a run resumes from —, oldest first (a node's part is not one)."""
        return [(i, p) for i, p in self.sealed() if not is_part(p)]

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1][1] if done else None

    def broken(self) -> list[tuple[int, Path, str]]:
        """Checkpoints whose manifest is there but that are not complete, oldest first, with why. The
        manifest is written last (and removed first by :meth:`prune`), so no kill leaves one: its
        manifest is unreadable or a listed file went missing or shrank since — damage, not a save cut
        short, and never to be removed as one."""
        found = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                match = _NAME.match(child.name)
                if match and child.is_dir() and os.path.lexists(child / MANIFEST):
                    reason = incomplete_reason(child)
                    if reason is not None:
                        found.append((int(match.group(1)), child, reason))
        return sorted(found)

    def latest_verified(self, on_skip: Callable[[dict[str, Any]], None] | None = None) -> Path | None:
        """The newest complete checkpoint whose every file matches its manifest's sha256, or None
        when there is no complete checkpoint at all.

        A newer checkpoint that fails the check, or whose manifest is there but unreadable or names a
        file now missing or cut (:meth:`broken`), is skipped: rank 0 says so on stderr, hands
        ``on_skip`` a ``{"event": "checkpoint_skipped", ...}`` record, and moves it aside to
        ``iter-NNNNNN.damaged`` (kept for inspection, never listed again) so the resumed run can
        write that iteration afresh. When no checkpoint verifies, nothing is moved and the error
        lists each one with its mismatch.
        """
        done: list[tuple[int, Path, str | None]] = [(i, p, None) for i, p in self.complete()]
        candidates = sorted(done + self.broken(), key=lambda entry: entry[0])
        damaged: list[tuple[Path, str]] = []
        for _, path, broken in reversed(candidates):
            problem_text = broken if broken is not None else self._digest_problem(path)
            if problem_text is None:
                for bad, reason in damaged:
                    self._set_aside(bad, reason, path, on_skip)
                return path
            damaged.append((path, problem_text))
        if damaged:
            listed = "\n".join(f"  {path}: {reason}" for path, reason in damaged)
            raise G2RPOError(
                f"no checkpoint in {self.root} matches its manifest's sha256 (the files changed after they were "
                f"written):\n{listed}\nrestore them from a copy, or start over: move them out of {self.root} "
                "(train.resume=auto then starts from iteration 0) or choose a new output.dir"
            )
        return None

    def _digest_problem(self, directory: Path) -> str | None:
        """Why ``directory`` fails its digest check, or None when every file matches (cached per run)."""
        if directory not in self._verified:
            try:
                verify(directory)
            except G2RPOError as exc:
                return " ".join(str(exc).split())
            self._verified.add(directory)
        return None

    def _set_aside(
        self, directory: Path, reason: str, fallback: Path, on_skip: Callable[[dict[str, Any]], None] | None
    ) -> None:
        """Report a damaged checkpoint and move it out of the list (the folder's leader only: rank 0, or each
        node's first rank with node-local folders; the others only skip it)."""
        aside = directory.with_name(f"{directory.name}.damaged")
        n = 1
        while aside.exists():
            n += 1
            aside = directory.with_name(f"{directory.name}.damaged-{n}")
        if self.leader:
            print(
                f"g2rpo: skipping checkpoint {directory}: {reason}; moved aside to {aside.name}, "
                f"resuming from {fallback.name}",
                file=sys.stderr,
                flush=True,
            )
            # Every other rank has already passed over it (it failed their check too) or will no longer list it.
            directory.rename(aside)
            if on_skip is not None:
                on_skip(
                    {
                        "event": "checkpoint_skipped",
                        "path": str(directory),
                        "moved_to": str(aside),
                        "reason": reason,
                        "resuming_from": str(fallback),
                    }
                )

    # ------------------------------------------------------------------ save

    def save(
        self,
        state: TrainerState,
        driver: Any,
        ema: Any = None,
        json_files: dict[str, Any] | None = None,
        strategy_state: dict[str, Any] | None = None,
    ) -> Path:
        """Write one checkpoint (collective: every rank calls it). Returns its directory.

        ``json_files`` (rank 0's): more of the trainer's state, each written as ``name`` (JSON) and
        listed in the manifest like every other file. ``strategy_state``: a stateful strategy's
        ``state_dict()`` (the same on every rank), written by rank 0 as ``strategy.pt``.
        """
        target = self.path(state.iteration)
        # Every rank checks (no rank writes a manifest before two barriers below), so all raise together.
        if is_complete(target):
            raise G2RPOError(
                f"checkpoint {target} already exists and is complete: refusing to overwrite it; "
                "resume from it (train.resume=auto) or write to a new output.dir"
            )
        try:
            self._write(target, state, driver, ema, json_files, strategy_state)
        except (OSError, RuntimeError) as exc:  # full disk, permissions, read-only: name the path and why
            raise write_failure(f"checkpoint of iteration {state.iteration}", target, exc) from exc
        if self.leader:
            self.prune()
        self._barrier()
        return target

    def _write(
        self,
        target: Path,
        state: TrainerState,
        driver: Any,
        ema: Any,
        json_files: dict[str, Any] | None,
        strategy_state: dict[str, Any] | None = None,
    ) -> None:
        """Every file of one checkpoint, the manifest last (by rank 0, after every rank's files; with
        node-local folders each node's first rank seals its node's part)."""
        if self.leader:
            if target.exists():  # left by a run killed mid-save: never complete, nothing to keep
                shutil.rmtree(target)
            (target / "ranks").mkdir(parents=True)
        self._barrier()
        driver.save(target)
        torch.save(capture_rng(), target / "ranks" / f"rank-{self.rank:05d}.pt")
        if self.rank == 0:
            if ema is not None:
                torch.save(ema.state_dict(), target / "ema.pt")
            if strategy_state is not None:
                torch.save(strategy_state, target / "strategy.pt")
            (target / "trainer_state.json").write_text(
                json.dumps(asdict(state), indent=1, sort_keys=True), encoding="utf-8"
            )
            for name, content in (json_files or {}).items():
                (target / name).write_text(json.dumps(content, indent=1, sort_keys=True), encoding="utf-8")
        self._barrier()  # every rank's files are on disk before the manifest says so
        metadata = {"kind": "resumable-checkpoint", "iteration": state.iteration, "world_size": self.world_size}
        if self.node_local:
            metadata = {**metadata, "kind": PART_KIND, "node": self.node_rank}
        if self.leader:
            write_dir_manifest(
                target,
                producer=f"g2rpo.training.trainer {__version__}",
                config_hash=self.config_hash,
                metadata=metadata,
            )

    def prune(self) -> list[Path]:
        """Remove complete checkpoints (and node-local parts) beyond the last ``keep_last`` (named and
        protected ones stay)."""
        done = self.sealed()
        kept = self.keep_iterations | self.protected
        removable = [(i, p) for i, p in done[: max(len(done) - self.keep_last, 0)] if i not in kept]
        for _, path in removable:
            # Drop the manifest first: a crash mid-removal leaves an incomplete dir, never a broken "complete" one.
            (path / MANIFEST).unlink(missing_ok=True)
            shutil.rmtree(path)
        return [p for _, p in removable]

    # ------------------------------------------------------------------ load

    def resume_point(
        self,
        resume: str,
        run_dir: RunDir,
        config_yaml: str,
        on_skip: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path | None:
        """The checkpoint a run resumes from, or None for a fresh run (which needs an unused ``run_dir``).

        ``resume`` is ``train.resume``: ``auto`` (the newest checkpoint that verifies,
        :meth:`latest_verified`), ``never``, or a checkpoint's path (checked by :meth:`read_state`).
        ``run_dir`` is the run's folder (this manager's root is its ``checkpoints/``) and
        ``config_yaml`` the run's config as ``config.yaml`` holds it. A fresh run is refused where
        the folder holds another run's files: with ``never``, a finished run's export, or metrics of a
        run with another config.
        """
        if resume not in ("auto", "never"):
            path = Path(resume)
            self.read_state(path)  # complete? same config hash? (raises otherwise)
            return path
        latest = self.latest_verified(on_skip) if resume == "auto" else self.latest()
        if resume == "auto" and latest is not None:
            self.read_state(latest)
            return latest
        out = run_dir.root
        used = [p.name for p in (run_dir.metrics, run_dir.export) if p.exists()]
        if latest is not None:
            used.append(f"checkpoints/{latest.name}")
        if used and resume == "never":
            raise G2RPOError(
                problem(
                    run_dir.field,
                    str(out),
                    f"already holds a run ({', '.join(used)}) and train.resume=never: choose a new output.dir, or "
                    "resume with train.resume=auto",
                )
            )
        if "export" in used:
            raise G2RPOError(
                problem(
                    run_dir.field,
                    str(out),
                    "holds a finished run's export/ and no checkpoint: choose a new output.dir",
                )
            )
        if run_dir.config_yaml.exists() and self.rank == 0:
            previous = read_text_file(run_dir.config_yaml, what="run config", max_bytes=CONFIG_MAX_BYTES)
            if previous != config_yaml and run_dir.metrics.exists():
                raise G2RPOError(
                    problem(
                        run_dir.field,
                        str(out),
                        "holds metrics of a run with another config and no checkpoint to resume: choose a new output.dir",
                    )
                )
        return None

    def read_state(self, directory: str | Path) -> TrainerState:
        """The checkpoint's project state, after checking it is complete, from this config, and that
        every file matches its manifest's sha256."""
        directory = Path(directory)
        if not is_complete(directory):
            raise G2RPOError(
                f"checkpoint {directory} is incomplete (no manifest, or a listed file is missing or truncated): "
                f"resume from a complete one (complete here: {[str(p) for _, p in self.complete()] or 'none'})"
            )
        try:
            state = _read_trainer_state(directory)
        except G2RPOError as exc:
            damage = self._digest_problem(directory)  # a file changed since the save is named as that
            raise G2RPOError(str(exc) if damage is None else _digest_refusal(directory, damage)) from None
        if state.config_hash != self.config_hash:
            raise G2RPOError(
                f"checkpoint {directory} was made with config hash {state.config_hash}, this run's config hash is "
                f"{self.config_hash} (the hash covers the model, algorithm and data sections): resume with the config "
                "the checkpoint was made with (its config.yaml sits in the run's output dir), or start a new run in "
                "a fresh output.dir"
            )
        damage = self._digest_problem(directory)
        if damage is not None:
            raise G2RPOError(_digest_refusal(directory, damage))
        return state

    def load(self, directory: str | Path, driver: Any, ema: Any = None, strategy: Any = None) -> TrainerState:
        """Restore weights, optimiser, EMA, a stateful strategy's state and this rank's RNG from ``directory``.

        A checkpoint saved at another world size loads too: the driver repartitions the optimiser
        state (``driver.load(directory, state)``), and the per-rank RNG files are not
        used — each rank seeds its streams from (config hash, iteration, rank) instead. The draws
        that matter (noise, branches, subsets) are keyed by global prompt index, not taken from
        these streams, so sampling does not depend on the world size (:mod:`g2rpo.seeding`).
        """
        directory = Path(directory)
        state = self.read_state(directory)
        resized = state.world_size != self.world_size
        if resized and self.rank == 0:
            print(
                f"g2rpo: resuming {directory.name}, saved by {state.world_size} rank(s), on {self.world_size}: "
                "the optimiser state is repartitioned through DeepSpeed's universal checkpoint",
                file=sys.stderr,
                flush=True,
            )
        driver.load(directory, state)
        if ema is not None:
            if not (directory / "ema.pt").is_file():
                raise G2RPOError(
                    f"checkpoint {directory} has no EMA weights but train.ema.enabled is true: resume with EMA off"
                )
            ema.load_state_dict(torch.load(directory / "ema.pt", weights_only=True))
        if strategy is not None:
            if not (directory / "strategy.pt").is_file():
                raise G2RPOError(
                    f"checkpoint {directory} has no strategy.pt, the state strategy {strategy.name} carries across "
                    "iterations: resume from a checkpoint this version wrote, or start a new run in a fresh output.dir"
                )
            strategy.load_state_dict(torch.load(directory / "strategy.pt", weights_only=True))
        if resized:
            # Rank r of the new layout holds other prompts than rank r did, so no saved stream is
            # its own: each rank starts a fresh stream named by the run, the iteration and its rank.
            seed_rng(derive_seed(0, "rng-after-world-size-change", self.config_hash, state.iteration, self.rank))
        else:
            rank_file = directory / "ranks" / f"rank-{self.rank:05d}.pt"
            if rank_file.is_file():
                restore_rng(torch.load(rank_file, weights_only=False))
        return state


# --------------------------------------------------------------------------- export


def export_model(
    transformer: torch.nn.Module,
    directory: str | Path,
    *,
    base_model: str,
    config_hash: str,
    lora: bool,
    state_dict: dict[str, torch.Tensor] | None = None,
    license_info: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the exported model to ``directory`` (must not hold a complete export already).

    Full fine-tune: ``transformer.save_pretrained`` (diffusers layout, safetensors), optionally from
    a gathered ``state_dict`` (ZeRO-3). LoRA: the adapters alone (``save_lora_adapter``, peft
    format). Both get ``base_model.json`` (base model pointer + licence) and a manifest, last.
    """
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        if is_complete(directory):
            raise G2RPOError(f"export directory {directory} already holds a complete export: refusing to overwrite it")
        # An export killed before its manifest is redone; a folder holding anything an export does not is refused.
        check_replaceable(
            directory, field="export directory", kind="model export", own=("transformer", "lora", "base_model.json")
        )
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if lora:
        transformer.save_lora_adapter(str(directory / "lora"), safe_serialization=True)
        for config in getattr(transformer, "peft_config", {}).values():
            config.save_pretrained(str(directory / "lora"))  # adapter_config.json: rank, alpha, targets
        kind = "lora-adapters"
    else:
        kwargs = {"state_dict": state_dict} if state_dict is not None else {}
        _save_pretrained(transformer, directory / "transformer", **kwargs)
        kind = "transformer"
    info = {
        "base_model": base_model,
        "contents": kind,
        "license": license_info or FLUX_DEV_LICENSE,
        "how_to_load": (
            "FluxPipeline.from_pretrained(base_model, transformer=FluxTransformer2DModel.from_pretrained(EXPORT/transformer))"
            if not lora
            else "pipe = FluxPipeline.from_pretrained(base_model); pipe.transformer.load_lora_adapter(EXPORT/lora)"
        ),
        **(extra or {}),
    }
    (directory / "base_model.json").write_text(json.dumps(info, indent=1, sort_keys=True), encoding="utf-8")
    metadata = {
        "kind": f"export-{kind}",
        **{k: v for k, v in (extra or {}).items() if k in ("iterations", "ema", "selected_iteration")},
    }
    write_dir_manifest(
        directory, producer=f"g2rpo.training.trainer.export {__version__}", config_hash=config_hash, metadata=metadata
    )
    return directory


def _save_pretrained(
    transformer: torch.nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """``save_pretrained`` in safetensors; with ``state_dict`` (gathered ZeRO-3 weights) those are
    loaded into a CPU copy built from the config first (diffusers saves the module's own tensors)."""
    if state_dict is None:
        transformer.save_pretrained(str(directory), safe_serialization=True)
        return
    clone = type(transformer).from_config(transformer.config)
    clone.load_state_dict({k: v.cpu() for k, v in state_dict.items()}, strict=True)
    clone.to(next(iter(state_dict.values())).dtype)
    clone.save_pretrained(str(directory), safe_serialization=True)
