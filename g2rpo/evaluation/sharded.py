"""Sampling an evaluation's chunks: resumable, and shared out among torchrun's ranks.

The (step count, prompt, seed) items are cut into fixed chunks (:func:`g2rpo.evaluation.resume.plan_chunks`).
:func:`sample_pending` starts or continues the partial state under the output (rank 0; a rerun with
other inputs is refused there), deals the chunks not yet scored out round robin, and each rank
samples, decodes and scores its own, saving each chunk before the next. An
interrupted evaluation, rerun with the same arguments, continues from the chunks already scored;
:mod:`g2rpo.evaluation.assemble` then gathers them into the artifact.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from g2rpo.artifacts.manifest import has_manifest, read_manifest
from g2rpo.artifacts.storage import S3Settings, Store, open_store
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation import resume
from g2rpo.evaluation.artifact import Baseline, PromptSet, png_bytes
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.identity import sampling_settings
from g2rpo.evaluation.policy import load_policy, sigma_grid
from g2rpo.evaluation.sampling import sample_rows
from g2rpo.models.flux import FluxConditioning
from g2rpo.rewards.registry import build_reward
from g2rpo.rewards.scoring import score_rewards

__all__ = ["Ranks", "join_ranks", "sample_pending"]

_ENCODE_BATCH = 16  # prompts per text-encoder call


@dataclass(frozen=True)
class Ranks:
    """This process's rank among ``world`` (1 outside torchrun), and the few collectives the evaluation uses."""

    rank: int
    world: int

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def broadcast(self, value: object) -> object:
        if self.world == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def total(self, value: int) -> int:
        if self.world == 1:
            return value
        out: list[int] = [0] * self.world
        torch.distributed.all_gather_object(out, value)
        return sum(out)


def join_ranks(device: torch.device) -> tuple[Ranks, torch.device]:
    """torchrun's process group when there is one (gloo on the CPU, NCCL on CUDA), and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Ranks(int(os.environ.get("RANK", "0")), world), device


def _model_digest(model_uri: str, settings: S3Settings | None) -> str | None:
    """sha256 of the model's manifest (a published artifact names all its bytes), else None."""
    store = open_store(model_uri, settings)
    if not has_manifest(store):
        return None
    return hashlib.sha256(store.get_bytes("manifest.json")[0]).hexdigest()


def sample_pending(
    ranks: Ranks,
    store: Store,
    output_uri: str,
    model_uri: str,
    config: EvaluationConfig,
    prompt_set: PromptSet,
    metrics: list[str],
    chunks: list[resume.Chunk],
    device: torch.device,
    *,
    base_model_uri: str | None,
    settings: S3Settings | None,
    say: Callable[[str], None],
    scored: Baseline | None = None,
) -> int:
    """Sample every chunk of ``chunks`` not yet scored under ``store``, this rank its share; the images
    sampled, all ranks together. A partial state of other inputs is refused before any sampling.

    ``scored``: a published evaluation of this very model and settings (checked by the caller,
    :func:`g2rpo.evaluation.identity.check_reusable`): its images and scores fill the chunks instead of
    sampling them again (rank 0; nothing is sampled, 0 is returned)."""
    prompts = prompt_set.prompts
    state = resume.PartialState(
        model_uri=model_uri,
        model_digest=_model_digest(model_uri, settings),
        prompt_set=prompt_set.uri,
        prompt_set_sha256=prompt_set.sha256,
        prompts=prompts,
        seeds=config.seeds,
        step_counts=config.step_counts,
        metrics=metrics,
        sampling=sampling_settings(config, device.type),
    )
    todo: list[resume.Chunk] = []
    if ranks.rank == 0:
        resumed = resume.open_state(store, state, output_uri)
        done = resume.done_chunks(store) if resumed else set()
        todo = [chunk for chunk in chunks if chunk.name not in done]
        say(
            f"{len(prompts)} prompts × seeds {config.seeds} × T {config.step_counts} from {config.prompts}: "
            f"{len(chunks)} chunk(s)" + (f", {len(chunks) - len(todo)} already scored (resumed)" if resumed else "")
        )
    if scored is not None:
        if ranks.rank == 0 and todo:
            _copy_chunks(scored, store, todo, say)
        return 0
    todo = ranks.broadcast(todo)
    mine = todo[ranks.rank :: ranks.world]
    generated = 0
    if mine:
        generated = _sample_chunks(model_uri, config, base_model_uri, settings, device, prompts, mine, store, say)
    return ranks.total(generated)


