#!/usr/bin/env bash
# The GPU run (issue 44): install the wheel set offline, then three measurements in order of value,
# each under a time limit, every JSON, the profile and the log into one folder.
#
#   benchmarks/gpu_run.sh OUT                 on the GPU machine (python3 = its Python 3.12 + torch)
#   benchmarks/gpu_run.sh OUT --cpu-rehearsal here: the same steps at --device cpu --tiny with the
#                                             project's venv (.venv/bin/python), no install
#
# 0. benchmarks/gpu_diag.py: which attention backends back-propagate (one process each); the
#    measurements then allow only those (G2RPO_BENCH_SDPA; set it to skip the check).
# 1. benchmarks/gpu_flux_step.py: FLUX.1-dev transformer at 720², G = 12, 16 steps: GEMM ceiling,
#    sampling images/s batched and one per call, the G²RPO term's TFLOP/s, MFU, peak memory, and a
#    torch.profiler table of one training step (profile.txt).
# 2. benchmarks/gpu_train_iteration.py: one real `g2rpo train` iteration at FLUX.1-dev's shapes, LoRA,
#    DeepSpeed ZeRO-2 on one rank, FusedAdam (each phase's seconds).
# 3. benchmarks/gpu_rewards.py: HPS-v2.1 / CLIP / PickScore heads at full size, images/s.
#
# Limits (G2RPO_GPU_LIMITS="install flux train rewards", seconds) fit one call of the device's 600 s
# with a margin. A step that fails or runs out of time is logged and the next one still runs; the exit
# status is the number of steps that failed.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_run.sh OUT [--cpu-rehearsal]}
mode=${2:-gpu}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee -a "$out/gpu_run.log") 2>&1
read -r t_install t_flux t_train t_rewards <<<"${G2RPO_GPU_LIMITS:-60 170 230 70}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
started=$SECONDS
failed=0

step() {  # step NAME LIMIT COMMAND...: run under a time limit, log its time and status
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name (limit ${limit} s): $*"
  timeout --signal=INT --kill-after=10 "$limit" "$@"
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (time limit)')"
  [ $rc = 0 ] || failed=$((failed + 1))
  return 0
}

if [ "$mode" = --cpu-rehearsal ]; then
  py=${G2RPO_PYTHON:-.venv/bin/python}
  export PYTHONPATH=$PWD
  tiny=(--device cpu --tiny)
else
  py=python3
  site=${G2RPO_GPU_SITE:-/tmp/g2rpo-site}
  wheels=${G2RPO_GPU_WHEELS:-.whl}
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl &&
      python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$site" \
        "$wheels"/deepspeed-*.tar.gz
  }
  step install "$t_install" bash -c "$(declare -f install); site=$site wheels=$wheels install"
  export PYTHONPATH=$PWD:$site
  tiny=()
fi
"$py" -c "import sys, torch, diffusers, transformers, pydantic, open_clip, deepspeed, peft
print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda,
      '| diffusers', diffusers.__version__, '| transformers', transformers.__version__, '| deepspeed',
      deepspeed.__version__, '| peft', peft.__version__, '| open_clip', open_clip.__version__)" || failed=$((failed + 1))

# Which attention backends back-propagate here (the first H200 run stopped in the backward with an illegal
# memory access): one process per backend, then the measurements allow only those that passed.
echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>}"
if [ -z "${G2RPO_BENCH_SDPA:-}" ]; then
  passed=()
  for backend in default flash efficient cudnn; do
    line=$(timeout 60 "$py" -m benchmarks.gpu_diag "$backend" "${tiny[@]}" 2>&1 | tee -a "$out/gpu_diag.log" | grep '^gpu_diag ')
    if [ -n "$line" ]; then echo "$line"; else echo "gpu_diag $backend: no result (time limit or crash)"; fi
    case $line in *'"ok": true'*) [ "$backend" = default ] || passed+=("$backend") ;; esac
  done
  # flash attention (and the memory-efficient kernel) first: what Flux training normally runs on; cuDNN's
  # only if neither passed; torch's own choice (with a blocking trace of the failure) if none did
  usable=()
  for backend in "${passed[@]}"; do [ "$backend" = cudnn ] || usable+=("$backend"); done
  [ ${#usable[@]} -gt 0 ] || usable=("${passed[@]}")
  if [ ${#usable[@]} -gt 0 ]; then
    G2RPO_BENCH_SDPA=$(IFS=,; echo "${usable[*]}")
    export G2RPO_BENCH_SDPA
  else
    CUDA_LAUNCH_BLOCKING=1 timeout 60 "$py" -m benchmarks.gpu_diag default "${tiny[@]}" >>"$out/gpu_diag.log" 2>&1
    export G2RPO_BENCH_SDPA=default
  fi
  echo "attention backends for the measurements: $G2RPO_BENCH_SDPA"
fi

step flux_step "$t_flux" "$py" -m benchmarks.gpu_flux_step "${tiny[@]}" --output "$out/gpu_flux_step.json" \
  --profile "$out/profile.txt"
step train_iteration "$t_train" "$py" -m benchmarks.gpu_train_iteration "${tiny[@]}" \
  --output "$out/gpu_train_iteration.json" --workdir "${TMPDIR:-/tmp}/g2rpo-gpu-train"
[ "${G2RPO_GPU_SKIP_REWARDS:-0}" = 1 ] || step rewards "$t_rewards" "$py" -m benchmarks.gpu_rewards "${tiny[@]}" --output "$out/gpu_rewards.json"
echo "=== gpu_run: $failed step(s) failed; $((SECONDS - started)) s in all; results in $out"
exit "$failed"
