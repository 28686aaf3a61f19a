#!/usr/bin/env bash
# Builds relay on a lent GPU machine (docs/gpu.md): the kit from
# scripts/gpu/pack.sh for gRPC, protobuf, RocksDB and the rest, the machine's
# PyTorch for LibTorch (CUDA detected from it by cmake/Dependencies.cmake).
# Runs THERE, from the repository root, after a device call carried
# .gpu-kit/dist; a second run reuses the unpacked kit and the build.
#
#   scripts/gpu/build.sh [--simulate] [--all] [--build-dir DIR] [--prefix DIR]
#                        [--kit FILE] [--jobs N]
#
#   --simulate   on a Debian bookworm machine without a GPU: build against
#                Debian's CPU LibTorch with every file of the kit's packages
#                hidden from /usr (a mount namespace, root only), so that
#                only the kit can provide them (what it proves: docs/gpu.md)
#   --all        build every target (default: the binaries, the unit test
#                programs, rollout_bench and weight_sync_bench: what
#                scripts/gpu/check.sh runs)
#   --build-dir  default build-gpu (build-gpu-sim with --simulate)
#   --prefix     where the kit is unpacked (default /tmp/relay-deps)
#   --kit        default .gpu-kit/dist/relay-gpu-kit.tar.xz
#   --jobs       default: every core
#
# Environment: RELAY_GPU_CMAKE_ARGS, extra cmake arguments (split at spaces);
# RELAY_GPU_TARGETS, the ninja targets to build instead of the default set
# (split at spaces; e.g. "relay relay-trainer relay-rollout relay_cuda_tests"
# when device time is short); TORCH_CUDA_ARCH_LIST (default 9.0, Hopper). Writes BUILD_DIR/build.log
# (and a copy under $OUT when the device tool set it) and BUILD_DIR/gpu-env.sh,
# which check.sh reads.
set -euo pipefail
# One block, read whole before it runs: editing this file meanwhile is safe.
{
cd "$(dirname "$0")/../.."

simulate=0
all=0
build_dir=""
prefix=/tmp/relay-deps
kit=.gpu-kit/dist/relay-gpu-kit.tar.xz
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --simulate) simulate=1 ;;
    --all) all=1 ;;
    --build-dir) build_dir=$2; shift ;;
    --prefix) prefix=$2; shift ;;
    --kit) kit=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$build_dir" ] || build_dir=$([ "$simulate" = 1 ] && echo build-gpu-sim || echo build-gpu)

