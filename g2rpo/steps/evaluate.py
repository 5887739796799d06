"""The EVALUATE step: a model URI in, one published evaluation artifact out.

:func:`evaluate` loads the policy at ``model_uri`` (a Flux pipeline folder or a trainer export,
local or ``s3://``; :func:`g2rpo.evaluation.policy.load_policy`), reads the prompt set, ODE-samples
every (step count, prompt, seed) on the config's σ grid, decodes and scores the images with every
reward, and publishes the result at ``output_uri`` (:mod:`g2rpo.evaluation.artifact`'s layout, with
the metrics, plots and report of :mod:`g2rpo.evaluation.report`; the manifest last). It runs in its
own process from URIs alone: nothing of a live trainer is needed, so the pipeline's evaluate
component, ``g2rpo eval`` and ``g2rpo demo`` call it the same way.

The work is cut into fixed chunks (:mod:`g2rpo.evaluation.resume`) saved under the output before
the publish: an interrupted evaluation, rerun with the same arguments, continues from the chunks
already scored. Under ``torchrun`` every rank samples its share of the chunks left (round robin)
and rank 0 gathers them from the output into the one artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from g2rpo import __version__
from g2rpo.artifacts.manifest import Manifest, fetch_to_cache, has_manifest, publish_dir, read_manifest
from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.artifacts.storage import S3Settings, Store, check_writable, open_store
from g2rpo.config import config_hash
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation import report, resume
from g2rpo.evaluation.artifact import (
    Baseline,
    PromptSet,
    check_baseline,
    image_name,
    load_baseline,
    load_png,
    png_bytes,
    read_prompt_set,
    save_score_grid,
    step_image_name,
)
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.policy import load_policy, resolve_device, sigma_grid
from g2rpo.evaluation.sampling import EvalResult, sample_rows
from g2rpo.models.flux import FluxConditioning
from g2rpo.observability.push import PushTarget, push_evaluation
from g2rpo.rewards.registry import build_reward, get_spec
from g2rpo.rewards.scoring import score_rewards

__all__ = ["EvaluateResult", "evaluate"]

PRODUCER = f"g2rpo.steps.evaluate {__version__}"
_ENCODE_BATCH = 16  # prompts per text-encoder call
# Config keys that change no image and no score: the rest must match for a resume.
_NOT_SAMPLING = {"prompts", "num_prompts", "seeds", "num_steps", "extra_steps", "cache_dir", "device"}


@dataclass(frozen=True)
class EvaluateResult:
    """What :func:`evaluate` published, and the numbers in it."""

    output_uri: str
    scores: EvalScores  # per (prompt, seed) at num_steps, as in scores.json
    means: dict[str, float]  # metric -> mean over every (prompt, seed) at num_steps
    metrics: dict[str, dict[str, float | int]]  # metric -> {mean, std, n, ci_low, ci_high} at num_steps
    by_steps: dict[int, dict[str, dict[str, float | int]]]  # step count -> metric -> summary (metrics.json)
    paired: dict[int, dict[str, dict[str, float | int]]]  # step count -> metric -> vs the baseline ({} without)
    report_uri: str
    generated: int  # images this call sampled, all ranks together (fewer than all when it resumed)
    manifest: Manifest
    evaluation: EvalResult  # num_steps's images (as published, 8-bit) and score tables


@dataclass(frozen=True)
class _Ranks:
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


def _join_ranks(device: torch.device) -> tuple[_Ranks, torch.device]:
    """torchrun's process group when there is one (gloo on the CPU, NCCL on CUDA), and this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return _Ranks(int(os.environ.get("RANK", "0")), world), device


def _model_digest(model_uri: str, settings: S3Settings | None) -> str | None:
    """sha256 of the model's manifest (a published artifact names all its bytes), else None."""
    store = open_store(model_uri, settings)
    if not has_manifest(store):
        return None
    return hashlib.sha256(store.get_bytes("manifest.json")[0]).hexdigest()


