"""The alignment pipeline: prepare → train → evaluate → decide → promote (only when the gates pass),
inside an exit handler that records how the run ended.

:func:`build_pipeline` makes the pipeline for one placement profile (:mod:`g2rpo.steps.placement`): the
profile's node selector, tolerations and GPUs per node become parameter defaults (an operator changes the
pool and the GPU count per run), the rest (CPU and memory, /dev/shm, the S3 secret's name, pod labels,
timeouts) is fixed at compile time.

``gpus_per_node`` is a *string* parameter ("8"): KFP 2.17's driver fills an accelerator count that comes
from a pipeline input only when the value is a string, and drops the limit without a word when it is a
number (``resolvePodSpecInputRuntimeParameter`` in the backend's driver; KFP's own SDK test data pass
machine fields from ``str`` pipeline inputs the same way,
``sdk/python/test_data/pipelines/pipeline_with_string_machine_fields_pipeline_input.py``). The train
component reads it back as a number with :func:`g2rpo.launch.trainjob.gpus_per_node_from`, and submit
and schedule check it before any request. ``tests/pipeline/test_pipeline_backend.py`` runs the committed
YAML through the 2.17 backend's own code to show what each pod gets.
:func:`compile_pipeline` writes the YAML that ``pipelines/compiled/`` holds.

Caching is off on every task: KFP caches by default, a cached train or evaluate would reuse last run's
outputs for a prompt file changed under the same URI, and a cached promote is a silent no-op.
Retries (with backoff) only where a task is safe to run again: prepare writes its own folder, train and
evaluate publish under fresh prefixes; decide registers a version and promote moves an alias, so a retry
of either could register twice or fail on its own success.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as types.

import ast
import copy
import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path

from kfp import compiler, dsl, kubernetes

from components.decide import decide
from components.evaluate import evaluate
from components.images import TRAINER_IMAGE
from components.prepare import prepare_data
from components.promote import promote
from components.report_status import report_status
from components.train import train
from g2rpo.errors import G2RPOError, problem
from g2rpo.launch.trainjob import DEADLINE_GRACE_S
from g2rpo.steps import parameters
from g2rpo.steps.placement import PlacementProfile, load_profile

__all__ = ["PIPELINE_NAME", "TASK_MARGIN_S", "build_pipeline", "compile_pipeline", "trainjob_deadline"]

PIPELINE_NAME = "g2rpo-alignment"


# What the train task's time limit keeps beyond its TrainJob's deadline: the launcher's wait after the
# deadline, and the task's own start and record. The job ends first, so the task reports why.
TASK_MARGIN_S = DEADLINE_GRACE_S + 600


def trainjob_deadline(profile: PlacementProfile) -> int:
    """The multi-node TrainJob's activeDeadlineSeconds: the train task's time limit less :data:`TASK_MARGIN_S`."""
    deadline = profile.timeouts.train - TASK_MARGIN_S
    if deadline < 3600:
        raise G2RPOError(
            problem(
                "timeouts.train",
                profile.timeouts.train,
                f"leave a multi-node TrainJob at least an hour after the task's margin ({TASK_MARGIN_S} s): "
                f"give at least {3600 + TASK_MARGIN_S}",
            )
        )
    return deadline


def _retry(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_retry(num_retries=2, backoff_duration="60s", backoff_factor=2.0, backoff_max_duration="3600s")


def _with_s3(task: dsl.PipelineTask, profile: PlacementProfile, timeout: int) -> dsl.PipelineTask:
    """Every task: no caching, its time limit, and the S3 credentials from the Secret (by name)."""
    task.set_caching_options(False)
    kubernetes.set_timeout(task, timeout)
    kubernetes.use_secret_as_env(task, secret_name=profile.s3_secret_name, secret_key_to_env=profile.s3_secret_keys)
    return task


def _with_train_parameters(after: str) -> Callable[[Callable], Callable]:
    """Put the training choices of :data:`~g2rpo.steps.parameters.TRAIN_PARAMETERS` (typed, with their
    defaults) into a pipeline function's signature after the parameter ``after``, and every table's help
    into its docstring (KFP's input descriptions); the function takes the choices as ``**choices``. KFP
    reads a pipeline's parameters off ``inspect.signature`` and calls the function with them in that
    order, so the compiled pipeline has them as if written out. The table is read when the pipeline is
    built, not when this module is imported."""

    def decorate(func: Callable) -> Callable:
        written = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
        at = [p.name for p in written].index(after) + 1
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        choices = [
            inspect.Parameter(row.name, kind, default=copy.deepcopy(row.default), annotation=row.type)
            for row in parameters.TRAIN_PARAMETERS
        ]
        signature = inspect.Signature([*written[:at], *choices, *written[at:]])

        @functools.wraps(func)
        def pipeline(*args, **kwargs):
            return func(**signature.bind(*args, **kwargs).arguments)  # the choices land in **choices

        pipeline.__signature__ = signature
        described = parameters.parameter_help()
        pipeline.__doc__ = "The pipeline's parameters.\n\nArgs:\n" + "".join(
            f"    {name}: {described[name]}\n" for name in signature.parameters if name in described
        )
        return pipeline

    return decorate


def build_pipeline(profile: PlacementProfile):
    """The pipeline function for ``profile`` (see the module docstring)."""
    d = parameters.pipeline_defaults()  # the run's parameters: g2rpo.steps.parameters
    node_selector_default, tolerations_default = dict(profile.node_selector), list(profile.tolerations)
    gpus_default = str(profile.gpus_per_node)  # a string: see the module docstring
    deadline = trainjob_deadline(profile)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="G2RPO preference alignment of a Flux model: prepare, train, evaluate against the champion, "
        "promote only what passes the gates.",
    )
    @_with_train_parameters(after="model_name")
    def alignment(
        config_uri: str = d["config_uri"],
        base_model_uri: str = d["base_model_uri"],
        prompts_uri: str = d["prompts_uri"],
        store_uri: str = d["store_uri"],
        registry_uri: str = d["registry_uri"],
        model_name: str = d["model_name"],
        # here: the training choices, the rows of TRAIN_PARAMETERS, as **choices
        overrides: list = d["overrides"],
        test_size: int = d["test_size"],
        split_seed: int = d["split_seed"],
        eval_num_prompts: int = d["eval_num_prompts"],
        eval_seeds: list = d["eval_seeds"],
        gates_uri: str = d["gates_uri"],
        nodes: int = d["nodes"],
        checkpoint_store_uri: str = d["checkpoint_store_uri"],
        gpus_per_node: str = gpus_default,
        node_selector: dict = node_selector_default,
        tolerations: list = tolerations_default,
        pushgateway_url: str = d["pushgateway_url"],
        # The train task's own pod (g2rpo/steps/train_pod.py): the one-node size by default; with nodes > 1
        # give 0 GPUs and a small CPU/memory (`g2rpo pipeline submit` does), the TrainJob's pods hold the GPUs.
        train_pod_gpus: str = gpus_default,
        train_pod_cpu: str = profile.cpu_limit,
        train_pod_memory: str = profile.memory_limit,
        **choices,
    ):
        timeouts = profile.timeouts
        exit_task = _with_s3(report_status(pushgateway_url=pushgateway_url), profile, timeouts.report)
        _retry(exit_task.set_display_name("report status"))
        with dsl.ExitHandler(exit_task, name="alignment"):
            prepared = prepare_data(prompts_uri=prompts_uri, test_size=test_size, seed=split_seed)
            _retry(_with_s3(prepared.set_display_name("prepare data"), profile, timeouts.prepare))

            trained = train(
                data=prepared.outputs["data"],
                config_uri=config_uri,
                base_model_uri=base_model_uri,
                **choices,
                overrides=overrides,
                store_uri=store_uri,
                model_name=model_name,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                checkpoint_store_uri=checkpoint_store_uri,
                run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
                # More than one node: the TrainJob runs the trainer image on this task's placement.
                trainer_image=TRAINER_IMAGE,
                node_selector=node_selector,
                tolerations=tolerations,
                shm_size=profile.shm_size,
                s3_secret_name=profile.s3_secret_name,
                s3_secret_keys=profile.s3_secret_keys,
                service_account=profile.service_account,
                trainjob_deadline_s=deadline,
                # Also this pod's size below (and inputs, so the compiler passes them into the exit handler).
                train_pod_gpus=train_pod_gpus,
                train_pod_cpu=train_pod_cpu,
                train_pod_memory=train_pod_memory,
            )
            _retry(_with_s3(trained.set_display_name("train"), profile, timeouts.train))
            trained.set_accelerator_type(profile.accelerator_type).set_accelerator_limit(train_pod_gpus)
            trained.set_cpu_limit(train_pod_cpu).set_memory_limit(train_pod_memory)
            kubernetes.add_node_selector_json(trained, node_selector)
            kubernetes.add_toleration_json(trained, tolerations)
            kubernetes.empty_dir_mount(trained, "dshm", "/dev/shm", medium="Memory", size_limit=profile.shm_size)
            for key, value in profile.pod_labels.items():
                kubernetes.add_pod_label(trained, key, value)

            evaluated = evaluate(
                data=prepared.outputs["data"],
                trained=trained.outputs["model"],
                registry_uri=registry_uri,
                model_name=model_name,
                store_uri=store_uri,
                eval_num_prompts=eval_num_prompts,
                eval_seeds=eval_seeds,
                pushgateway_url=pushgateway_url,
            )
            _retry(_with_s3(evaluated.set_display_name("evaluate"), profile, timeouts.evaluate))
            if profile.evaluate_gpus:
                evaluated.set_accelerator_type(profile.accelerator_type).set_accelerator_limit(profile.evaluate_gpus)
                kubernetes.add_node_selector_json(evaluated, node_selector)
                kubernetes.add_toleration_json(evaluated, tolerations)

            decided = decide(
                trained=trained.outputs["model"],
                evaluation=evaluated.outputs["evaluation"],
                registry_uri=registry_uri,
                model_name=model_name,
                gates_uri=gates_uri,
                source_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                pushgateway_url=pushgateway_url,
            )
            _with_s3(decided.set_display_name("decide"), profile, timeouts.decide)

            with dsl.If(decided.outputs["Output"] == True, name="gates-passed"):  # noqa: E712 (a KFP condition)
                promoted = promote(
                    decision=decided.outputs["decision"],
                    evaluation=evaluated.outputs["evaluation"],
                    registry_uri=registry_uri,
                    gates_uri=gates_uri,
                    source_run=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                    pushgateway_url=pushgateway_url,
                )
                _with_s3(promoted.set_display_name("promote"), profile, timeouts.promote)

    return alignment


def compile_pipeline(output: str | Path, profile_path: str | Path | None = None) -> Path:
    """Compile the pipeline for the profile at ``profile_path`` (default h200) into ``output`` (YAML)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_pipeline(load_profile(profile_path)), str(output))
    output.write_text(_stable_header(output.read_text(encoding="utf-8")), encoding="utf-8")
    return output


_DEFAULT_COMMENT = re.compile(r"^(#    \w+: \w+ \[Default: )(.*)(\])$")


def _stable_header(text: str) -> str:
    """The compiler's header comment prints dict defaults in protobuf map order, which changes from one
    process to the next; print them with sorted keys so the compiled YAML is byte-stable."""

    def ordered(value):
        if isinstance(value, dict):
            return {key: ordered(value[key]) for key in sorted(value)}
        if isinstance(value, list):
            return [ordered(item) for item in value]
        return value

    lines = []
    for line in text.split("\n"):
        match = _DEFAULT_COMMENT.match(line) if line.startswith("#") else None
        if match and match.group(2)[:1] in "[{":
            line = f"{match.group(1)}{ordered(ast.literal_eval(match.group(2)))}{match.group(3)}"
        lines.append(line)
    return "\n".join(lines)
