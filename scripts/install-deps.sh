#!/usr/bin/env bash
# Installs every Debian package idemgate needs to build, test and benchmark
# (with --fuzz, also clang and its libFuzzer runtime for `make fuzz`).
# Idempotent and non-interactive: packages already installed are skipped, so a
# second run does nothing and needs no network.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libboost-system1.81-dev libboost-program-options1.81-dev
  libyaml-cpp-dev libssl-dev librocksdb-dev libhiredis-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgoogle-perftools-dev
  redis-server nginx-light wrk procps python3
)
if [ "${1:-}" = "--fuzz" ]; then
  PACKAGES+=(clang libclang-rt-14-dev)
elif [ $# -gt 0 ]; then
  echo "usage: install-deps.sh [--fuzz]" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The nginx and redis packages start system services on install; idemgate's
# tests and benchmarks start their own on free ports, so stop the system ones.
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  $SUDO systemctl disable --now nginx redis-server >/dev/null 2>&1 || true
fi
echo "install-deps: done"