def evaluate(
    model_uri: str,
    config: EvaluationConfig,
    output_uri: str,
    *,
    base_model_uri: str | None = None,
    baseline_uri: str | None = None,
    settings: S3Settings | None = None,
    progress: bool = False,
    pushgateway: PushTarget | None = None,
    version_label: str = "",
) -> EvaluateResult:
    """Evaluate the model at ``model_uri`` on ``config``'s prompts × seeds × step counts; publish at
    ``output_uri``.

    ``base_model_uri`` is the Flux pipeline an export was trained from (its VAE and text encoders);
    it defaults to the local location the export records. ``baseline_uri`` is another published
    evaluation on the same prompts and seeds: the report then pairs the two. ``output_uri`` must not
    hold a published artifact yet; a partial evaluation there is continued when its inputs match
    (all checked before any sampling). Every rank returns the result. With ``pushgateway`` rank 0
    pushes the summaries there, labelled ``version=version_label`` (a gateway that is down is a warning).
    """
    started = time.perf_counter()
    device = resolve_device(config.device)
    ranks, device = _join_ranks(device)

    def say(text: str) -> None:
        if progress and ranks.rank == 0:
            print(f"[evaluate {time.perf_counter() - started:5.1f}s] {text}", file=sys.stderr, flush=True)

    if not model_uri:
        raise G2RPOError(problem("model_uri", model_uri, "name the model to evaluate (a folder or s3:// URI)"))
    check_writable(output_uri, "output_uri")
    store = open_store(output_uri, settings)
    if has_manifest(store):
        raise G2RPOError(
            problem(
                "output_uri",
                output_uri,
                "already holds a published artifact; artifacts are immutable: choose a new URI",
            )
        )
    metrics = [get_spec(spec.name).name for spec in config.rewards.models]  # an unknown name lists the valid ones
    prompt_set = read_prompt_set(config.prompts, config.num_prompts, settings)
    prompts = prompt_set.prompts
    baseline, paired_steps = None, []
    if baseline_uri:
        baseline = load_baseline(baseline_uri, settings, config.cache_dir)
        paired_steps = check_baseline(baseline, prompts, config.seeds, config.step_counts)
    state = resume.PartialState(
        model_uri=model_uri,
        model_digest=_model_digest(model_uri, settings),
        prompt_set=prompt_set.uri,
        prompt_set_sha256=prompt_set.sha256,
        prompts=prompts,
        seeds=config.seeds,
        step_counts=config.step_counts,
        metrics=metrics,
        sampling={
            "device": device.type,
            **{k: v for k, v in config.model_dump(mode="json").items() if k not in _NOT_SAMPLING},
        },
    )
    chunks = resume.plan_chunks(config.step_counts, len(prompts), config.seeds, config.chunk_size)
    todo: list[resume.Chunk] = []
    if ranks.rank == 0:
        resumed = resume.open_state(store, state, output_uri)
        done = resume.done_chunks(store) if resumed else set()
        todo = [chunk for chunk in chunks if chunk.name not in done]
        say(
            f"{len(prompts)} prompts × seeds {config.seeds} × T {config.step_counts} from {config.prompts}: "
            f"{len(chunks)} chunk(s)" + (f", {len(chunks) - len(todo)} already scored (resumed)" if resumed else "")
        )
    todo = ranks.broadcast(todo)
    mine = todo[ranks.rank :: ranks.world]
    generated = 0
    if mine:
        generated = _sample_chunks(model_uri, config, base_model_uri, settings, device, prompts, mine, store, say)
    generated = ranks.total(generated)
    ranks.barrier()
    if ranks.rank == 0:
        say(f"assembling {len(chunks)} chunk(s) → {output_uri}")
        _assemble_and_publish(
            model_uri, config, prompt_set, chunks, store, output_uri, baseline, paired_steps, settings
        )
        resume.clear(store)
    ranks.barrier()
    say("done")
    result = _result(output_uri, config, generated, settings)
    if pushgateway is not None and ranks.rank == 0:
        push_evaluation(pushgateway, result.by_steps, version=version_label)
    return result


