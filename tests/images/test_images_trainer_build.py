"""The trainer image's DeepSpeed build, reproduced outside Docker as far as this machine allows.

No Docker engine runs here, so this repeats ``images/trainer.Dockerfile``'s DeepSpeed step in a scratch
virtualenv: the same pins (the project environment's torch through a ``.pth``, setuptools and DeepSpeed
from ``constraints.txt``), the build stage's environment variables read from the Dockerfile itself, the
same compiler wrappers as ``CC``/``CXX``, nvcc 13.0 with no GPU (as in any ``docker build``; the math
libraries' headers, which the devel image has and this toolkit lacks, come from the CUDA wheels). Then the image's
check runs the way the runtime stage runs it: as uid 10001, with no compiler on ``PATH``.

Slow and opt-in (``make test-slow``): compiling ``multi_tensor_adam.cu`` for sm_90 and CPUAdam takes
minutes of CPU. Skipped, saying why, without nvcc, g++, an x86-64 CPU or objdump.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.images.test_images_dockerfiles import (
    CHECK_SCRIPT_FILE,
    IMAGES,
    PORTABLE_CC,
    env_values,
    parse_dockerfile,
    read_constraints,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
RUNTIME_UID = 10001  # the runtime stage's USER

missing = [
    what
    for what, there in (
        (f"nvcc ({CUDA_HOME}/bin/nvcc)", (CUDA_HOME / "bin" / "nvcc").exists()),
        ("/usr/bin/gcc and /usr/bin/g++", Path("/usr/bin/gcc").exists() and Path("/usr/bin/g++").exists()),
        ("objdump", shutil.which("objdump") is not None),
        ("an x86-64 CPU", platform.machine() == "x86_64"),
    )
    if not there
]


@pytest.fixture(scope="module")
def built() -> Path:
    """A scratch virtualenv holding DeepSpeed built as the trainer image builds it; its folder."""
    if missing:
        pytest.skip(f"cannot reproduce the trainer's DeepSpeed build here: no {', '.join(missing)}")
    # World-readable (not pytest's 0700 tmp folder): the runtime check runs as another uid.
    scratch = Path(tempfile.mkdtemp(prefix="g2rpo-trainer-build-"))
    scratch.chmod(0o755)
    try:
        yield _build(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build(scratch: Path) -> Path:
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    # The project environment's packages (torch and its CUDA 13.0 libraries at the lock's pins) after the scratch's own.
    (site / "zz-project-env.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pins = read_constraints()
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt")]
    subprocess.run([*pip, f"setuptools=={pins['setuptools']}"], check=True, timeout=600)

    compilers = scratch / "portable-cc"
    compilers.mkdir()
    for name in ("gcc", "g++"):
        shutil.copy(PORTABLE_CC, compilers / name)
        (compilers / name).chmod(0o755)
    build_stage = parse_dockerfile(IMAGES["trainer"].read_text())[-2]
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": f"{CUDA_HOME}/bin:/usr/bin:/bin",  # as the devel image: nvcc, the real compilers behind the wrappers
        "CUDA_HOME": str(CUDA_HOME),
        # This machine's toolkit is nvcc and the runtime headers only; the devel image also has the math
        # libraries' headers (torch's CUDA headers include cusparse.h): the CUDA wheels' copies stand in.
        "CPATH": str(Path(sysconfig.get_path("purelib")) / "nvidia" / "cu13" / "include"),
        # DS_ACCELERATOR, TORCH_CUDA_ARCH_LIST, DS_BUILD_* as the Dockerfile's build stage sets them.
        **{k: v for k, v in env_values(build_stage).items() if k.startswith(("DS_", "TORCH_CUDA_ARCH_LIST"))},
        "CC": str(compilers / "gcc"),
        "CXX": str(compilers / "g++"),
        "MAX_JOBS": "2",
    }
    log = scratch / "build.log"
    with log.open("w") as out:
        done = subprocess.run(
            # --ignore-installed/--no-binary: build here, not reuse the project environment's (CPU) build.
            [str(python), "-m", "pip", "install", "-v", "-c", str(REPO / "constraints.txt"), "--no-build-isolation"]
            + ["--no-cache-dir"]
            + ["--no-binary", "deepspeed", "--no-deps", "--ignore-installed", f"deepspeed=={pins['deepspeed']}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3000,
        )
    assert done.returncode == 0, log.read_text()[-5000:]
    return scratch


def _others_can_run(prefix: Path) -> bool:
    """Whether another uid can execute the base interpreter (every folder above it searchable), as root."""
    if os.geteuid() != 0:
        return False
    interpreter = (prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}").resolve()
    return all(os.stat(p).st_mode & 0o001 for p in [interpreter, *interpreter.parents])


def _op_library(scratch: Path, op: str) -> Path:
    site = next((scratch / "venv" / "lib").glob("python3*/site-packages"))
    (library,) = (site / "deepspeed" / "ops" / "adam").glob(f"{op}_op*.so")
    return library


def test_deepspeed_records_the_cuda_accelerator_and_both_ops(built):
    info = next((built / "venv" / "lib").glob("python3*/site-packages/deepspeed/git_version_info_installed.py"))
    text = info.read_text()
    assert "accelerator_name='cuda'" in text
    assert re.search(r"'fused_adam': (1|True)\b", text) and re.search(r"'cpu_adam': (1|True)\b", text)


def test_fused_adam_is_compiled_by_nvcc_for_sm90(built):
    log = (built / "build.log").read_text()
    nvcc_lines = [line for line in log.splitlines() if "/nvcc " in line and "multi_tensor_adam.cu" in line]
    assert nvcc_lines, "multi_tensor_adam.cu never reached nvcc"
    assert all("arch=compute_90,code=sm_90" in line for line in nvcc_lines)
    sections = subprocess.check_output(["objdump", "-h", str(_op_library(built, "fused_adam"))], text=True)
    assert ".nv_fatbin" in sections  # device code is in the library


def test_cpu_adam_holds_no_avx512_code_whatever_cpu_built_it(built):
    code = subprocess.check_output(
        ["objdump", "-d", "--no-show-raw-insn", str(_op_library(built, "cpu_adam"))], text=True
    )
    assert "%ymm" in code  # the AVX2 path
    assert "%zmm" not in code  # no AVX-512 register: runs on any x86-64-v3 host


def test_the_ops_load_prebuilt_as_the_runtime_user_with_no_compiler(built):
    env = {
        "PATH": str(built / "venv" / "bin"),  # no gcc, g++ or nvcc reachable
        "HOME": str(built),
        "TORCH_EXTENSIONS_DIR": str(built / "torch_extensions"),
        "DS_ACCELERATOR": "cuda",
    }
    command = [str(built / "venv" / "bin" / "python"), str(CHECK_SCRIPT_FILE), "fused_adam", "cpu_adam"]
    # As the image's uid where this machine lets that uid reach the interpreter (a pyenv under /root does not).
    as_runtime_user = {"user": RUNTIME_UID, "group": RUNTIME_UID} if _others_can_run(Path(sys.base_prefix)) else {}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, **as_runtime_user)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fused_adam: prebuilt for cuda" in done.stdout and "cpu_adam: prebuilt for cuda" in done.stdout
    assert not (built / "torch_extensions").exists()  # nothing compiled at load time
