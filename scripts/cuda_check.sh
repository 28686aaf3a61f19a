#!/usr/bin/env bash
# Compiles relay's CUDA code without a GPU. Every translation unit holding
# code that only a CUDA build compiles (#ifdef RELAY_WITH_CUDA) is compiled
# (-fsyntax-only -Werror, build.sh's warnings) against Debian trixie's CUDA
# LibTorch (libtorch-cuda-dev 2.6, CUDA 12.4 headers, NCCL, Gloo) in a
# chroot, with RELAY_WITH_CUDA defined. A GPU session's few minutes should
# not go on compile errors; what a compile cannot show (linking, running)
# still needs the GPU (docs/gpu.md).
#
#   scripts/cuda_check.sh            # every such file
#   scripts/cuda_check.sh FILE...    # these (paths from the repository root)
#
# Needs root, debootstrap (installed from the archive when missing) and
# Debian's archive. The first run makes the chroot (a few minutes; 10 GB,
# the CUDA headers come with their libraries); later runs reuse it and take
# about 10 s a file. Two dependencies of libtorch-cuda that a compile does not
# use are replaced by empty stand-in packages: nvidia-cudnn (an installer
# that downloads cuDNN from NVIDIA, which this machine cannot reach) and
# libcuda1 (the driver's library). The working tree is mounted read-only;
# the protobuf and gRPC code is generated inside the chroot.
#   RELAY_CUDA_ROOT   the chroot (default: /opt/relay-trixie-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
root=${RELAY_CUDA_ROOT:-/opt/relay-trixie-cuda}

case "${1:-}" in
  -h | --help)
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "cuda_check: needs root (chroot, mount); run it as root" >&2
  exit 1
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(grep -rl --include='*.cc' 'RELAY_WITH_CUDA' src tests bench | sort)
fi
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "cuda_check: $f: no such file" >&2; exit 1; }
done

packages=(g++ libtorch-cuda-dev nvidia-cuda-dev libnccl-dev libgloo-cuda-dev libabsl-dev
  libspdlog-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev)

# Made under a temporary name and renamed when every package is in, so an
# interrupted first run leaves nothing a later run would take for whole.
if [ ! -e "$root/.relay-cuda-ready" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "cuda_check: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  partial="$root.partial"
  rm -rf --one-file-system "$partial"
  echo "cuda_check: making a Debian trixie chroot with the CUDA LibTorch in $root (a few minutes, 10 GB)"
  log="$root.setup.log"
  if ! debootstrap --variant=minbase --components=main,contrib,non-free trixie "$partial" \
    http://deb.debian.org/debian >"$log" 2>&1; then
    echo "cuda_check: debootstrap failed; its log: $log" >&2
    exit 1
  fi
  stand_ins=$(mktemp -d)
  for pkg in "nvidia-cudnn 9.0.0.312~cuda12" "libcuda1 550.163.01-2"; do
    read -r name version <<<"$pkg"
    mkdir -p "$stand_ins/$name/DEBIAN"
    printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: relay\nDescription: %s\n' \
      "$name" "$version" "empty stand-in for a compile-only chroot (scripts/cuda_check.sh)" \
      >"$stand_ins/$name/DEBIAN/control"
    dpkg-deb --build "$stand_ins/$name" "$partial/tmp/$name.deb" >/dev/null
  done
  rm -rf "$stand_ins"
  mount -t proc proc "$partial/proc"
  trap 'umount "$partial/proc" 2>/dev/null || true' EXIT
  if ! { chroot "$partial" dpkg -i /tmp/nvidia-cudnn.deb /tmp/libcuda1.deb &&
    chroot "$partial" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive chroot "$partial" apt-get install -y -qq \
      --no-install-recommends "${packages[@]}"; } >>"$log" 2>&1; then
    echo "cuda_check: installing the packages failed; its log: $log" >&2
    exit 1
  fi
  umount "$partial/proc"
  trap - EXIT
  touch "$partial/.relay-cuda-ready"
  mv "$partial" "$root"
fi

mkdir -p "$root$repo"
mount --bind "$repo" "$root$repo"
trap 'umount "$root$repo" 2>/dev/null || umount -l "$root$repo"' EXIT
mount -o remount,bind,ro "$root$repo"

chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin REPO="$repo" \
  bash -s -- "${files[@]}" <<'INSIDE'
set -uo pipefail
cd "$REPO"
gen=$(mktemp -d)
for p in proto/relay/v1/*.proto; do
  protoc -Iproto --cpp_out="$gen" --grpc_out="$gen" \
    --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin "$p" || exit 1
done
version=$(awk '/^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) / {v = v (v ? "." : "") $3} END {print v}' \
  /usr/include/torch/csrc/api/include/torch/version.h)
echo "cuda_check: LibTorch $version (CUDA), $(g++ --version | head -1)"
failed=0
for f in "$@"; do
  if g++ -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Werror \
    -D_GLIBCXX_USE_CXX11_ABI=1 -DRELAY_WITH_CUDA=1 -DUSE_C10D_GLOO -DUSE_C10D_NCCL \
    -DUSE_DISTRIBUTED -Isrc -Iinclude -Itests -I"$gen" \
    -isystem /usr/include/torch/csrc/api/include "$f" 2>"$gen/err"; then
    echo "  ok    $f"
  else
    echo "  FAIL  $f"
    head -40 "$gen/err" | sed 's/^/        /'
    failed=1
  fi
done
rm -rf "$gen"
exit $failed
INSIDE
