# Two commands set up a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Debian packages the tests start as real servers (tests/observability): Prometheus (with promtool)
# and the Pushgateway. Installed once; skipped when their binaries are already on PATH.
DEBS := prometheus prometheus-pushgateway
DEB_STAMP := $(VENV)/.debs-installed
# torch/torchvision first, pinned (both lie on local disk here; an unpinned torch downloads GBs).
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# PyPI's torch brings 3.2 GB of CUDA libraries that a CPU run never loads (the venv is 6.5 GB with them);
# TORCH_INDEX=https://download.pytorch.org/whl/cpu installs PyTorch's CPU-only build of the same versions.
TORCH_INDEX ?=
PYTEST_ARGS ?=

export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo lint test test-slow test-gpu test-cluster test-all parity bench ablation lock clean help

help:
	@echo "make demo       create .venv, install, run the whole Kubeflow pipeline here (kfp.local, on the shipped"
	@echo "                shapes model g2rpo/models/shapes_flux_unseen; minutes: docs/demo.md has measured times)"
	@echo "make test       install what the tests need, check lint and import contracts, run the suite (CI)"
	@echo "make lint       ruff (lint + format check) and the import contracts (lint-imports)"
	@echo "make test-slow  the opt-in slow tier (full-size reward architectures, long runs)"
	@echo "make test-gpu   the CUDA tier (-m gpu; needs a GPU)"
	@echo "make test-cluster  the cluster tier (-m cluster; root and the optional cluster and kfp tools, docs/testing.md): the"
	@echo "                component image built by buildah, the Helm chart on a real one-node Kubernetes, the pipeline run by KFP's"
	@echo "                own backend (API server, Argo, driver/launcher, ML Metadata, S3, its schedule fired), two-node training"
	@echo "                through the real Trainer and JobSet, Prometheus on the pods (docs/cluster.md; about 37 min from nothing"
	@echo "                on 2 cores); skips, saying why, without root, the tools or the packages"
	@echo "make parity     build the reference-package virtualenvs and regenerate parity fixtures"
	@echo "make bench      run the CPU benchmarks in benchmarks/ (JSON + table; about 30 min)"
	@echo "make ablation   the paper's ablation with cost on the shapes task (about an hour on 2 cores; reuses the committed runs"
	@echo "                in benchmarks/results/ablation/per_run, so only what is missing trains)"

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH_PINS)
	$(PIP) install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

$(DEB_STAMP):
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v prometheus-pushgateway >/dev/null; then \
		echo "prometheus, promtool, prometheus-pushgateway: already installed"; \
	elif command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $(DEBS); \
	else \
		echo "warning: no apt-get: install $(DEBS) yourself, or the observability tests skip" >&2; exit 0; \
	fi
	mkdir -p $(VENV) && touch $@

# Debian's chromium renders report.html in the evaluation tests (headless); installed once, as root or with sudo.
CHROMIUM_STAMP := $(VENV)/.chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(CHROMIUM_STAMP):
	command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y --no-install-recommends chromium; }
	mkdir -p $(VENV) && touch $(CHROMIUM_STAMP)

# The demo needs the Python packages only; the tests also start Chromium, Prometheus and the Pushgateway.
install: $(STAMP) $(CHROMIUM_STAMP) $(DEB_STAMP)

# The whole DAG (prepare → train → evaluate → decide → promote) through kfp.local on the shapes task:
# the shipped shapes model that never saw the held-out scenes (g2rpo/models/shapes_flux_unseen) is trained
# on the task's 296 train prompts and evaluated on the 64 held out; run it again and the new challenger is evaluated against the champion and gated. `g2rpo demo` is the same
# command. Quiet log; `g2rpo pipeline run-local --verbose` shows all.
demo: $(STAMP)
	$(VENV)/bin/g2rpo pipeline run-local

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-gpu: install
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

# The cluster tier (docs/cluster.md): skips, saying why, without root or the optional ../shared/tools/cluster.
# As root with the tools beside the checkout, its Debian packages are installed first (about 40 s, once).
CLUSTER_TOOLS := $(firstword $(wildcard ../shared/tools/cluster ../../shared/tools/cluster))
CLUSTER_DEBS := podman buildah runc containerd containernetworking-plugins mmdebstrap iptables etcd-server mariadb-server
CLUSTER_STAMP := $(VENV)/.cluster-debs

$(CLUSTER_STAMP):
	@if [ -z "$(CLUSTER_TOOLS)" ] || [ "$$(id -u)" != 0 ]; then \
		echo "cluster tier: no ../shared/tools/cluster or not root: its packages are not installed (the tier skips)"; \
	elif command -v podman buildah runc containerd etcd mmdebstrap mariadbd >/dev/null 2>&1 \
		&& [ "$$(command -v podman buildah runc containerd etcd mmdebstrap mariadbd | wc -l)" = 7 ]; then \
		echo "cluster tier packages: already installed"; mkdir -p $(VENV) && touch $@; \
	else \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $(CLUSTER_DEBS) && mkdir -p $(VENV) && touch $@; \
	fi

test-cluster: install $(CLUSTER_STAMP)
	$(PY) -m pytest -m cluster tests/cluster $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest -m "not gpu and not parity_env" $(PYTEST_ARGS)

parity: install
	bash parity/make_parity.sh

bench: install
	$(PY) -m benchmarks.run_all

# DanceGRPO, MixGRPO, G²RPO without MGAI, G²RPO and two compute-saving G²RPO variants on the shipped shapes
# model: a learning-rate sweep per method on a validation split, then 5 seeds on the 64 held-out prompts × 4
# seeds, at equal iterations, compute and wall time; resumable (finished runs in benchmarks/results/ablation/per_run).
ablation: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.ablation

# Re-freeze the resolved environment after changing dependencies in pyproject.toml.
lock:
	$(PIP) freeze --all --exclude-editable | grep -v -e '^g2rpo' -e '^pip==' > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