def _sample_chunks(model_uri, config, base_model_uri, settings, device, prompts, chunks, store: Store, say) -> int:
    """Sample, decode and score this rank's chunks, saving each before the next; the images sampled."""
    policy = load_policy(model_uri, config, base_model_uri=base_model_uri, settings=settings)
    say(f"loaded {policy.kind} {model_uri} (base {policy.base_model_uri})")
    loaded = {"policy_kind": policy.kind, "base_model_uri": policy.base_model_uri}
    store.put_bytes(f"{resume.PARTIAL}/policy.json", json.dumps(loaded).encode())  # for the manifest's metadata
    cond = FluxConditioning.cat(
        [policy.text_encoder.encode(prompts[i : i + _ENCODE_BATCH]) for i in range(0, len(prompts), _ENCODE_BATCH)]
    ).to("cpu")
    rewards = [build_reward(spec, device=device, cache_dir=config.rewards.cache_dir) for spec in config.rewards.models]
    names = [spec.name for spec in config.rewards.models]
    generated = 0
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
        scores = [{name: float(table[r, i]) for r, name in enumerate(names)} for i in range(len(rows))]
        resume.write_chunk(store, chunk, [png_bytes(image) for image in images], scores)
        generated += len(rows)
        say(f"chunk {chunk.name}: {len(rows)} image(s) scored ({done}/{len(chunks)} on this rank)")
        resume.fail_point(done)
    return generated


