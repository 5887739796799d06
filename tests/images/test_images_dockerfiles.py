"""The Dockerfiles, checked statically (no Docker engine runs here).

They parse; every base is pinned; the final stage's last USER is a numeric non-root uid; every
version a ``pip install`` names equals the project's lock (constraints.txt, and pyproject.toml for
the pins it carries); kfp is asserted at the SDK's exact version; the trainer's CUDA matches the
CUDA torch was built for and its DeepSpeed ops are prebuilt for sm_90; COPY sources exist and pass
``.dockerignore``; no credentials in ENV/ARG.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = {"trainer": REPO / "images" / "trainer.Dockerfile", "component": REPO / "images" / "component.Dockerfile"}
PORTABLE_CC = REPO / "images" / "trainer" / "portable-cc.sh"
CHECK_SCRIPT_FILE = REPO / "images" / "trainer" / "check_deepspeed_ops.py"
CHECK_SCRIPT = "/opt/g2rpo-build/check_deepspeed_ops.py"  # where the trainer image has it
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions grouped by stage: continuation lines joined, comments and directives dropped."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, value = full.partition(" ")
        if keyword.upper() not in INSTRUCTIONS:
            raise ValueError(f"line {start}: unknown instruction {keyword!r}")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))
    if pending:
        raise ValueError("the file ends inside a continued instruction")
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.value.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, []))
        elif stages:
            stages[-1].instructions.append(ins)
        elif ins.keyword != "ARG":
            raise ValueError(f"line {ins.line}: {ins.keyword} before the first FROM")
    return stages


def read_constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[normalise(name)] = version.strip()
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_installs(stage: Stage) -> list[list[str]]:
    """The argument lists of every ``pip install`` in a stage's RUN instructions."""
    out = []
    for ins in (i for i in stage.instructions if i.keyword == "RUN"):
        lexer = shlex.shlex(ins.value, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token in ("&&", ";", "||", "|"):
                commands.append([])
            else:
                commands[-1].append(token)
        for words in commands:
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]  # VAR=value before the command: its environment
            if words[:2] == ["pip", "install"] or words[1:4] == ["-m", "pip", "install"]:
                out.append(words[words.index("install") + 1 :])
    return out


def env_values(stage: Stage) -> dict[str, str]:
    env = {}
    for ins in (i for i in stage.instructions if i.keyword == "ENV"):
        for word in shlex.split(ins.value):
            key, _, value = word.partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="module", params=sorted(IMAGES))
def image(request):
    return request.param, parse_dockerfile(IMAGES[request.param].read_text())


def test_the_last_stage_is_the_runtime_and_a_build_stage_only_where_something_compiles(image):
    name, stages = image
    assert stages[-1].name == "runtime"
    # The trainer compiles DeepSpeed's ops (nvcc in a build stage); the component image compiles nothing, and a
    # build stage there would only copy its 6.5 GB venv into a second layer on every source edit.
    if name == "trainer":
        assert [s.name for s in stages][-2:] == ["build", "runtime"]
    else:
        assert len(stages) == 1, f"{name}: one stage, {[s.name for s in stages]} found"


def _global_args(text: str) -> dict[str, str]:
    """The ``ARG name=default`` lines before the first FROM (the ones a FROM line may use)."""
    args = {}
    for line in text.splitlines():
        if line.strip().upper().startswith("FROM "):
            break
        if line.strip().upper().startswith("ARG "):
            name, _, default = line.strip()[4:].strip().partition("=")
            args[name] = default
    return args


def test_every_base_is_pinned_by_exact_tag_or_digest(image):
    name, stages = image
    names = {s.name for s in stages if s.name}
    args = _global_args(IMAGES[name].read_text())
    for stage in stages:
        if stage.image in names:
            continue
        # A base given as a build argument (the component image's BASE_IMAGE): its default must be pinned.
        arg = re.fullmatch(r"\$\{?(\w+)\}?", stage.image)
        if arg:
            assert args.get(arg.group(1)), f"{stage.image}: give the ARG a pinned default before the first FROM"
            stage = Stage(args[arg.group(1)], stage.name, stage.instructions)
        assert "$" not in stage.image, f"{stage.image}: spell the base out, or as an ARG with a pinned default"
        if "@sha256:" in stage.image:
            assert re.search(r"@sha256:[0-9a-f]{64}$", stage.image), stage.image
            continue
        tag = stage.image.rpartition(":")[2]
        assert re.match(r"^\d+\.\d+\.\d+(-[a-z0-9.-]+)?$", tag), f"{stage.image}: pin an exact version, not {tag!r}"