def _copy_chunks(scored: Baseline, store: Store, chunks: list[resume.Chunk], say: Callable[[str], None]) -> None:
    """Fill ``chunks`` from ``scored``'s published images and scores, as sampling would have."""
    policy = read_manifest(open_store(scored.uri)).metadata
    resume.write_policy(
        store, resume.PolicyRecord(policy_kind=policy["policy_kind"], base_model_uri=policy["base_model_uri"])
    )
    by_item = {
        (steps, int(item.prompt_id[1:]), item.seed): dict(item.scores)
        for steps, table in scored.by_steps.items()
        for item in table.items
    }
    for chunk in chunks:
        keys = [(chunk.steps, p, seed) for p, seed in chunk.items]
        pngs = [(scored.root / scored.images[key]).read_bytes() for key in keys]
        resume.write_chunk(store, chunk, pngs, [by_item[key] for key in keys])
    say(f"{sum(len(c.items) for c in chunks)} image(s) and their scores copied from {scored.uri}, not sampled again")


def _sample_chunks(model_uri, config, base_model_uri, settings, device, prompts, chunks, store: Store, say) -> int:
    """Sample, decode and score this rank's chunks, saving each before the next; the images sampled."""
    policy = load_policy(model_uri, config, base_model_uri=base_model_uri, settings=settings)
    say(f"loaded {policy.kind} {model_uri} (base {policy.base_model_uri})")
    resume.write_policy(store, resume.PolicyRecord(policy_kind=policy.kind, base_model_uri=policy.base_model_uri))
    cond = FluxConditioning.cat(
        [policy.text_encoder.encode(prompts[i : i + _ENCODE_BATCH]) for i in range(0, len(prompts), _ENCODE_BATCH)]
    ).to("cpu")
    rewards = [build_reward(spec, device=device, cache_dir=config.rewards.cache_dir) for spec in config.rewards.models]
    names = [spec.name for spec in config.rewards.models]
    generated, total = 0, sum(len(chunk.items) for chunk in chunks)
    say(f"{len(rewards)} reward model(s) loaded; sampling {total} image(s) in {len(chunks)} chunk(s)")
    for done, chunk in enumerate(chunks, start=1):
        rows = [p for p, _ in chunk.items]
        seeds = [seed for _, seed in chunk.items]
        sigmas = sigma_grid(config.model_copy(update={"num_steps": chunk.steps}), policy.velocity.latent_shape[0])
        images = sample_rows(
            policy.velocity,
            policy.vae,
            cond[torch.tensor(rows)],
            seeds,
            sigmas,
            micro_batch=config.micro_batch,
            decode_micro_batch=config.decode_micro_batch,
        )  # [N, 3, H, W]
        table = score_rewards(rewards, images, [prompts[p] for p in rows], config.rewards.batch_size)  # [R, N]
        _require_finite(table, names, chunk.name)
        scores = [{name: float(table[r, i]) for r, name in enumerate(names)} for i in range(len(rows))]
        resume.write_chunk(store, chunk, [png_bytes(image) for image in images], scores)
        generated += len(rows)
        say(
            f"chunk {chunk.name}: {len(rows)} image(s) sampled and scored ({done}/{len(chunks)} on this rank); "
            f"{generated}/{total} images"
        )
        resume.fail_point(done)
    return generated


def _require_finite(table: torch.Tensor, names: list[str], chunk: str) -> None:
    """Refuse a chunk with a NaN/inf score (``table``: ``[R, N]``) now, naming the metric and the
    fix, rather than at assembly: ``scores.json`` holds finite scores only. A UnifiedReward judge
    gives NaN for an answer without its score line; MixGRPO's evaluation leaves such an image out of
    the mean, which this evaluation does not (docs/rewards.md)."""
    for r, name in enumerate(names):
        bad = ~torch.isfinite(table[r])  # [N]
        if bool(bad.any()):
            judge = name.startswith("unified_reward_")
            hint = (
                "the judge's answer held no score line: raise max_new_tokens or check the checkpoint"
                if judge
                else "check the reward's weights and dtype (bf16/fp16 overflow)"
            )
            raise G2RPOError(
                problem(
                    f"rewards.models[{r}] ({name})",
                    f"NaN for {int(bad.sum())} of {bad.numel()} image(s) of chunk {chunk}",
                    f"the evaluation stores finite scores only; {hint}, or remove the metric",
                )
            )