say() { echo "build.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# ---- --simulate: re-run this script in a mount namespace where /usr lacks
# every file of the kit's packages except their shared libraries' runtime
# files (the GPU image has some of those, e.g. zlib and OpenSSL; the check
# after the build shows that relay's binaries load the kit's). ----
if [ "$simulate" = 1 ] && [ -z "${RELAY_GPU_SIM_INSIDE:-}" ]; then
  [ "$(id -u)" -eq 0 ] || die "--simulate needs root (a mount namespace and an overlay of /usr)"
  command -v unshare >/dev/null || die "--simulate needs unshare (util-linux)"
  [ -s "$kit" ] || die "no kit at $kit: run scripts/gpu/pack.sh first"
  wh=$(mktemp -d /tmp/relay-gpu-sim.XXXXXX)
  trap 'rm -rf "$wh"' EXIT
  mkdir -p "$wh/hide" "$wh/usr"
  # The packages the kit holds, as dpkg knows them here.
  tar -xJOf "$kit" ./usr/share/relay-gpu-kit/packages.txt | awk '{ print $1 }' >"$wh/packages"
  # Whiteouts (0:0 character devices) for every file and link of the
  # installed ones, but runtime libraries (libfoo.so.N...).
  hidden=$(python3 - "$wh/hide" "$wh/packages" <<'PY'
import os, subprocess, sys
hide, listing = sys.argv[1], sys.argv[2]
count = 0
for pkg in open(listing).read().split():
    st = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    if "install ok installed" not in st.stdout:
        continue
    files = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout.split("\n")
    for f in files:
        if f.startswith(("/lib/", "/bin/", "/sbin/")):
            f = "/usr" + f
        if not f.startswith("/usr/") or not (os.path.islink(f) or os.path.isfile(f)):
            continue
        name = os.path.basename(f)
        if ".so." in name and name.split(".so.")[1][:1].isdigit():
            continue
        target = hide + f[len("/usr"):]
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.mknod(target, 0o600 | 0o020000, os.makedev(0, 0))
            count += 1
print(count)
PY
)
  say "simulation: $hidden files of $(wc -l <"$wh/packages") packages hidden from /usr"
  [ "$hidden" -gt 1000 ] || die "only $hidden files hidden: is this the machine the kit was packed on?"
  args=(--simulate --build-dir "$build_dir" --prefix "$prefix" --kit "$kit" --jobs "$jobs")
  [ "$all" = 1 ] && args+=(--all)
  # shellcheck disable=SC2016 # expanded by the inner bash
  RELAY_GPU_SIM_INSIDE=1 unshare -m bash -c '
    set -e
    mount -t overlay relay-sim -o "lowerdir=$1/hide:/usr" "$1/usr"
    mount --bind "$1/usr" /usr
    shift
    exec bash scripts/gpu/build.sh "$@"' bash "$wh" "${args[@]}"
  exit $?
fi

mkdir -p "$build_dir"
log=$(cd "$build_dir" && pwd)/build.log
: >"$log"
# Everything below goes to the log too; $OUT gets a copy at the end, even
# on failure.
exec > >(tee -a "$log") 2>&1
# shellcheck disable=SC2317 # the EXIT trap runs it
copy_log() {
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$log" "$OUT/build.log"; fi
}
trap copy_log EXIT
start=$(date +%s)
step() { echo "== $(date -u +%H:%M:%S) [$(($(date +%s) - start)) s] $*"; }

# ---- the machine ----
step "machine"
uname -srm
if [ -r /etc/os-release ]; then grep -E '^(PRETTY_NAME)=' /etc/os-release; fi
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
echo "glibc $glibc, $(nproc) cores"
for tool in cmake ninja tar xz; do
  command -v "$tool" >/dev/null || die "no $tool on this machine: the build needs it"
done
cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
[ -n "$cxx" ] || die "no C++ compiler (c++ or g++) on this machine"
cmake --version | sed -n 1p
"$cxx" --version | sed -n 1p

# ---- the kit ----
step "kit"
[ -s "$kit" ] || die "no kit at $kit: run scripts/gpu/pack.sh on the Debian machine and carry .gpu-kit/dist in the device call (docs/gpu.md)"
stamp="$(stat -c '%s %Y' "$kit") $(realpath "$kit")"
if [ "$(cat "$prefix/.relay-kit" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  tar -xJf "$kit" -C "$prefix"
  echo "$stamp" >"$prefix/.relay-kit"
  echo "unpacked $kit into $prefix"
else
  echo "reusing $prefix"
fi
need_glibc=$(sed 's/GLIBC_//' "$prefix/usr/share/relay-gpu-kit/glibc.txt")
if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$need_glibc" "$glibc" | sort -V | sed -n 1p)" != "$need_glibc" ]; then
  die "the kit's libraries need glibc $need_glibc, this machine has $glibc"
fi
echo "$(wc -l <"$prefix/usr/share/relay-gpu-kit/packages.txt") Debian packages; they need glibc >= $need_glibc"
kit_lib=$prefix/usr/lib/x86_64-linux-gnu

# ---- LibTorch ----
step "LibTorch"
cmake_args=()
rpath_link=()
torch_lib=""
nvidia_libs=""
cuda_root=""
if [ "$simulate" = 1 ]; then
  torch_cmake=/usr/lib/x86_64-linux-gnu/cmake/Torch
  [ -d "$torch_cmake" ] || die "--simulate builds against Debian's libtorch-dev: not installed"
  echo "simulation: Debian's LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev) (CPU)"
  cmake_args+=(-DTorch_DIR="$torch_cmake" -DCMAKE_BUILD_TYPE=Release)
else
  command -v python3 >/dev/null || die "no python3: the machine's PyTorch gives LibTorch"
  # One probe of the PyTorch install: what CMake and the linker need.
  probe=$(python3 - <<'PY'
import glob, os, sys
try:
    import torch
except Exception as e:  # noqa: BLE001
    print("error=cannot import torch: %s" % e)
    sys.exit(0)
site = os.path.dirname(os.path.dirname(torch.__file__))
print("version=%s" % torch.__version__)
print("cuda=%s" % (torch.version.cuda or ""))
print("abi=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("cmake=%s" % torch.utils.cmake_prefix_path)
print("lib=%s" % os.path.join(os.path.dirname(torch.__file__), "lib"))
print("include=%s" % os.path.join(os.path.dirname(torch.__file__), "include"))
libs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "**", "lib*.so*"), recursive=True)})
print("nvidia_libs=%s" % ":".join(libs))
def find(name):
    hits = sorted(glob.glob(os.path.join(site, "nvidia", "**", name), recursive=True))
    return hits[0] if hits else ""
for key, name in (("nccl_h", "nccl.h"), ("cudnn_h", "cudnn.h"), ("cudnn_so", "libcudnn.so*"),
                  ("cusparselt_h", "cusparseLt.h"), ("cusparselt_so", "libcusparseLt.so*"),
                  ("cudss_h", "cudss.h"), ("cudss_so", "libcudss.so*")):
    print("%s=%s" % (key, find(name)))