def _assemble_and_publish(
    model_uri: str,
    config: EvaluationConfig,
    prompt_set: PromptSet,
    chunks: list[resume.Chunk],
    store: Store,
    output_uri: str,
    baseline: Baseline | None,
    paired_steps: list[int],
    settings: S3Settings | None,
) -> None:
    """Gather every chunk from the output's partial state into the artifact's files and publish them."""
    prompts, seeds, num_steps = prompt_set.prompts, config.seeds, config.num_steps
    done = resume.done_chunks(store)
    missing = [chunk.name for chunk in chunks if chunk.name not in done]
    if missing:
        raise G2RPOError(
            problem(
                "output_uri", output_uri, f"lacks scored chunks {missing[:3]} after sampling; run the evaluation again"
            )
        )
    with tempfile.TemporaryDirectory(prefix="g2rpo-eval-") as tmp:
        root = Path(tmp)
        lines: list[dict] = []
        items: dict[int, dict[tuple[int, int], dict[str, float]]] = {steps: {} for steps in config.step_counts}
        for chunk in chunks:
            for item in resume.read_chunk(store, chunk.name).items:
                name = step_image_name(item.steps, num_steps, item.prompt_index, item.seed)
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                store.get_file(item.image, root / name)
                items[item.steps][(item.prompt_index, item.seed)] = item.scores
        by_steps: dict[int, EvalScores] = {}
        for steps in config.step_counts:
            by_steps[steps] = EvalScores(
                prompt_set=prompt_set.uri,
                prompt_set_sha256=prompt_set.sha256,
                seeds=list(seeds),
                items=[
                    ScoreItem(prompt_id=f"p{p}", seed=seed, scores=items[steps][(p, seed)])
                    for p in range(len(prompts))
                    for seed in seeds
                ],
            )
            lines += [
                {
                    "steps": steps,
                    "prompt_id": f"p{p}",
                    "prompt": prompts[p],
                    "seed": seed,
                    "image": step_image_name(steps, num_steps, p, seed),
                    "scores": items[steps][(p, seed)],
                }
                for p in range(len(prompts))
                for seed in seeds
            ]
        scores = by_steps[num_steps]
        _write_json(root / "scores.json", scores.model_dump(mode="json"))
        (root / "scores.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        _write_json(
            root / "prompts.json",
            {
                "prompt_set": prompt_set.uri,
                "prompt_set_sha256": prompt_set.sha256,
                "seeds": list(seeds),
                "prompts": [{"prompt_id": f"p{i}", "prompt": text} for i, text in enumerate(prompts)],
            },
        )
        summaries = {str(steps): report.summaries(s) for steps, s in by_steps.items()}
        paired: dict[str, dict] = {}
        plots = []
        (root / "plots").mkdir()
        metric_names = scores.metric_names()
        for metric in metric_names:
            plots.append(f"plots/distribution_{metric}.png")
            report.save_distribution_plot(by_steps, metric, root / plots[-1])
        baseline_images = {}
        if baseline is not None:
            for steps in paired_steps:
                # the baseline's records carry its own prompt_set URI: its content was checked equal
                theirs = baseline.by_steps[steps].model_copy(
                    update={"prompt_set": prompt_set.uri, "prompt_set_sha256": prompt_set.sha256}
                )
                paired[str(steps)] = report.paired_summaries(by_steps[steps], theirs)
                for metric in paired[str(steps)]:
                    plots.append(f"plots/scatter_{metric}_T{steps}.png")
                    report.save_scatter_plot(by_steps[steps], theirs, metric, steps, root / plots[-1])
                for p in range(len(prompts)):
                    for seed in seeds:
                        name = "baseline/" + step_image_name(steps, num_steps, p, seed)
                        (root / name).parent.mkdir(parents=True, exist_ok=True)
                        (root / name).write_bytes((baseline.root / baseline.images[(steps, p, seed)]).read_bytes())
                        baseline_images[(steps, p, seed)] = name
        _write_json(
            root / "metrics.json",
            {
                "num_steps": num_steps,
                "step_counts": config.step_counts,
                "confidence": report.CONFIDENCE,
                "bootstrap_resamples": report.BOOTSTRAP_RESAMPLES,
                "bootstrap_seed": report.BOOTSTRAP_SEED,
                "by_steps": summaries,
                **({"baseline": {"uri": baseline.uri, "paired": paired}} if baseline is not None else {}),
            },
        )
        primary = _eval_result(root, prompts, seeds, scores, output_uri)
        save_score_grid(primary, root / "grid.png")
        report.write_report_html(
            root / "report.html",
            title=f"Evaluation of {model_uri}",
            facts={
                "model": model_uri,
                "prompt set": f"{prompt_set.uri} ({len(prompts)} prompts, sha256 {prompt_set.sha256[:12]}…)",
                "seeds": ", ".join(map(str, seeds)),
                "step counts": ", ".join(f"T={t}" + (" (gated)" if t == num_steps else "") for t in config.step_counts),
                "metrics": ", ".join(metric_names),
                "baseline": baseline.uri if baseline is not None else "none",
                "output": output_uri,
            },
            num_steps=num_steps,
            prompts=prompts,
            seeds=list(seeds),
            by_steps=by_steps,
            metrics=summaries,
            image_of=lambda steps, p, seed: step_image_name(steps, num_steps, p, seed),
            plots=plots,
            paired=paired or None,
            baseline_by_steps={steps: baseline.by_steps[steps] for steps in paired_steps} if baseline else None,
            baseline_image_of=lambda steps, p, seed: baseline_images[(steps, p, seed)],
        )
        publish_dir(
            root,
            output_uri,
            producer=PRODUCER,
            config_hash=config_hash(config),
            metadata={
                "kind": "evaluation",
                "model_uri": model_uri,
                **json.loads(store.get_bytes(f"{resume.PARTIAL}/policy.json")[0]),
                "baseline_uri": baseline.uri if baseline is not None else None,
                "config": config.model_dump(mode="json"),
            },
            settings=settings,
        )


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _eval_result(root: Path, prompts: list[str], seeds: list[int], scores: EvalScores, uri: str) -> EvalResult:
    """num_steps's images as published (8-bit) and score tables ``[P, S]``."""
    images = torch.stack(
        [torch.stack([load_png(root / image_name(p, seed), uri) for seed in seeds]) for p in range(len(prompts))]
    )  # [P, S, 3, H, W]
    table = {
        metric: torch.tensor([[scores.keyed(metric)[(f"p{p}", seed)] for seed in seeds] for p in range(len(prompts))])
        for metric in scores.metric_names()
    }
    return EvalResult(prompts=list(prompts), seeds=list(seeds), images=images, scores=table)


def _result(output_uri: str, config: EvaluationConfig, generated: int, settings: S3Settings | None) -> EvaluateResult:
    """The published artifact, read back (every rank reads the same files)."""
    store = open_store(output_uri, settings)
    manifest = read_manifest(store)
    root = fetch_to_cache(output_uri, cache_dir=config.cache_dir, settings=settings)
    scores = EvalScores.model_validate_json((root / "scores.json").read_text(encoding="utf-8"))
    document = json.loads((root / "metrics.json").read_text(encoding="utf-8"))
    prompts = [entry["prompt"] for entry in json.loads((root / "prompts.json").read_text())["prompts"]]
    by_steps = {int(steps): table for steps, table in document["by_steps"].items()}
    primary = by_steps[config.num_steps]
    return EvaluateResult(
        output_uri=output_uri,
        scores=scores,
        means={name: float(summary["mean"]) for name, summary in primary.items()},
        metrics=primary,
        by_steps=by_steps,
        paired={int(steps): table for steps, table in document.get("baseline", {}).get("paired", {}).items()},
        report_uri=f"{output_uri.rstrip('/')}/report.html",
        generated=generated,
        manifest=manifest,
        evaluation=_eval_result(root, prompts, list(scores.seeds), scores, output_uri),
    )
