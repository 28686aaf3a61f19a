#!/usr/bin/env bash
# Builds relay against LibTorch 2.x and runs its tests, on a machine whose
# own LibTorch is Debian bookworm's 1.13: inside a Debian trixie chroot,
# whose libtorch-dev is 2.6 (CPU) and whose compiler is g++ 14. The code
# that only 2.x compiles (model.attn_implementation: sdpa, and every
# `TORCH_VERSION_MAJOR` branch) is compiled and run here, on the CPU, before
# a GPU session needs it; CUDA stays off (docs/gpu.md covers the GPU).
#
#   scripts/libtorch2.sh                 # the unit tests (ctest -L unit)
#   scripts/libtorch2.sh --all           # every test, as scripts/test.sh runs them
#   scripts/libtorch2.sh -R model        # any ctest arguments instead
#   scripts/libtorch2.sh --build-only    # configure and build, no tests
#
# Needs root, debootstrap (installed from the archive when missing) and
# Debian's archive. The first run makes the chroot (5-10 minutes) and
# installs relay's packages there with scripts/setup.sh; later runs reuse
# both, and the build directory and ccache inside it. The working tree is
# mounted read-only at its own path; nothing outside the chroot is written.
#   RELAY_LT2_ROOT    the chroot (default: /opt/relay-trixie)
#   RELAY_LT2_SUITE   the Debian suite (default: trixie)
#   JOBS              parallel build/test jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

root=${RELAY_LT2_ROOT:-/opt/relay-trixie}
suite=${RELAY_LT2_SUITE:-trixie}
jobs=${JOBS:-$(nproc)}
build_only=0
all=0
ctest_args=()
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    --all) all=1 ;;
    -h | --help)
      sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) ctest_args+=("$arg") ;;
  esac
done
if [ "$all" -eq 0 ] && [ ${#ctest_args[@]} -eq 0 ]; then ctest_args=(-L unit); fi

if [ "$(id -u)" -ne 0 ]; then
  echo "libtorch2: needs root (chroot, mount); run it as root" >&2
  exit 1
fi

# The chroot is made under a temporary name and renamed when complete, so
# an interrupted first run leaves nothing that a later run would take for
# a working one.
if [ ! -x "$root/usr/bin/apt-get" ]; then
  if ! command -v debootstrap >/dev/null; then
    echo "libtorch2: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  partial="$root.partial"
  rm -rf --one-file-system "$partial"
  echo "libtorch2: making a Debian $suite chroot in $root (debootstrap, several minutes)"
  if ! debootstrap --variant=minbase --include=ca-certificates "$suite" "$partial" \
    http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1; then
    echo "libtorch2: debootstrap $suite failed; its log: $root.debootstrap.log" >&2
    exit 1
  fi
  mv "$partial" "$root"
fi

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" || true
  done
}
trap cleanup EXIT
mount_into() {  # mount_into TARGET MOUNT-ARGS...
  local target=$1
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}
mount_into "$root/proc" -t proc proc
mount_into "$root/dev" --bind /dev
for sub in /dev/shm /dev/pts; do
  if mountpoint -q "$sub"; then mount_into "$root$sub" --bind "$sub"; fi
done
# The tree at the same path as here, so that the tests find ../shared (the
# tokenizer parity data) where they look for it.
mount_into "$root$repo" --bind "$repo"
mount -o remount,bind,ro "$root$repo"
shared=$(dirname "$repo")/shared
if [ -d "$shared" ]; then
  mount_into "$root$shared" --bind "$shared"
  mount -o remount,bind,ro "$root$shared"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host's own certificate authorities (a TLS-intercepting proxy it
# trusts, which npm then meets inside too: ctest openai_node_client).
mkdir -p "$root/usr/local/share/ca-certificates"
find /usr/local/share/ca-certificates -maxdepth 1 -name '*.crt' \
  -exec cp {} "$root/usr/local/share/ca-certificates/" \;

# Inside: relay's own set-up (the same package list as here), build.sh's
# configuration, then ctest. HOME=/root keeps ccache's cache in the chroot.
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  JOBS="$jobs" BUILD_ONLY="$build_only" REPO="$repo" \
  NODE_EXTRA_CA_CERTS="${NODE_EXTRA_CA_CERTS:-}" bash -s -- "${ctest_args[@]}" <<'INSIDE'
set -euo pipefail
cd "$REPO"
update-ca-certificates >/dev/null
[ -n "$NODE_EXTRA_CA_CERTS" ] || unset NODE_EXTRA_CA_CERTS
./scripts/setup.sh
BUILD_DIR=/build ./scripts/build.sh
version=$(awk '/^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) / {v = v (v ? "." : "") $3} END {print v}' \
  /usr/include/torch/csrc/api/include/torch/version.h)
echo "libtorch2: built against LibTorch $version with $(g++ --version | head -1)"
[ "$BUILD_ONLY" = 1 ] && exit 0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --test-dir /build -j "$JOBS" --output-on-failure --timeout 300 "$@"
INSIDE
