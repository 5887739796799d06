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
it as from any local checkpoint (the config-hash check included). A multi-node run whose
``output.dir`` is on a volume every node shares mirrors as one process does (rank 0 sees every
rank's files there).

**Multi-node without a shared volume** (``output.node_local``): S3 is the only store every node
sees. Each node's ranks write their part of a checkpoint into the node's own ``output.dir``, and its
first rank seals that part (:mod:`g2rpo.training.checkpoint`). :meth:`CheckpointMirror.publish_parts`
(every rank calls it) then publishes the whole: rank 0 clears a leftover of the prefix and claims it
(:func:`~g2rpo.artifacts.publish.claim_prefix`); the first rank of each node uploads its node's files,
checked against the part's manifest first; the ranks gather every node's file list
(``all_gather_object``); rank 0 writes the manifest over all of them LAST
(:func:`~g2rpo.artifacts.publish.seal_uploaded`). A prefix therefore counts as complete only once
every node's part is there: a node that dies or fails before its upload leaves it without a
manifest — a leftover, cleared by the next publish of that iteration — and every rank stops with the
same error. On resume (:meth:`CheckpointMirror.before_resume`, every rank) the first rank of each
node drops its folder's parts (never resumable alone) and downloads the newest complete mirrored
checkpoint, whole: a resume at the same world size needs every rank's files on its node, one at
another world size the whole set (the DeepSpeed driver converts it to a universal checkpoint in each
node's folder). The ranks then check that every node holds the same newest checkpoint and resume
as from a local one. A node's part newer than the mirror's newest (its upload never finished) is
not published on restart, as a single pod's is: it is not a checkpoint without the other nodes'
parts, so the run resumes from the mirror's newest and loses at most one checkpoint interval.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from g2rpo.artifacts.cache import download_dir
from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME, FileEntry, has_manifest, read_manifest, verify
from g2rpo.artifacts.publish import PrefixClaim, claim_prefix, publish_dir, seal_uploaded
from g2rpo.artifacts.storage import FileStore, S3Settings, open_store
from g2rpo.errors import G2RPOError, problem
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.checkpoint import CheckpointManager, is_complete, is_part, manifest_metadata
from g2rpo.training.distributed import DistContext
from g2rpo.training.failpoints import fail_point
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
        claiming ``output.dir`` first (one folder for all ranks, shared when there are several nodes); with
        node-local folders every node does, into its own (:meth:`restore_every_node`)."""
        if trainer.ctx.node_local:
            self.restore_every_node(trainer)
        elif trainer.ctx.is_main:
            trainer.claim_output_dir()
            self.restore(trainer.checkpoints.root, trainer.hash)

    # ------------------------------------------------------------------ mirroring

    def on_checkpoint(self, trainer: Trainer, path: Path, iteration: int) -> None:
        if trainer.ctx.node_local:
            self.publish_parts(trainer.ctx, path, iteration)
        elif trainer.ctx.is_main:
            self.publish(path, iteration)

    def publish_parts(self, ctx: DistContext, path: Path, iteration: int) -> None:
        """Publish the checkpoint of ``iteration`` whose parts lie in ``path`` on every node (collective:
        every rank calls it; output.node_local). The manifest over every node's files is written last, by
        rank 0, once all nodes have uploaded; any node's failure leaves the prefix without one and is
        raised on every rank."""
        prefix = CheckpointManager.name(iteration)
        claim = None
        # Rank 0's word: "upload" (the prefix is claimed), "published" (nothing to do), or why not.
        word = "upload"
        if ctx.is_main:
            try:
                if has_manifest(self.store, prefix):
                    word = "published"
                else:
                    self._clear_leftovers(prefix)  # a publish of this run cut short: never complete
                    producer = read_manifest(FileStore(path)).producer
                    claim = claim_prefix(self.uri_of(iteration), producer=producer, settings=self.settings)
            except G2RPOError as exc:
                word = str(exc)
        word = ctx.from_main(word)
        if word not in ("upload", "published"):
            raise G2RPOError(f"mirroring checkpoint {prefix} to {self.uri}: {word}")
        if word == "upload":
            part = self._upload_part(ctx, path, iteration) if ctx.local_rank == 0 else None
            parts = [p for p in ctx.gather(part) if p is not None]  # one per node
            outcome = self._seal_parts(claim, parts, path, iteration) if ctx.is_main else None
            outcome = ctx.from_main(outcome)
            if outcome is not None:
                raise G2RPOError(outcome)
        if ctx.is_main:
            best = _best_validated(
                path, f"delete {path} to resume from the checkpoint before it, or restore it from a copy"
            )
            if best is not None:
                self.protected = {best}
            self.prune()

    def _upload_part(self, ctx: DistContext, path: Path, iteration: int) -> _Part:
        """Upload this node's part of the checkpoint (its first rank): every file its manifest lists, after
        checking each one's sha256 (a file damaged on disk is never published)."""
        try:
            fail_point("mirror_part", iteration)
            part = verify(FileStore(path), deep=True)
            store = open_store(self.uri_of(iteration), self.settings)
            for entry in part.files:
                store.put_file(entry.path, path / entry.path)
        except (G2RPOError, OSError) as exc:
            return _Part(ctx.node_rank, [], " ".join(str(exc).split()))
        return _Part(ctx.node_rank, [entry.model_dump() for entry in part.files], None)

    def _seal_parts(self, claim: PrefixClaim, parts: list[_Part], path: Path, iteration: int) -> str | None:
        """Rank 0: write the manifest over every node's part (None), or say why not (the claim released)."""
        prefix = CheckpointManager.name(iteration)
        failed = [f"node {p.node}: {p.error}" for p in parts if p.error is not None]
        owner: dict[str, int] = {}
        shared = []
        for p in parts:
            for entry in p.files:
                if entry["path"] in owner:
                    shared.append((entry["path"], owner[entry["path"]], p.node))
                owner[entry["path"]] = p.node
        if shared:
            name, first, second = shared[0]
            failed.append(
                problem(
                    "output.node_local",
                    True,
                    f"nodes {first} and {second} both hold {name} of {prefix}, so their output.dir is one folder: "
                    "set output.node_local=false for a folder every node shares, or give each node its own",
                )
            )
        if failed:
            claim.end(release=True)
            return (
                f"checkpoint {prefix} was not mirrored to {self.uri} (the prefix has no manifest, so it is never "
                f"resumed from; the next publish clears it): " + "; ".join(failed)
            )
        local = read_manifest(FileStore(path))
        metadata = {k: v for k, v in local.metadata.items() if k != "node"}
        metadata.update(kind="resumable-checkpoint", nodes=len(parts))
        files = sorted((FileEntry(**entry) for p in parts for entry in p.files), key=lambda e: e.path)
        try:
            seal_uploaded(claim, files, producer=local.producer, config_hash=local.config_hash, metadata=metadata)
        except G2RPOError as exc:  # the claim is released
            return f"checkpoint {prefix} was not mirrored to {self.uri}: {exc}"
        return None

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

    def restore_every_node(self, trainer: Trainer) -> None:
        """With node-local folders (collective): the first rank of each node claims its ``output.dir``,
        drops the checkpoint parts there and restores the newest mirrored checkpoint whole (:meth:`restore`);
        every rank then raises the same error when a node failed, or when the nodes' folders do not hold
        the same newest complete checkpoint (they would resume from different iterations)."""
        ctx = trainer.ctx
        report: tuple[int, int | None, str | None] | None = None  # (node, newest complete, error)
        if ctx.local_rank == 0:
            try:
                trainer.claim_output_dir()
                _drop_parts(trainer.checkpoints.root)
                self.restore(trainer.checkpoints.root, trainer.hash, publish_newer=False)
                local = _local_complete(trainer.checkpoints.root)
                report = (ctx.node_rank, local[-1] if local else None, None)
            except (G2RPOError, OSError) as exc:
                report = (ctx.node_rank, None, " ".join(str(exc).split()))
        reports = sorted(r for r in ctx.gather(report) if r is not None)
        failed = [f"node {node}: {error}" for node, _, error in reports if error is not None]
        if failed:
            raise G2RPOError(f"restoring the newest checkpoint of {self.uri} failed on " + "; ".join(failed))
        if len({newest for _, newest, _ in reports}) > 1:
            held = ", ".join(
                f"node {node}: {'none' if newest is None else CheckpointManager.name(newest)}"
                for node, newest, _ in reports
            )
            raise G2RPOError(
                problem(
                    "output.node_local",
                    True,
                    f"after restoring from {self.uri} the nodes' folders hold different newest checkpoints ({held}): "
                    "a folder holds a checkpoint the mirror does not; the nodes resume from the mirror, so move "
                    "that checkpoint out of its output.dir or give each node a fresh output.dir",
                )
            )

    def restore(self, checkpoints: Path, config_hash: str, *, publish_newer: bool = True) -> int | None:
        """Make ``checkpoints`` (a run's local ``checkpoints/`` folder) hold the newest complete
        checkpoint of the run, local or mirrored; returns the iteration downloaded, or None.

        A local checkpoint newer than the mirror's newest is published (its pod died before the
        mirror finished) unless ``publish_newer`` is false (node-local folders: each node restores
        its own, and one node's publish would race the others'). Call on one process per
        ``output.dir``, before the trainer resumes (:meth:`before_resume` does, during the trainer's setup).
        """
        local = _local_complete(checkpoints)
        remote = self.newest()
        if local and (remote is None or local[-1] > remote):
            if publish_newer:
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


@dataclass(frozen=True)
class _Part:
    """What a node's first rank reports after uploading its part: its node index, the files it uploaded
    (each a manifest entry as a dict: path, size, sha256), or why it could not."""

    node: int
    files: list[dict]
    error: str | None


def _drop_parts(checkpoints: Path) -> None:
    """Remove the checkpoint parts of this node's folder (output.node_local): never resumable on their own —
    the whole is in the mirror, or was never complete anywhere — and in the way of a download. Each
    manifest goes first, as in a prune."""
    if not checkpoints.is_dir():
        return
    for child in sorted(checkpoints.iterdir()):
        if _NAME.match(child.name) and child.is_dir() and is_complete(child) and is_part(child):
            (child / MANIFEST_NAME).unlink()
            shutil.rmtree(child)


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
