# syntax=docker/dockerfile:1
# The component image for prepare / evaluate / decide / promote (and the retraining CronJob):
# the project and kfp at the SDK's exact version on a slim Python base; no CUDA toolkit and no
# prebuilt DeepSpeed ops (torch's wheels carry the CUDA libraries evaluation needs on a GPU node).
# Build from the repository root:  docker build -f images/component.Dockerfile -t ghcr.io/g2rpo/g2rpo:0.1.0 .
# KFP components run it with install_kfp_package=False: `python3 -m kfp.dsl.executor_main`.
# Build arguments (images/README.md): BASE_IMAGE, any Debian-bookworm-based image with python3 3.11 and
# python3-venv (default the public slim image); PIP_CONFIG_FILE, a pip.conf mounted into the build that
# points pip at the build machine's own package sources (a local wheel store, a mirror), so torch comes
# from there and not as a multi-GB download.

ARG BASE_IMAGE=python:3.11.14-slim-bookworm

# One stage: this image compiles nothing, so a build stage would only copy the 6.5 GB venv into a second
# layer, and re-copy all of it on every source edit. Here torch is its own layer, kept across edits.
FROM ${BASE_IMAGE} AS runtime
ARG PIP_CONFIG_FILE
LABEL org.opencontainers.image.source="https://github.com/g2rpo/g2rpo" \
      org.opencontainers.image.title="g2rpo" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 g2rpo \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/g2rpo --shell /usr/sbin/nologin g2rpo
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml constraints.txt ./
RUN pip install -c constraints.txt torch==2.14.1 torchvision==0.29.1
# README.md (the package's long description) only now: an edit of it must not re-install torch.
COPY README.md ./
COPY g2rpo ./g2rpo
RUN pip install -c constraints.txt . \
    && pip check \
    && python -c "import kfp, kfp.dsl.executor_main; assert kfp.__version__ == '2.17.3', kfp.__version__" \
    && rm -rf build
ENV PYTHONUNBUFFERED=1 \
    HOME=/home/g2rpo \
    G2RPO_CACHE_DIR=/home/g2rpo/.cache/g2rpo
WORKDIR /home/g2rpo
# The run configs and gates (configs/): the pipeline's config_uri default, configs/flux-dev-h200.yaml, is a path
# relative to the working directory the tasks start in.
COPY configs /home/g2rpo/configs
# Numeric, so Kubernetes can verify runAsNonRoot without resolving a user name.
USER 10001:10001
ENTRYPOINT []
CMD ["g2rpo", "--help"]