def test_the_final_user_is_a_numeric_non_root_uid(image):
    _, stages = image
    users = [i.value for i in stages[-1].instructions if i.keyword == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"last USER is {users[-1]!r}: the kubelet checks runAsNonRoot on a uid"


def test_every_installed_version_is_the_locked_one(image):
    name, stages = image
    pins = read_constraints()
    project_pins = {
        normalise(dep.split("==")[0]): dep.split("==")[1]
        for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        if "==" in dep
    }
    installs = [args for stage in stages for args in pip_installs(stage)]
    assert installs, f"{name}: no pip install found"
    installs_project = False
    for args in installs:
        assert "-c" in args and args[args.index("-c") + 1] == "constraints.txt", (
            f"pip install {args}: pass -c constraints.txt"
        )
        for word in args:
            if word.startswith("-") or word == "constraints.txt":
                continue
            if word == ".":
                installs_project = True
                continue
            package, sep, version = word.partition("==")
            assert sep, f"pip install {word}: name the version (the lock's)"
            assert pins.get(normalise(package)) == version, (
                f"{package}=={version} but constraints.txt has {pins.get(normalise(package))}"
            )
            if normalise(package) in project_pins:
                assert project_pins[normalise(package)] == version, (
                    f"{package}: pyproject.toml pins {project_pins[normalise(package)]}"
                )
    assert installs_project, f"{name}: the project is installed from the repository (pip install -c constraints.txt .)"


def test_kfp_is_asserted_at_the_sdk_version(image):
    _, stages = image
    runs = " ".join(i.value for stage in stages for i in stage.instructions if i.keyword == "RUN")
    asserted = re.search(r"kfp\.__version__ == '([^']+)'", runs)
    assert asserted and asserted.group(1) == read_constraints()["kfp"]
    assert "kfp.dsl.executor_main" in runs


def test_the_trainer_cuda_matches_torch_and_its_ops_are_prebuilt_for_sm90():
    stages = parse_dockerfile(IMAGES["trainer"].read_text())
    pins = read_constraints()
    torch_cuda = ".".join(pins["nvidia-cuda-runtime"].split(".")[:2])
    for stage in stages:
        if stage.image.startswith("nvidia/cuda:"):
            assert stage.image.split(":")[1].startswith(torch_cuda + "."), (
                f"{stage.image}: torch's CUDA is {torch_cuda}"
            )
    assert "devel" in stages[-2].image and "devel" not in stages[-1].image, "nvcc in the build stage only"
    env = env_values(stages[-2])
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    # No GPU in a docker build: without this DeepSpeed picks the CPU accelerator and builds CPU ops.
    assert env["DS_ACCELERATOR"] == "cuda"
    built = {
        key.removeprefix("DS_BUILD_").lower()
        for key, value in env.items()
        if key.startswith("DS_BUILD_") and value == "1"
    }
    assert built == {"fused_adam", "cpu_adam"}, "the two ops the trainer can reach are prebuilt"
    (install,) = [
        " ".join(i.value.split()) for i in stages[-2].instructions if i.keyword == "RUN" and "deepspeed==" in i.value
    ]
    check = f"python {CHECK_SCRIPT} "
    assert check in install, "the build checks the ops it built"
    assert set(install.split(check)[1].split()[:2]) == built, "the build checks every op it prebuilds"
    # The runtime stage checks again after its last USER: as the runtime user, with no compiler there.
    runtime = stages[-1].instructions
    last_user = max(i for i, ins in enumerate(runtime) if ins.keyword == "USER")
    (recheck,) = [ins.value for ins in runtime[last_user:] if ins.keyword == "RUN"]
    assert recheck.startswith("DS_ACCELERATOR=cuda ") and set(recheck.split(check)[1].split()) == built


def test_the_trainers_cpu_ops_are_built_for_a_portable_cpu_not_the_build_host():
    stages = parse_dockerfile(IMAGES["trainer"].read_text())
    (install,) = [
        " ".join(i.value.split()) for i in stages[-2].instructions if i.keyword == "RUN" and "deepspeed==" in i.value
    ]
    # DeepSpeed's CPUAdam builder passes -march=native (no setting overrides it): the wrappers rewrite it.
    assert "CC=/opt/portable-cc/gcc CXX=/opt/portable-cc/g++ pip install" in install
    assert "install -m 0755 /opt/g2rpo-build/portable-cc.sh /opt/portable-cc/gcc" in install
    assert "install -m 0755 /opt/g2rpo-build/portable-cc.sh /opt/portable-cc/g++" in install
    copies = [i.value.split() for i in stages[-2].instructions if i.keyword == "COPY"]
    assert ["images/trainer/", "/opt/g2rpo-build/"] in copies


@pytest.mark.skipif(not Path("/usr/bin/g++").exists(), reason="no /usr/bin/g++ on this machine to wrap")
def test_the_portable_compiler_wrapper_targets_x86_64_v3(tmp_path):
    # The real wrapper around the real g++: what -march=native and DeepSpeed's AVX-512 macro turn into.
    wrapper = tmp_path / "g++"
    shutil.copy(PORTABLE_CC, wrapper)
    wrapper.chmod(0o755)
    command = [str(wrapper), "-march=native", "-D__AVX512__", '-DG2RPO_NOTE="two words"', "-dM", "-E", "-x", "c++"]
    macros = subprocess.run([*command, "/dev/null"], capture_output=True, text=True, check=True).stdout
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    assert {"__AVX2__", "__FMA__", "__AVX256__"} <= defined
    assert not {"__AVX512F__", "__AVX512__"} & defined
    assert '#define G2RPO_NOTE "two words"' in macros  # arguments with spaces pass through whole


def test_the_ops_check_refuses_a_deepspeed_built_for_the_cpu():
    # The venv's DeepSpeed is what a GPU-less build without DS_ACCELERATOR=cuda makes: the check must say so.
    done = subprocess.run(
        [sys.executable, str(CHECK_SCRIPT_FILE), "fused_adam", "cpu_adam"],
        capture_output=True,
        text=True,
        env={**os.environ, "DS_ACCELERATOR": "cuda"},
        timeout=300,
    )
    assert done.returncode == 1
    assert "DeepSpeed was built for accelerator 'cpu': build it with DS_ACCELERATOR=cuda" in done.stderr
    assert "fused_adam: not prebuilt; build with DS_BUILD_FUSED_ADAM=1" in done.stderr


def test_every_package_the_trainer_build_pulls_in_is_locked():
    # pip install -c constraints.txt leaves anything the lock does not name unpinned: DeepSpeed's
    # requirements, what its CUDA build adds (NVML's bindings) and the build backend must all be in it.
    pins = read_constraints()
    runtime_requirements = [r for r in metadata.requires("deepspeed") or [] if "extra ==" not in r]
    requirements = {normalise(re.split(r"[ ;<>=!~\[]", r)[0]) for r in runtime_requirements}
    needed = requirements | {"nvidia-ml-py", "setuptools"}
    assert needed - set(pins) == set()
    stages = parse_dockerfile(IMAGES["trainer"].read_text())
    installs = pip_installs(stages[-2])
    first_deepspeed = next(i for i, args in enumerate(installs) if "deepspeed==0.19.8" in args)
    before = {normalise(w.partition("==")[0]) for args in installs[:first_deepspeed] for w in args}
    assert {"setuptools", "nvidia-ml-py", "torch"} <= before, "the build's tools come pinned, before the build"


def test_no_credentials_in_env_or_arg(image):
    _, stages = image
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword in ("ENV", "ARG"):
                for word in shlex.split(ins.value):
                    key = word.partition("=")[0].upper()
                    assert not re.search(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY|CREDENTIAL|API_KEY", key), ins


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: patterns in order, the last one that matches the path or a parent decides."""
    excluded = False
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if any(re.fullmatch(regex, c) for c in candidates) or any(fnmatch.fnmatch(c, pattern) for c in candidates):
            excluded = not negate
    return excluded


def test_copy_sources_exist_and_pass_dockerignore(image):
    _, stages = image
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for ins in (i for stage in stages for i in stage.instructions if i.keyword == "COPY"):
        words = ins.value.split()
        if any(w.startswith("--from") for w in words):
            continue
        sources.extend(w for w in words[:-1] if not w.startswith("--"))
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignore_excludes(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
    assert not dockerignore_excludes("g2rpo/__init__.py", patterns)
    for kept_out in (
        ".git/config",
        ".venv/bin/python",
        "g2rpo/__pycache__/cli.cpython-311.pyc",
        "tests/conftest.py",
        "runs/x",
    ):
        assert dockerignore_excludes(kept_out, patterns), kept_out


def test_parser_rejects_what_docker_would():
    with pytest.raises(ValueError, match="unknown instruction"):
        parse_dockerfile("FROM python:3.11.14-slim\nRUNN echo hi\n")
    with pytest.raises(ValueError, match="continued"):
        parse_dockerfile("FROM python:3.11.14-slim\nRUN echo \\\n")


def test_the_components_name_the_images_the_chart_deploys():
    from components.images import G2RPO_IMAGE, TRAINER_IMAGE
    from g2rpo import __version__

    values = yaml.safe_load((REPO / "charts" / "g2rpo" / "values.yaml").read_text())["images"]
    assert TRAINER_IMAGE == f"{values['trainer']['repository']}:{__version__}"
    assert G2RPO_IMAGE == f"{values['component']['repository']}:{__version__}"
