#!/usr/bin/env bash
# Install the aarch64 cross toolchain and qemu-user that tests/test_native_aarch64.py needs: it
# cross-compiles native.c (plain C and NEON dot product) and runs it under qemu-aarch64.
#
#   scripts/cross.sh install    apt-get install gcc-aarch64-linux-gnu (with the arm64 libc,
#                               libgomp) and qemu-user, if missing
#   scripts/cross.sh check      exit 0 if both are installed
#
# Debian 12: GCC 12.2 (aarch64-linux-gnu), QEMU 7.2. Idempotent: skips what is present.
set -euo pipefail

die() { echo "cross.sh: $*" >&2; exit 2; }

have() {
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1
}

install() {
    if have; then
        echo "aarch64 cross toolchain is installed: $(aarch64-linux-gnu-gcc -dumpfullversion)," \
             "$(qemu-aarch64 --version | head -n 1)"
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then die "installing needs root (apt-get)"; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu \
        libc6-dev-arm64-cross libgomp1-arm64-cross qemu-user >/dev/null
    have || die "apt-get finished, but aarch64-linux-gnu-gcc or qemu-aarch64 is still missing"
    echo "installed: aarch64-linux-gnu-gcc $(aarch64-linux-gnu-gcc -dumpfullversion)," \
         "$(qemu-aarch64 --version | head -n 1)"
}

case "${1:-}" in
    install) install ;;
    check) have ;;
    *) die "usage: cross.sh install | check" ;;
esac
