"""The EVALUATE step: a model URI in, one published evaluation artifact out.

:func:`evaluate` loads the policy at ``model_uri`` (a Flux pipeline folder or a trainer export,
local or ``s3://``; :func:`g2rpo.evaluation.policy.load_policy`), reads the prompt set, ODE-samples
every (prompt, seed) on the config's σ grid, decodes and scores the images with every reward
(:func:`g2rpo.evaluation.sampling.sample_and_score`), and publishes the result at ``output_uri``
(:mod:`g2rpo.evaluation.artifact`: scores.json, metrics.json, prompts.json, images/, grid.png,
the manifest last). It runs in its own process from URIs alone: nothing of a live trainer is needed,
so the pipeline's evaluate component, ``g2rpo eval`` and ``g2rpo demo`` call it the same way.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from g2rpo import __version__
from g2rpo.artifacts.manifest import Manifest, has_manifest, publish_dir
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings, open_store
from g2rpo.config import config_hash
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.artifact import metric_summaries, read_prompt_set, write_evaluation_dir
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.policy import load_policy, resolve_device, sigma_grid
from g2rpo.evaluation.sampling import EvalResult, sample_and_score
from g2rpo.models.flux import FluxConditioning
from g2rpo.observability.push import PushTarget, push_evaluation
from g2rpo.rewards.registry import build_reward

__all__ = ["EvaluateResult", "evaluate"]

PRODUCER = f"g2rpo.steps.evaluate {__version__}"
_ENCODE_BATCH = 16  # prompts per text-encoder call


@dataclass(frozen=True)
class EvaluateResult:
    """What :func:`evaluate` published, and the numbers in it."""

    output_uri: str
    scores: EvalScores  # per (prompt, seed), as in scores.json
    means: dict[str, float]  # metric -> mean over every (prompt, seed)
    metrics: dict[str, dict[str, float | int]]  # metric -> {mean, std, n}, as in metrics.json
    manifest: Manifest
    evaluation: EvalResult  # the images (float, before PNG quantisation) and score tables


def evaluate(
    model_uri: str,
    config: EvaluationConfig,
    output_uri: str,
    *,
    base_model_uri: str | None = None,
    settings: S3Settings | None = None,
    progress: bool = False,
    pushgateway: PushTarget | None = None,
    version_label: str = "",
) -> EvaluateResult:
    """Evaluate the model at ``model_uri`` on ``config``'s prompts × seeds; publish at ``output_uri``.

    ``base_model_uri`` is the Flux pipeline an export was trained from (its VAE and text encoders);
    it defaults to the local location the export records. ``output_uri`` must not hold a published
    artifact yet (checked before any sampling). With ``pushgateway`` the metric summaries are pushed
    there, labelled ``version=version_label`` (a gateway that is down is a warning).
    """
    started = time.perf_counter()

    def say(text: str) -> None:
        if progress:
            print(f"[evaluate {time.perf_counter() - started:5.1f}s] {text}", file=sys.stderr, flush=True)

    if has_manifest(open_store(output_uri, settings)):
        raise G2RPOError(
            problem(
                "output_uri",
                output_uri,
                "already holds a published artifact; artifacts are immutable: choose a new URI",
            )
        )
    prompt_set = read_prompt_set(config.prompts, config.num_prompts, settings)
    say(f"{len(prompt_set.prompts)} prompts × seeds {config.seeds} from {config.prompts}")
    policy = load_policy(model_uri, config, base_model_uri=base_model_uri, settings=settings)
    say(f"loaded {policy.kind} {model_uri} (base {policy.base_model_uri})")
    prompts = prompt_set.prompts
    cond = FluxConditioning.cat(
        [policy.text_encoder.encode(prompts[i : i + _ENCODE_BATCH]) for i in range(0, len(prompts), _ENCODE_BATCH)]
    ).to("cpu")
    device = resolve_device(config.device)
    rewards = {
        spec.name: build_reward(spec, device=device, cache_dir=config.rewards.cache_dir)
        for spec in config.rewards.models
    }
    sigmas = sigma_grid(config, policy.velocity.latent_shape[0])
    say(f"sampling T={config.num_steps} ({config.grid} grid), {policy.velocity.height}×{policy.velocity.width}")
    result = sample_and_score(
        policy.velocity,
        policy.vae,
        cond,
        prompts,
        config.seeds,
        rewards,
        sigmas,
        micro_batch=config.micro_batch,
        decode_micro_batch=config.decode_micro_batch,
        reward_batch=config.rewards.batch_size,
    )
    metadata = {
        "kind": "evaluation",
        "model_uri": model_uri,
        "policy_kind": policy.kind,
        "base_model_uri": policy.base_model_uri,
        "config": config.model_dump(mode="json"),
    }
    with tempfile.TemporaryDirectory(prefix="g2rpo-eval-") as tmp:
        scores = write_evaluation_dir(result, prompt_set, tmp)
        say(f"publishing → {output_uri}")
        manifest = publish_dir(
            Path(tmp),
            output_uri,
            producer=PRODUCER,
            config_hash=config_hash(config),
            metadata=metadata,
            settings=settings,
        )
    metrics = metric_summaries(result)
    if pushgateway is not None:
        push_evaluation(pushgateway, metrics, steps=config.num_steps, version=version_label)
    say("done")
    return EvaluateResult(
        output_uri=output_uri,
        scores=scores,
        means={name: float(summary["mean"]) for name, summary in metrics.items()},
        metrics=metrics,
        manifest=manifest,
        evaluation=result,
    )
