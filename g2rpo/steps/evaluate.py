"""The EVALUATE step: a model URI in, one published evaluation artifact out.

:func:`evaluate` resolves its inputs (the output is checked writable and unpublished, the metrics
named, the prompt set read, the baseline loaded and checked), samples every (step count, prompt,
seed) chunk not yet scored (:mod:`g2rpo.evaluation.sharded`: the policy at ``model_uri``, a Flux
pipeline folder or a trainer export, local or ``s3://``, ODE-sampled on the config's σ grid, decoded
and scored with every reward), gathers the chunks into the artifact's files
(:func:`g2rpo.evaluation.assemble.assemble`: :mod:`g2rpo.evaluation.artifact`'s layout with the
metrics, plots and report of :mod:`g2rpo.evaluation.report`) and publishes them at ``output_uri``
(the manifest last). It runs in its own process from URIs alone: nothing of a live trainer is
needed, so the pipeline's evaluate component and ``g2rpo eval`` call it the same way.

The chunks are saved under the output before the publish (:mod:`g2rpo.evaluation.resume`): an
interrupted evaluation, rerun with the same arguments, continues from the chunks already scored.
Under ``torchrun`` every rank samples its share of the chunks left (round robin) and rank 0
gathers them from the output into the one artifact.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from g2rpo import __version__
from g2rpo.artifacts.cache import check_cache_writable, fetch_to_cache
from g2rpo.artifacts.manifest import Manifest, has_manifest, read_manifest
from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings, check_writable, open_store
from g2rpo.config import config_hash
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation import resume
from g2rpo.evaluation.artifact import check_baseline, eval_result_from, load_baseline, read_prompt_set
from g2rpo.evaluation.assemble import assemble
from g2rpo.evaluation.config import IMAGES_MAX, EvaluationConfig
from g2rpo.evaluation.identity import IDENTITY_KEY, check_reusable, scored_uri, scoring_identity
from g2rpo.evaluation.policy import resolve_device
from g2rpo.evaluation.sampling import EvalResult
from g2rpo.evaluation.sharded import join_ranks, sample_pending
from g2rpo.observability.push import PushTarget, push_evaluation
from g2rpo.rewards.specs import get_spec

__all__ = ["EvaluateResult", "evaluate", "evaluate_once", "read_evaluation"]

PRODUCER = f"g2rpo.steps.evaluate {__version__}"


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
    baseline_label: str = "",
    label: str = "evaluate",
    log: Callable[[str], None] | None = None,
    scored_uri: str | None = None,
) -> EvaluateResult:
    """Evaluate the model at ``model_uri`` on ``config``'s prompts × seeds × step counts; publish at
    ``output_uri``.

    ``base_model_uri`` is the Flux pipeline an export was trained from (its VAE and text encoders);
    it defaults to the local location the export records. ``baseline_uri`` is another published
    evaluation on the same prompts and seeds: the report then pairs the two, naming it ``baseline_label``
    (e.g. ``champion v3``, ``base model``) when given. ``output_uri`` must not
    hold a published artifact yet; a partial evaluation there is continued when its inputs match
    (all checked before any sampling); one holding files that are not an evaluation's is refused. Every rank returns the result. With ``pushgateway`` rank 0
    pushes the summaries there, labelled ``version=version_label`` (a gateway that is down is a warning).
    ``scored_uri``: a published evaluation of this very model and settings, already verified
    (:func:`evaluate_once`): its images and scores are copied instead of sampled, and only the artifact
    (with this call's baseline) is made again.
    With ``progress`` rank 0 writes a line per step to ``log`` (default stderr: loading, each chunk
    scored, the publish), each starting ``[<label> <seconds>s]``.
    """
    started = time.perf_counter()
    device = resolve_device(config.device)
    ranks, device = join_ranks(device)

    def say(text: str) -> None:
        if progress and ranks.rank == 0:
            (log or _stderr)(f"[{label} {time.perf_counter() - started:5.1f}s] {text}")

    if not model_uri:
        raise G2RPOError(problem("model_uri", model_uri, "name the model to evaluate (a folder or s3:// URI)"))
    check_writable(output_uri, "output_uri")
    # s3:// models, evaluations and reward weights are fetched into caches: one that cannot be written
    # is named with the setting that moves it now, not as an OSError at the download.
    if any(uri and uri.startswith("s3://") for uri in (model_uri, base_model_uri, baseline_uri, output_uri)):
        check_cache_writable(config.cache_dir, "cache_dir")
    if any(spec.fetches for spec in config.rewards.models):
        check_cache_writable(config.rewards.cache_dir, "rewards.cache_dir")
    store = open_store(output_uri, settings)
    if has_manifest(store):
        raise G2RPOError(
            problem(
                "output_uri",
                output_uri,
                "already holds a published artifact; artifacts are immutable: choose a new URI",
            )
        )
    resume.check_output(store, output_uri)
    metrics = [get_spec(spec.name).name for spec in config.rewards.models]  # an unknown name lists the valid ones
    prompt_set = read_prompt_set(config.prompts, config.num_prompts, settings)
    if (limits := prompt_set.notice()) and ranks.rank == 0:  # limits are said, not applied silently
        print(f"g2rpo eval: {limits}", file=sys.stderr, flush=True)
    prompts = prompt_set.prompts
    images = len(prompts) * len(config.seeds) * len(config.step_counts)
    if images > IMAGES_MAX:
        raise G2RPOError(
            problem(
                "seeds",
                f"{len(config.seeds)} seed(s)",
                f"{len(prompts)} prompt(s) × {len(config.seeds)} seed(s) × {len(config.step_counts)} step count(s) "
                f"= {images:,} images, over the {IMAGES_MAX:,} one evaluation holds: evaluate fewer prompts "
                "(num_prompts) or seeds, or split the prompt set into several evaluations",
            )
        )
    identity = scoring_identity(
        model_uri, config, prompt_set, metrics, device.type, base_model_uri=base_model_uri, settings=settings
    )
    baseline, paired_steps = None, []
    if baseline_uri:
        baseline = load_baseline(baseline_uri, settings, config.cache_dir)
        paired_steps = check_baseline(baseline, prompts, config.seeds, config.step_counts)
    chunks = resume.plan_chunks(config.step_counts, len(prompts), config.seeds, config.chunk_size)
    generated = sample_pending(
        ranks,
        store,
        output_uri,
        model_uri,
        config,
        prompt_set,
        metrics,
        chunks,
        device,
        base_model_uri=base_model_uri,
        settings=settings,
        say=say,
        scored=None if scored_uri is None else load_baseline(scored_uri, settings, config.cache_dir),
    )
    ranks.barrier()
    if ranks.rank == 0:
        say(f"assembling {len(chunks)} chunk(s) → {output_uri}")
        with tempfile.TemporaryDirectory(prefix="g2rpo-eval-") as tmp:
            root = Path(tmp)
            metadata = assemble(
                root,
                model_uri,
                config,
                prompt_set,
                chunks,
                store,
                output_uri,
                baseline,
                paired_steps,
                baseline_label,
                say=say,
            )
            if identity is not None:  # what these scores are of, so they can be found and reused (identity.py)
                metadata[IDENTITY_KEY] = identity.model_dump(mode="json")
            say(f"publishing {sum(1 for path in root.rglob('*') if path.is_file())} file(s) → {output_uri}")
            publish_dir(
                root,
                output_uri,
                producer=PRODUCER,
                config_hash=config_hash(config),
                metadata=metadata,
                settings=settings,
            )
        resume.clear(store)
    ranks.barrier()
    say("done")
    result = read_evaluation(output_uri, config, settings, generated=generated)
    if pushgateway is not None and ranks.rank == 0:
        push_evaluation(pushgateway, result.by_steps, version=version_label)
    return result


def evaluate_once(
    model_uri: str,
    config: EvaluationConfig,
    evaluations_uri: str,
    *,
    label: str,
    base_model_uri: str | None = None,
    baseline_uri: str | None = None,
    baseline_label: str = "",
    settings: S3Settings | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> EvaluateResult:
    """``model_uri`` scored once per identity (:mod:`g2rpo.evaluation.identity`: the model's and base
    model's bytes, the prompts, seeds, step counts, metrics and sampling settings): published at its
    content address under ``evaluations_uri`` and, when that already holds it — verified file by file,
    and refused when damaged or of other settings — read back instead of sampled again.

    With ``baseline_uri`` the evaluation is paired with that baseline in its report: a stored one (paired
    with another, or none) gives its images and scores, copied rather than sampled again, and the paired
    artifact is published beside it (a unique prefix).
    A model without a manifest has no content identity: it is evaluated afresh under a unique prefix.
    ``label`` (``challenger``, ``champion v3``, ``base model``) starts each progress line, written to ``log``
    (default stderr)."""
    prompt_set = read_prompt_set(config.prompts, config.num_prompts, settings)
    metrics = [get_spec(spec.name).name for spec in config.rewards.models]
    device = resolve_device(config.device)
    identity = scoring_identity(
        model_uri, config, prompt_set, metrics, device.type, base_model_uri=base_model_uri, settings=settings
    )
    fresh = f"{evaluations_uri.rstrip('/')}/{unique_prefix(label.replace(' ', '-'))}"
    output = fresh if identity is None else scored_uri(evaluations_uri, identity)
    stored = None
    if identity is not None and check_reusable(output, identity, settings):
        if baseline_uri is None:
            if progress:
                (log or _stderr)(
                    f"[evaluate {label}] scored before with the same model bytes, prompts, seeds and settings: "
                    f"reusing {output} (every file's sha256 checked)"
                )
            return read_evaluation(output, config, settings)
        # Paired with this baseline, the artifact is another; its images and scores are those stored.
        stored, output = output, fresh
    return evaluate(
        model_uri,
        config,
        output,
        base_model_uri=base_model_uri,
        baseline_uri=baseline_uri,
        baseline_label=baseline_label,
        settings=settings,
        progress=progress,
        label=f"evaluate {label}",
        log=log,
        scored_uri=stored,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def read_evaluation(
    output_uri: str, config: EvaluationConfig, settings: S3Settings | None = None, *, generated: int = 0
) -> EvaluateResult:
    """The published evaluation at ``output_uri``, read back (every rank reads the same files);
    ``generated``: the images this call sampled for it."""
    store = open_store(output_uri, settings)
    manifest = read_manifest(store)
    root = fetch_to_cache(output_uri, cache_dir=config.cache_dir, settings=settings)
    # Read without the strict reader on purpose: this call's rank 0 assembled and published these files
    # moments ago (an output already published is refused above), and fetch_to_cache matched their bytes;
    # a stored evaluation is read here only after check_reusable matched every file's sha256.
    scores = EvalScores.model_validate_json((root / "scores.json").read_text(encoding="utf-8"))
    document = json.loads((root / "metrics.json").read_text(encoding="utf-8"))
    prompts = [entry["prompt"] for entry in json.loads((root / "prompts.json").read_text(encoding="utf-8"))["prompts"]]
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
        evaluation=eval_result_from(root, prompts, list(scores.seeds), scores, output_uri),
    )