PY
)
  echo "$probe"
  get() { sed -n "s/^$1=//p" <<<"$probe"; }
  [ -z "$(get error)" ] || die "python3: $(get error)"
  [ -n "$(get cuda)" ] || die "PyTorch $(get version) has no CUDA (torch.version.cuda is None): a CPU build"
  [ "$(get abi)" = 1 ] ||
    die "PyTorch $(get version) uses the old C++ ABI (torch._C._GLIBCXX_USE_CXX11_ABI = 0): relay links Debian's libraries, built with the C++11 ABI. Use a cxx11-ABI LibTorch (docs/cluster.md)."
  torch_lib=$(get lib)
  nvidia_libs=$(get nvidia_libs)
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    die "no nvcc: Caffe2's CMake config (find_package(Torch)) needs the CUDA toolkit"
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  nvcc --version | tail -2
  cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  export CUDA_HOME=${CUDA_HOME:-$cuda_root}
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  arch=${TORCH_CUDA_ARCH_LIST%%[ ;]*}
  cmake_args+=(-DCMAKE_PREFIX_PATH="$(get cmake);$prefix/usr" -DCMAKE_BUILD_TYPE=Release
               -DCUDAToolkit_ROOT="$cuda_root" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root"
               -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="${arch//./}")
  # The pip wheels' CUDA libraries (cuDNN, cuSPARSELt, cuDSS) for the
  # checks in Caffe2's CMake config, when they are installed.
  for lib in cudnn:CUDNN cusparselt:CUSPARSELT cudss:CUDSS; do
    h=$(get "${lib%%:*}_h")
    so=$(get "${lib%%:*}_so")
    if [ -n "$h" ] && [ -n "$so" ]; then
      cmake_args+=(-D"${lib##*:}_INCLUDE_PATH=$(dirname "$h")" -D"${lib##*:}_LIBRARY_PATH=$so")
    fi
  done
  # ProcessGroupNCCL.hpp includes <nccl.h>, which the wheel keeps in nvidia-nccl.
  nccl_h=$(get nccl_h)
  if [ -n "$nccl_h" ]; then
    extra_include="-isystem $(dirname "$nccl_h")"
  elif [ -e "$cuda_root/include/nccl.h" ] || [ -e /usr/include/nccl.h ]; then
    extra_include=""
  else
    die "no nccl.h (neither in the wheel's nvidia-nccl package nor in the CUDA toolkit): relay's CUDA build includes c10d's NCCL process group"
  fi
  torch_include=$(get include)
  # Gloo headers: LibTorch's own when it ships them (it links its own Gloo),
  # else the kit's Debian ones, searched last (-idirafter below).
  if [ -e "$torch_include/gloo/algorithm.h" ]; then
    echo "gloo headers: $torch_include/gloo (the wheel's)"
  else
    echo "gloo headers: none in the wheel; the kit's (Debian's gloo 2022-05) as a fallback"
  fi
  # Headers of the same library in both: relay must compile against the
  # kit's (it links the kit's); Dependencies.cmake puts fmt's first.
  for d in "$prefix"/usr/include/*/; do
    d=$(basename "$d")
    [ -e "$torch_include/$d" ] && echo "note: both LibTorch and the kit have include/$d"
  done
  rpath_link=("$torch_lib")
  IFS=: read -r -a more <<<"$nvidia_libs"
  rpath_link+=("${more[@]}")
fi

# ---- configure ----
step "configure $build_dir"
# -include cstdint: Debian's headers were compiled with GCC 12, whose
# standard headers included <cstdint> in more places than GCC 13 and later.
cxx_flags="-include cstdint -idirafter $prefix/opt/gloo/include ${extra_include:-}"
# The binaries' RPATH: the kit's libraries and LibTorch's, and nothing else
# (CMake's own build RPATH, which would add the CUDA toolkit's directory, is
# off). DT_RPATH rather than RUNPATH, so that the dependencies of the kit's
# libraries are found in the kit too (RUNPATH is not inherited). The CUDA
# libraries come from LD_LIBRARY_PATH (gpu-env.sh): the wheel's first.
ldflags="-Wl,--disable-new-dtags -Wl,-rpath,$kit_lib${torch_lib:+:$torch_lib}"
for d in "${rpath_link[@]}"; do ldflags+=" -Wl,-rpath-link,$d"; done
cmake_args+=(-G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DRELAY_WERROR=OFF -DCMAKE_SKIP_BUILD_RPATH=ON
             -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
             -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$ldflags"
             -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
if [ "$simulate" = 1 ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr")
fi
# Only the kit's pkg-config files.
export PKG_CONFIG_LIBDIR=$kit_lib/pkgconfig:$prefix/usr/share/pkgconfig
export PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
if [ -n "${RELAY_GPU_CMAKE_ARGS:-}" ]; then
  read -r -a user_args <<<"$RELAY_GPU_CMAKE_ARGS"
  cmake_args+=("${user_args[@]}")
fi
echo "cmake ${cmake_args[*]}"
cmake -S . -B "$build_dir" "${cmake_args[@]}" || die "cmake failed (log: $log)"
if [ "$simulate" = 0 ] && ! grep -q 'CUDA: ON' "$log"; then
  die "cmake/Dependencies.cmake did not detect CUDA in this LibTorch (no torch_cuda target)"
fi

# ---- build ----
targets=()
if [ -n "${RELAY_GPU_TARGETS:-}" ] && [ "$all" = 0 ]; then
  read -r -a targets <<<"$RELAY_GPU_TARGETS"
elif [ "$all" = 0 ]; then
  targets=(relay relay-trainer relay-rollout rollout_bench weight_sync_bench)
  while read -r t; do targets+=("$t"); done < <(
    ninja -C "$build_dir" -t targets all 2>/dev/null |
      sed -n 's/^\(relay_[a-z_]*_tests\): phony$/\1/p' |
      grep -Ev '^relay_(integration|process|service|dashboard)_tests$' | sort -u)
fi
step "build ${targets[*]:-all} with $jobs jobs"
# -k 0: every compile error of a first build against a new LibTorch at once.
ninja -C "$build_dir" -j "$jobs" -k 0 "${targets[@]}" || die "the build failed (log: $log)"
step "built"

# ---- which libraries the binaries load ----
step "libraries of relay-trainer"
# Runtime: the kit's libraries and LibTorch from the binaries' RPATH; the
# CUDA libraries from LD_LIBRARY_PATH, the wheel's before the toolkit's (the
# ones LibTorch was built and tested with).
runtime_path=${torch_lib:+$torch_lib:}${nvidia_libs}${cuda_root:+:$cuda_root/lib64}
ldd_out=$(LD_LIBRARY_PATH=$runtime_path ldd "$build_dir/src/relay-trainer")
echo "$ldd_out"
! grep -q 'not found' <<<"$ldd_out" || die "relay-trainer: libraries not found (above)"
kit_names=$(find "$kit_lib" -maxdepth 1 -name '*.so.*' -printf '%f\n' | sort -u)
wrong=$(awk '$2 == "=>" { print $1, $3 }' <<<"$ldd_out" |
        while read -r name path; do
          if grep -qx -- "$name" <<<"$kit_names" && [[ "$path" != "$prefix"/* ]]; then
            echo "$name from $path"
          fi
        done)
[ -z "$wrong" ] || die "relay-trainer loads these from outside the kit: $wrong"
echo "every library the kit holds comes from $prefix"
# The C++ runtime: relay's binaries must load libstdc++.so like LibTorch
# does. On the first GPU machine (2026-11-27) they did not: the image's g++
# (/opt/gcc/bin/g++, a wrapper of g++-real) linked it in statically, the
# executables exported their own copy (libtorch bound __cxa_guard_acquire to
# them), and tests using std::filesystem crashed (docs/gpu.md). Say so here.
if readelf -d "$build_dir/src/relay-trainer" | grep -q 'NEEDED.*libstdc++'; then
  echo "relay-trainer loads libstdc++.so (shared C++ runtime)"
else
  echo "WARNING: relay-trainer does not load libstdc++.so: $cxx links the C++ runtime statically"
  echo "  ($(readlink -f "$(command -v "$cxx")"); its link line:"
  "$cxx" -### -x c++ /dev/null -o /dev/null 2>&1 | grep -o -- '-static-lib[a-z+]*\|-Bstatic\|[^ ]*stdc++[^ ]*' | sort -u | tr '\n' ' '
  echo ")"
  echo "  std::filesystem calls may then bind to LibTorch's copies; build with a g++ that links it"
  echo "  shared (CXX=/usr/bin/g++-13, if the image has one) and compare the unit suite"
fi

# ---- for check.sh ----
cat >"$build_dir/gpu-env.sh" <<EOF
# Written by scripts/gpu/build.sh; sourced by scripts/gpu/check.sh.
export RELAY_GPU_BUILD_DIR='$build_dir'
export RELAY_GPU_SIMULATED=$simulate
export RELAY_GPU_KIT_PREFIX='$prefix'
export LD_LIBRARY_PATH='$runtime_path'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF
step "done: $build_dir (log $log)"
exit
}
