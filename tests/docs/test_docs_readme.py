"""Every command of the README, and of the pages its walk-throughs moved to, runs as written, so
the docs cannot drift from the code.

The pages are :data:`PAGES`: the README and the docs pages that carry the commands a user types
first (the pipeline, deployment, evaluation and configuration walk-throughs). How commands are
found (robust to edits of any section): every fenced block labelled ``bash``, ``sh`` or ``shell`` is
a block of commands (other blocks — ``yaml``, ``python``, unlabelled diagrams — are not; the Python
examples run in ``tests/core/test_core_docs.py``). Lines ending in ``\\`` are joined; a ``#``
starting a line or following a space starts a comment. Each command is then classified by its first
words:

- runnable on a CPU here (:data:`FAST` prefixes): run, in page order, in one fresh folder that has
  the checkout's ``configs/`` beside it, as ``python -m g2rpo ...``; it must exit 0;
- runnable but slow (:data:`SLOW` prefixes: minutes): run the same way by the ``slow`` test only;
- not runnable in a test (:data:`NOT_HERE`: a cluster, Docker, an install into the environment):
  listed, with the reason;

and a command that matches none of them fails the test, naming it — a new command on these pages
must be classified here, so none is left untested by accident.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The README first, then the pages its walk-throughs live on, in the order their commands run.
PAGES = (
    README,
    ROOT / "docs" / "pipeline.md",
    ROOT / "docs" / "deployment.md",
    ROOT / "docs" / "evaluation.md",
    ROOT / "docs" / "errors.md",
)

FAST = ("g2rpo model init-tiny", "g2rpo eval", "g2rpo pipeline compile", "g2rpo demo --toy", "g2rpo validate")
SLOW = ("g2rpo pipeline run-local", "g2rpo demo")
NOT_HERE = {
    "make ": "builds .venv and installs packages (the environment under test is already installed)",
    "pip install": "installs into the environment under test",
    "docker ": "needs Docker and network access",
    "kubectl ": "needs a Kubernetes cluster",
    "helm ": "needs a Kubernetes cluster",
    "g2rpo pipeline submit": "needs a Kubeflow Pipelines server ($KFP)",
    "g2rpo pipeline schedule": "needs a Kubeflow Pipelines server ($KFP)",
}


def readme_commands(text: str) -> list[str]:
    """The commands of a page's ``bash``/``sh``/``shell`` blocks, in order, comments removed."""
    commands = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\s*\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
            if command:
                commands.append(command)
    return commands


def page_commands() -> list[str]:
    """The commands of every page of :data:`PAGES`, page by page."""
    return [command for page in PAGES for command in readme_commands(page.read_text(encoding="utf-8"))]


def classify(command: str) -> str:
    """``fast``, ``slow`` or ``not-here``; a command of none of these raises, naming it."""
    if any(command.startswith(prefix) for prefix in NOT_HERE):
        return "not-here"
    # longest prefix first: `g2rpo demo --toy` is fast, `g2rpo demo` slow
    for prefix in sorted(FAST + SLOW, key=len, reverse=True):
        if command == prefix or command.startswith(prefix + " "):
            return "fast" if prefix in FAST else "slow"
    raise AssertionError(
        f"docs command {command!r} is not classified: add its prefix to FAST, SLOW or NOT_HERE in {__file__}"
    )


def _run_all(tmp_path: Path, kinds: set[str]) -> list[str]:
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # the README's paths are relative to a checkout
    # ... and so are the shipped shapes model and learned rewards that configs/shapes-cpu.yaml names
    # (folders of data, not the package: imports still come from the checkout)
    (tmp_path / "g2rpo" / "models").mkdir(parents=True)
    for model in ("shapes_flux_unseen", "shapes_pref", "shapes_clip"):
        (tmp_path / "g2rpo" / "models" / model).symlink_to(ROOT / "g2rpo" / "models" / model)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ran = []
    for command in page_commands():
        if classify(command) not in kinds:
            continue
        argv = shlex.split(command)
        assert argv[0] == "g2rpo", command
        done = subprocess.run(
            [sys.executable, "-m", "g2rpo", *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=1800,
        )  # fmt: skip
        assert done.returncode == 0, f"docs command failed: {command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        ran.append(command)
    return ran


def test_every_readme_command_is_classified_and_the_blocks_are_found():
    commands = page_commands()
    kinds = {command: classify(command) for command in commands}  # raises on an unclassified one
    assert any(kind == "fast" for kind in kinds.values()) and any(c.startswith("g2rpo eval") for c in kinds)
    assert readme_commands("```bash\na \\\n  b  # note\n# only a comment\nc\n```\n```yaml\nd: 1\n```\n") == [
        "a b",
        "c",
    ]
    # the README keeps its two set-up commands; the walk-throughs' commands are on their pages
    readme = readme_commands(README.read_text(encoding="utf-8"))
    assert readme[:2] == ["make demo", "make test"], readme


@pytest.mark.integration
def test_the_readmes_cpu_commands_run_as_written(tmp_path):
    ran = _run_all(tmp_path, {"fast"})
    assert any(command.startswith("g2rpo eval") and "--baseline" in command for command in ran)
    assert (tmp_path / "runs" / "eval-1" / "report.html").is_file()  # the report docs/evaluation.md says to open


@pytest.mark.slow
def test_the_readmes_slow_commands_run_as_written_too(tmp_path):
    """Minutes: the pipeline through kfp.local with the shipped pretraining settings."""
    ran = _run_all(tmp_path, {"fast", "slow"})
    assert any(command.startswith("g2rpo pipeline run-local") for command in ran)
    # After the pipeline has run here, configs/shapes-cpu.yaml's prompts exist (and its model ships): it validates.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "g2rpo", "validate", "--config", "configs/shapes-cpu.yaml"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
