#!/usr/bin/env bash
# The main job on the embedded default model (set-up included): compress the shipped sample text,
# decompress it, verify, and print the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/seqkv demo "$@"
