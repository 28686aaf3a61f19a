#!/usr/bin/env bash
# Installs the Debian packages relay builds and tests with. Idempotent: only
# packages that are missing are installed, and nothing else is touched.
# Needs root (or sudo) when something is missing; prints what it installs.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # LibTorch (CPU build on Debian; clusters point CMAKE_PREFIX_PATH at an
  # upstream LibTorch 2.x instead) and a fast BLAS: without OpenBLAS, Debian's
  # LibTorch falls back to the reference BLAS, ~30x slower for fp32 GEMM.
  libtorch-dev libopenblas0-pthread
  # c10d's Gloo process group headers
  libgloo-dev
  # wire API
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # common
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libxxhash-dev libpcre2-dev
  # the rollout store
  librocksdb-dev
  # the trainer's HTTP endpoint (Prometheus /metrics)
  libcpp-httplib-dev
  # tests (openssl makes throwaway TLS certificates for the service tests;
  # chromium loads the dashboard headless in relay_dashboard_tests)
  libgtest-dev libgmock-dev openssl chromium
  # tests: the hostile gRPC client (tests/integration/grpc_client_test.py,
  # ctest grpc_hostile_client) talks to relay-trainer from /usr/bin/python3
  # with Debian's gRPC and protobuf modules (protoc generates its messages)
  python3-grpcio python3-protobuf
  # tests: the benchmarks' plain-PyTorch reference (bench/python/relay_ref.py,
  # ctest relay_ref_selfcheck; the same interpreter)
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# node and npm run the official openai client against `relay serve`
# (ctest openai_node_client). Any node on PATH will do (a nodesource one
# included); Debian's are installed only when there is none.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
