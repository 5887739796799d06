# syntax=docker/dockerfile:1
# The trainer image for the H200 pool (sm_90): torch from the project's pin, DeepSpeed with the ops
# the trainer can reach prebuilt for sm_90, and g2rpo installed from this repository.
# Build from the repository root:  docker build -f images/trainer.Dockerfile -t ghcr.io/g2rpo/g2rpo-trainer:0.1.0 .
#
# CUDA 13.0: torch 2.14.1 from PyPI is built against CUDA 13.0 (constraints.txt pins
# nvidia-cuda-runtime 13.0.x and cuda-toolkit 13.0.x); DeepSpeed's ops must be compiled with the
# same CUDA major as torch, so the builder's nvcc is 13.0 too. tests/images checks the match.
# Nodes need an NVIDIA driver >= 580 (CUDA 13.0).

ARG PYTHON_VERSION=3.11.14

# uv only installs a relocatable CPython 3.11 (Ubuntu 24.04 ships 3.12; the project needs 3.11).
FROM ghcr.io/astral-sh/uv:0.9.5 AS uv

FROM nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04 AS build
ARG PYTHON_VERSION
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ ninja-build git \
    && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install ${PYTHON_VERSION} \
    && "$(uv python find ${PYTHON_VERSION})" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml constraints.txt ./
COPY images/trainer/ /opt/g2rpo-build/
# torch first (DeepSpeed's build imports it) and the build's own tools, at the versions pyproject.toml
# and constraints.txt pin (--no-build-isolation: nothing unpinned is fetched for the build).
RUN pip install -c constraints.txt torch==2.14.1 torchvision==0.29.1 setuptools==84.2.1 nvidia-ml-py==13.580.126
# The ops prebuilt for sm_90: FusedAdam (a DeepSpeed optimizer chosen through deepspeed.extra) and
# CPUAdam (ZeRO optimizer offload). The trainer's default torch AdamW needs neither, but a job must
# never JIT-compile on an H200 node (no nvcc there, and minutes lost per rank).
# DS_ACCELERATOR=cuda: the build has no GPU, and DeepSpeed would otherwise pick the CPU accelerator,
# compile both ops with g++ only and record accelerator 'cpu', which an H200 node's DeepSpeed refuses
# to load (it recompiles them and fails). The compiler wrappers make CPUAdam portable instead of
# -march=native for the build host (images/trainer/portable-cc.sh).
ENV DS_ACCELERATOR=cuda \
    TORCH_CUDA_ARCH_LIST="9.0" \
    DS_BUILD_OPS=0 \
    DS_BUILD_FUSED_ADAM=1 \
    DS_BUILD_CPU_ADAM=1
RUN mkdir -p /opt/portable-cc \
    && install -m 0755 /opt/g2rpo-build/portable-cc.sh /opt/portable-cc/gcc \
    && install -m 0755 /opt/g2rpo-build/portable-cc.sh /opt/portable-cc/g++ \
    && CC=/opt/portable-cc/gcc CXX=/opt/portable-cc/g++ \
       pip install -c constraints.txt --no-build-isolation deepspeed==0.19.8 \
    && python /opt/g2rpo-build/check_deepspeed_ops.py fused_adam cpu_adam
# README.md (the package's long description) only now: an edit of it must not re-install torch.
COPY README.md ./
COPY g2rpo ./g2rpo
RUN pip install -c constraints.txt . \
    && pip check \
    && python -c "import kfp, kfp.dsl.executor_main; assert kfp.__version__ == '2.17.3', kfp.__version__"

FROM nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04 AS runtime
LABEL org.opencontainers.image.source="https://github.com/g2rpo/g2rpo" \
      org.opencontainers.image.title="g2rpo-trainer" \
      org.opencontainers.image.licenses="Apache-2.0"
# libgomp for DeepSpeed's CPUAdam; nothing else from the toolchain reaches the runtime.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 g2rpo \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/g2rpo --shell /usr/sbin/nologin g2rpo
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/g2rpo-build/check_deepspeed_ops.py /opt/g2rpo-build/check_deepspeed_ops.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/g2rpo \
    G2RPO_CACHE_DIR=/home/g2rpo/.cache/g2rpo \
    TORCH_EXTENSIONS_DIR=/home/g2rpo/.cache/torch_extensions \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /home/g2rpo
# The run configs and gates (configs/): the pipeline's config_uri default, configs/flux-dev-h200.yaml, is a path
# relative to the working directory the train and evaluate tasks start in.
COPY configs /home/g2rpo/configs
# Numeric, so Kubernetes can verify runAsNonRoot without resolving a user name.
USER 10001:10001
# Again as the runtime user, where no compiler exists: the ops load prebuilt or the build fails.
RUN DS_ACCELERATOR=cuda python /opt/g2rpo-build/check_deepspeed_ops.py fused_adam cpu_adam
ENTRYPOINT []
CMD ["g2rpo", "--help"]
