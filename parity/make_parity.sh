#!/usr/bin/env bash
# `make parity`: build the reference-package virtualenvs, regenerate the golden parity fixtures
# with the packages' own code, then check the project's heads against them.
#
#   parity/.venv-hpsv2        hpsv2 1.2.0        (requirements-hpsv2.txt)
#   parity/.venv-imagereward  image-reward 1.5   (requirements-imagereward.txt)
#
# Each env is rebuilt only when its requirements file changed (hash in .venv-*/.installed).
# torch/torchvision are installed first with exact pins (they lie on local disk; an unpinned torch
# would download GBs). Generators run offline: HF_HUB_OFFLINE=1 and a socket guard that fails any
# non-loopback connection (parity/parity_inputs.py). Output: tests/fixtures/parity/{hps_v21,image_reward}/.
# See docs/parity.md.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON_FOR_VENVS=${PYTHON_FOR_VENVS:-python3}
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)
MAIN_PY=${MAIN_PY:-.venv/bin/python}
FIXTURES=tests/fixtures/parity
start=$(date +%s)

log() { printf '[parity %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

# build_env NAME REQUIREMENTS [POST_INSTALL_FUNCTION]
build_env() {
  local name=$1 requirements=$2 post=${3:-}
  local venv=parity/.venv-$name
  local want
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [[ -f $venv/.installed && $(cat "$venv/.installed") == "$want" ]]; then
    log "reusing $venv"
    return
  fi
  log "building $venv (2–3 minutes; ~5.5 GB)"
  rm -rf "$venv"
  "$PYTHON_FOR_VENVS" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "${TORCH_PINS[@]}" 2> >(grep -v '^WARNING: Location' >&2)
  "$venv/bin/python" -m pip install -q -r "$requirements" 2> >(grep -v '^WARNING: Location' >&2)
  [[ -n $post ]] && "$post" "$venv"
  "$venv/bin/python" -m pip check
  echo "$want" > "$venv/.installed"
}

# hpsv2 1.2.0's wheel lacks the BPE vocabulary its bundled open_clip reads; open_clip ships the same file.
hpsv2_add_bpe_vocab() {
  local site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp "$site/open_clip/bpe_simple_vocab_16e6.txt.gz" "$site/hpsv2/src/open_clip/"
}

build_env hpsv2 parity/requirements-hpsv2.txt hpsv2_add_bpe_vocab
build_env imagereward parity/requirements-imagereward.txt

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Offline, and no caches from $HOME: hpsv2 keeps its files under HPS_ROOT, Hugging Face under HF_HOME.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$scratch/hf HPS_ROOT=$scratch/hpsv2
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore

log "hpsv2: tiny weights + golden scores"
parity/.venv-hpsv2/bin/python parity/make_hps_v21.py $FIXTURES/hps_v21
log "image-reward: tiny weights + golden scores"
parity/.venv-imagereward/bin/python parity/make_image_reward.py $FIXTURES/image_reward

log "checking the project's heads against the fixtures"
"$MAIN_PY" -m pytest -q -p no:cacheprovider -m "parity or parity_env" tests/rewards/test_rewards_parity.py
log "done: fixtures in $FIXTURES (commit them if they changed: git status $FIXTURES)"
