"""Checkpoints that survive a lost pod: every complete checkpoint mirrored to S3, and a fresh
working directory resumed from the newest complete one there.

Layout under the run's mirror URI (one per run identity, e.g. ``s3://bucket/runs/<run id>/checkpoints``)::

    iter-000002/   a published artifact (g2rpo.artifacts.manifest): the checkpoint's files, manifest last
    iter-000004/

:class:`CheckpointMirror` is a :class:`~g2rpo.training.callbacks.TrainerCallback`: after each local
checkpoint is complete, rank 0 publishes it (:func:`~g2rpo.artifacts.publish.publish_dir`, so the
prefix counts only once its manifest is written) and only then removes the mirrored checkpoints that
retention (``train.keep_last``, ``train.keep_iterations``, and the best validated checkpoint so far,
which the trainer protects: :mod:`g2rpo.training.validation`) no longer keeps, each manifest first.
The previous checkpoint therefore stays in S3 until the new one is complete. A prefix left without
a manifest by a pod killed mid-upload is this run's own leftover (one writer per run identity): the
next publish of that iteration clears it first.

:meth:`CheckpointMirror.restore` (in the trainer's setup, before it resumes: :meth:`CheckpointMirror.before_resume`) downloads the newest complete mirrored
checkpoint into ``output.dir/checkpoints/`` when the local directory has nothing as new, and
publishes a newer local one the mirror lacks; with validation on, the best validated checkpoint that
newest one names (its ``validation.json``) is downloaded too, so the export can take it; the trainer's ``train.resume=auto`` then resumes from
it as from any local checkpoint (the config-hash check included). Multi-node runs need
``output.dir`` on a volume every node shares, as local checkpoints already do (ZeRO shards of every
rank sit in one checkpoint directory).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from g2rpo.artifacts.cache import download_dir
from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME, has_manifest, read_manifest, verify
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.storage import S3Settings, open_store
from g2rpo.errors import G2RPOError
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.checkpoint import CheckpointManager, is_complete, manifest_metadata
from g2rpo.training.trainer import Trainer
from g2rpo.training.validation import VALIDATION_FILE, read_validation_file, select_best

__all__ = ["CheckpointMirror"]

_NAME = re.compile(r"^iter-(\d{6,})$")


class CheckpointMirror(TrainerCallback):
    """Mirror a run's complete checkpoints to ``uri`` and restore the newest one from it."""

    def __init__(
        self,
        uri: str,
        *,
        keep_last: int,
        keep_iterations: tuple[int, ...] | list[int] = (),
        settings: S3Settings | None = None,
    ) -> None:
        self.uri = uri.rstrip("/")
        self.keep_last = keep_last
        self.keep_iterations = set(keep_iterations)
        self.settings = settings
        self.store = open_store(self.uri, settings)
        # The best validated checkpoint (kept like keep_iterations), as named by the validation history of
        # the checkpoint published last: the trainer's own choice at that point, also after a restart.
        self.protected: set[int] = set()

    # ------------------------------------------------------------------ what the mirror holds

    def complete(self) -> list[int]:
        """Iterations whose mirrored checkpoint is complete (manifest there, every file with its size), oldest first."""
        found = set()
        for info in self.store.list():
            head, _, rest = info.key.partition("/")
            if rest == MANIFEST_NAME and (match := _NAME.match(head)):
                found.add(int(match.group(1)))
        done = []
        for iteration in sorted(found):
            try:
                verify(self.store, CheckpointManager.name(iteration))
            except G2RPOError:
                continue  # listed but a file is missing or short: never resumed from
            done.append(iteration)
        return done

    def newest(self) -> int | None:
        done = self.complete()
        return done[-1] if done else None

    def uri_of(self, iteration: int) -> str:
        return f"{self.uri}/{CheckpointManager.name(iteration)}"

    # ------------------------------------------------------------------ the callback

    def before_resume(self, trainer: Trainer) -> None:
        """Rank 0 restores the newest mirrored checkpoint (:meth:`restore`) into the run's ``checkpoints/``,
        claiming ``output.dir`` first (one folder for all ranks, shared when there are several nodes)."""
        if trainer.ctx.is_main:
            trainer.claim_output_dir()
            self.restore(trainer.checkpoints.root, trainer.hash)

    # ------------------------------------------------------------------ mirroring

    def on_checkpoint(self, trainer: Trainer, path: Path, iteration: int) -> None:
        if trainer.ctx.is_main:
            self.publish(path, iteration)

    def publish(self, path: Path, iteration: int) -> None:
        """Publish the complete local checkpoint ``path`` as ``iter-N``, then prune the mirror."""
        prefix = CheckpointManager.name(iteration)
        best = _best_validated(
            path, f"delete {path} to resume from the checkpoint before it, or restore it from a copy"
        )
        if best is not None:
            self.protected = {best}
        if not has_manifest(self.store, prefix):
            self._clear_leftovers(prefix)
            # Hard links (a copy across file systems): the upload must leave the local manifest out,
            # publish_dir writes the artifact's own, last, with the same content.
            staging = path.parent.parent / ".mirror-staging" / prefix
            shutil.rmtree(staging, ignore_errors=True)
            _link_tree(path, staging)
            try:
                local = read_manifest(open_store(str(path)))
                publish_dir(
                    staging,
                    self.uri_of(iteration),
                    producer=local.producer,
                    config_hash=local.config_hash,
                    metadata=manifest_metadata(path),
                    settings=self.settings,
                )
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        self.prune()

    def prune(self) -> list[int]:
        """Remove mirrored checkpoints beyond the last ``keep_last`` complete ones (named and protected ones stay)."""
        done = self.complete()
        kept = self.keep_iterations | self.protected
        removable = [i for i in done[: max(len(done) - self.keep_last, 0)] if i not in kept]
        for iteration in removable:
            prefix = CheckpointManager.name(iteration)
            self.store.delete(f"{prefix}/{MANIFEST_NAME}")  # first: never a "complete" prefix with files missing
            self.store.delete_many([info.key for info in self.store.list(prefix)])
        return removable

    def _clear_leftovers(self, prefix: str) -> None:
        """Objects under ``prefix`` without a manifest: a publish of this run killed mid-upload."""
        keys = [info.key for info in self.store.list(prefix)]
        if keys or self.store.exists(f"{prefix}/{MARKER_NAME}"):
            self.store.delete_many([*keys, f"{prefix}/{MARKER_NAME}"])

    # ------------------------------------------------------------------ restoring

    def restore(self, checkpoints: Path, config_hash: str) -> int | None:
        """Make ``checkpoints`` (a run's local ``checkpoints/`` folder) hold the newest complete
        checkpoint of the run, local or mirrored; returns the iteration downloaded, or None.

        A local checkpoint newer than the mirror's newest is published (its pod died before the
        mirror finished). Call on one process per shared ``output.dir``, before the trainer resumes
        (:meth:`before_resume` does, during the trainer's setup).
        """
        local = _local_complete(checkpoints)
        remote = self.newest()
        if local and (remote is None or local[-1] > remote):
            self.publish(checkpoints / CheckpointManager.name(local[-1]), local[-1])
            return None
        if remote is None or (local and local[-1] >= remote):
            return None
        theirs = read_manifest(self.store, CheckpointManager.name(remote)).config_hash
        if theirs != config_hash:
            raise G2RPOError(
                f"{self.uri_of(remote)} was made with config hash {theirs}, this run's config hash is {config_hash} "
                "(model, algorithm and data sections): resume with the config it was made with, or give this run "
                "a fresh checkpoint URI"
            )
        self._download(checkpoints, remote)
        fix = (
            f"it was mirrored so (its manifest pins these bytes): delete {self.uri_of(remote)} from the mirror to "
            "resume from the checkpoint before it, or give this run a fresh checkpoint URI"
        )
        best = _best_validated(checkpoints / CheckpointManager.name(remote), fix)
        if best is not None and best != remote and best not in _local_complete(checkpoints):
            self._download(checkpoints, best)
        return remote

    def _download(self, checkpoints: Path, iteration: int) -> None:
        target = checkpoints / CheckpointManager.name(iteration)
        if target.exists():  # a save killed before its manifest: it held nothing complete
            shutil.rmtree(target)
        download_dir(self.uri_of(iteration), target, self.settings)


def _best_validated(checkpoint: Path, fix: str) -> int | None:
    """The best validated iteration a checkpoint's validation history names (None without validation);
    ``fix`` is what to do about a damaged one."""
    path = checkpoint / VALIDATION_FILE
    if not path.exists():
        return None
    _, history = read_validation_file(path, fix)
    selection = select_best(history)
    return None if selection is None else selection.iteration


def _local_complete(checkpoints: Path) -> list[int]:
    if not checkpoints.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for child in checkpoints.iterdir()
        if (m := _NAME.match(child.name)) and child.is_dir() and is_complete(child)
    )


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_dir() or path.relative_to(source).as_posix() == MANIFEST_NAME:
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
