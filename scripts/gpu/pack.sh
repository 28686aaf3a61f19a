#!/usr/bin/env bash
# Packs the GPU kit: the Debian (bookworm) packages relay builds and runs
# with, minus LibTorch, CUDA and Python, as one archive that travels to a
# lent GPU machine with the working tree (docs/gpu.md). Runs HERE, on a
# Debian bookworm machine that reaches Debian's archive; needs no root
# unless patchelf is missing.
#
#   scripts/gpu/pack.sh [--keep-work]
#
# Writes .gpu-kit/dist/relay-gpu-kit.tar.xz and qwen2-tokenizer.json.xz
# (git-ignored; the device call carries .gpu-kit/dist). Work files: .gpu-kit/debs (the downloaded .debs,
# reused by the next run) and .gpu-kit/root (the unpacked tree, removed at
# the end unless --keep-work). Idempotent: a second run downloads only
# what changed and rebuilds the same archive.
#
# What goes in: the dependency closure of the packages below, stopping at
# what a GPU machine's image surely has (libc, libstdc++/libgcc, the base
# system: the `base` list). What is stripped: docs, man pages, sources,
# static libraries that have a shared twin, binaries other than protoc,
# grpc_cpp_plugin and pkgconf. libgloo-dev contributes its headers only
# (opt/gloo/include), a fallback for a LibTorch without its own: relay
# never links a second Gloo next to LibTorch's.
set -euo pipefail
cd "$(dirname "$0")/../.."

keep_work=0
case "${1:-}" in
  --keep-work) keep_work=1 ;;
  "") ;;
  -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "pack.sh: unknown option $1" >&2; exit 2 ;;
esac

kit=.gpu-kit
debs=$kit/debs
root=$kit/root
dist=$kit/dist
archive=$dist/relay-gpu-kit.tar.xz
limit_mib=64

# What relay's CMake finds (cmake/Dependencies.cmake) and the tools the
# build runs: protoc, grpc_cpp_plugin, pkg-config.
roots=(
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libxxhash-dev libpcre2-dev librocksdb-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev
  pkgconf pkgconf-bin
)
# Headers only, never followed: see above.
headers_only=(libgloo-dev)
# On every Linux image or irrelevant to a build: neither carried nor followed.
base=(
  libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libgcc-s1 gcc-12-base
  libstdc++6 libstdc++-12-dev libgcc-12-dev debconf cdebconf dpkg tar install-info adduser
  passwd readline-common libreadline8 libtinfo6 libselinux1 libpam0g libpam-modules
  libpam-modules-bin libpam-runtime libaudit1 libaudit-common libacl1 libcap-ng0 libdb5.3
  libsemanage2 libsemanage-common libsepol2 libmd0 liblzma5 libtirpc3 libtirpc-dev
  libtirpc-common libnsl2 libnsl-dev rpcsvc-proto libkrb5-3 libkrb5support0 libk5crypto3
  libkeyutils1 libgssapi-krb5-2 libcom-err2 libnewt0.52 libslang2 libtextwrap1
  libdebian-installer4 googletest catch2
)

say() { echo "pack.sh: $*" >&2; }
die() { say "$*"; exit 1; }

for tool in apt-get apt-cache dpkg-deb objdump; do
  command -v "$tool" >/dev/null || die "needs $tool: run it on Debian bookworm (the kit is Debian's packages)"
done
if ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  say "warning: this is not Debian bookworm; the kit must match the libraries relay is tested with"
fi
if ! command -v patchelf >/dev/null; then
  say "installing patchelf (sets the kit's tools' library path)"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    patchelf >/dev/null || die "cannot install patchelf (apt-get install patchelf)"
fi
command -v xz >/dev/null || die "needs xz (apt-get install xz-utils)"

in_list() {
  local x=$1
  shift
  local y
  for y in "$@"; do [ "$x" = "$y" ] && return 0; done
  return 1
}

# ---- the closure: breadth first over Depends and Pre-Depends, one level a
# call (the first of alternatives; virtual packages are skipped: none of
# relay's needs is only virtual) ----
declare -A seen=()
packages=()
frontier=("${roots[@]}")
while [ ${#frontier[@]} -gt 0 ]; do
  level=()
  for p in "${frontier[@]}"; do
    [ -n "${seen[$p]:-}" ] && continue
    seen[$p]=1
    in_list "$p" "${base[@]}" && continue
    level+=("$p")
  done
  [ ${#level[@]} -gt 0 ] || break
  known=$(apt-cache show --no-all-versions "${level[@]}" 2>/dev/null | sed -n 's/^Package: //p' |
          sort -u)
  for p in "${level[@]}"; do
    grep -qx -- "$p" <<<"$known" ||
      die "apt-cache does not know $p: run 'apt-get update' (needs Debian's archive)"
  done
  packages+=("${level[@]}")
  # "  Depends: x", "  PreDepends: x", "  |Depends: x" (an alternative follows)
  mapfile -t frontier < <(apt-cache depends --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances "${level[@]}" 2>/dev/null |
    awk 'alt { alt = 0; next }
         /^ *\|(Pre)?Depends:/ { print $2; alt = 1; next }
         /^ *(Pre)?Depends:/ { print $2 }' | grep -v '^<' | sort -u || true)
done
packages+=("${headers_only[@]}")
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
say "${#packages[@]} packages: ${packages[*]}"

# ---- download (only what is not here yet) ----
mkdir -p "$debs"
declare -A want=()
missing=()
# apt-get download's name: package_version_arch.deb, an epoch's ':' as %3a.
while read -r p f; do
  want[$f]=1
  [ -s "$debs/$f" ] || missing+=("$p")
done < <(apt-cache show --no-all-versions "${packages[@]}" |
         awk '/^Package:/ { p = $2 } /^Version:/ { v = $2 } /^Architecture:/ { a = $2 }
              /^$/ && p { gsub(":", "%3a", v); print p, p "_" v "_" a ".deb"; p = "" }')
[ ${#want[@]} -eq ${#packages[@]} ] || die "apt-cache show gave ${#want[@]} files for ${#packages[@]} packages"
if [ ${#missing[@]} -gt 0 ]; then
  say "downloading ${#missing[@]} packages"
  if ! (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "${missing[@]}" \
          >/tmp/relay-gpu-pack-download.log 2>&1); then
    tail -5 /tmp/relay-gpu-pack-download.log >&2
    die "apt-get download failed: Debian's archive is not reachable from here, or the package lists are stale (apt-get update). $archive was left as it was."
  fi
fi
# Old versions left by an earlier run.
for f in "$debs"/*.deb; do
  [ -n "${want[$(basename "$f")]:-}" ] || rm -f "$f"
done

# ---- unpack into one prefix tree, and strip ----
rm -rf "$root"
mkdir -p "$root"
for f in "$debs"/*.deb; do dpkg-deb -x "$f" "$root"; done
# libgloo-dev: its headers, apart, and nothing else.
mkdir -p "$root/opt/gloo/include"
mv "$root/usr/include/gloo" "$root/opt/gloo/include/gloo"
rm -rf "$root/usr/share/cmake/Gloo" "$root"/usr/lib/x86_64-linux-gnu/libgloo*
rm -rf "${root:?}/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" \
  "$root/usr/share/lintian" "$root/usr/share/bug" "$root/usr/share/locale" "$root/usr/src" \
  "$root/usr/share/aclocal" "${root:?}/etc" "$root/usr/sbin" "$root/usr/share/bash-completion"
# Debian's multiarch headers (OpenSSL's configuration) go to usr/include:
# the compiler searches include/x86_64-linux-gnu only under /usr.
if [ -d "$root/usr/include/x86_64-linux-gnu" ]; then
  (cd "$root/usr/include/x86_64-linux-gnu" && find . -type f) | while read -r h; do
    [ -e "$root/usr/include/$h" ] && die "multiarch header $h is also in usr/include"
    mkdir -p "$(dirname "$root/usr/include/$h")"
    mv "$root/usr/include/x86_64-linux-gnu/$h" "$root/usr/include/$h"
  done
  rm -rf "$root/usr/include/x86_64-linux-gnu"
fi
# relay finds RocksDB with pkg-config; its CMake package would want the
# 33 MB static library.
rm -rf "$root/usr/lib/x86_64-linux-gnu/cmake/rocksdb"
# A CMake package's find_package fails when a file its targets name is
# missing: those files stay, whatever the rules below say.
cmake_named=$(grep -rhoE '(bin/[A-Za-z0-9_+.-]+|[A-Za-z0-9_+.-]+\.a)\b' "$root" --include='*.cmake' |
              sed 's#^bin/##' | sort -u)
named() { grep -qxF -- "$(basename "$1")" <<<"$cmake_named"; }
# Binaries: protoc, grpc_cpp_plugin and pkgconf (with its pkg-config names).
find "$root/usr/bin" -mindepth 1 \( -type f -o -type l \) \
  ! -name 'protoc*' ! -name grpc_cpp_plugin ! -name pkgconf ! -name pkg-config \
  ! -name x86_64-linux-gnu-pkg-config | while read -r b; do
  named "$b" || rm -f "$b"
done
# Static libraries with a shared twin (GoogleTest has only static ones).
find "$root" -name '*.a' | while read -r a; do
  named "$a" && continue
  [ -e "${a%.a}.so" ] && rm -f "$a"
done
# pkg-config files name their prefix relative to themselves (pkgconf's
# ${pcfiledir}), so the kit works wherever it is unpacked.
find "$root" -name '*.pc' | while read -r pc; do
  # shellcheck disable=SC2016 # pkgconf expands ${pcfiledir}
  case "$pc" in
    */usr/lib/x86_64-linux-gnu/pkgconfig/*) up='${pcfiledir}/../../..' ;;
    */usr/share/pkgconfig/* | */usr/lib/pkgconfig/*) up='${pcfiledir}/../..' ;;
    *) die "unexpected pkg-config file $pc" ;;
  esac
  sed -i -E "s#^(prefix|exec_prefix|libdir|includedir)=(\"?)/usr#\1=\2$up#" "$pc"
  ! grep -Eq '^[a-z_]+="?/usr' "$pc" || die "$pc still names /usr"
done
# The tools find their libraries in the kit wherever it is unpacked; DT_RPATH
# (not RUNPATH) so that their libraries' own dependencies are found too.
for b in "$root"/usr/bin/*; do
  [ -L "$b" ] && continue
  if [ "$(od -An -c -N4 "$b" | tr -d ' ')" = '177ELF' ]; then
    # shellcheck disable=SC2016 # the loader expands it
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu:$ORIGIN/../../lib/x86_64-linux-gnu' "$b"
  fi
done
# What the kit holds, for docs/gpu.md and for build.sh's report.
mkdir -p "$root/usr/share/relay-gpu-kit"
for f in "$debs"/*.deb; do
  # shellcheck disable=SC2016 # dpkg-deb's format
  dpkg-deb --showformat='${Package} ${Version}\n' -W "$f"
done | sort >"$root/usr/share/relay-gpu-kit/packages.txt"

# ---- check: every library the kit's ELF files need is in the kit or on a
# base system ----
declare -A have=()
while read -r so; do have[$(basename "$so")]=1; done < <(find "$root" -name '*.so*')
declare -A assumed=()
while read -r elf; do
  while read -r need; do
    [ -n "${have[$need]:-}" ] || assumed[$need]=1
  done < <(objdump -p "$elf" 2>/dev/null | awk '$1 == "NEEDED" { print $2 }')
done < <(find "$root" -type f \( -name '*.so*' -o -path '*/usr/bin/*' \))
printf '%s\n' "${!assumed[@]}" | sort >"$root/usr/share/relay-gpu-kit/assumed-on-the-image.txt"
expected='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|liblzma)\.so'
unexpected=$(grep -Ev "$expected" "$root/usr/share/relay-gpu-kit/assumed-on-the-image.txt" || true)
[ -z "$unexpected" ] || die "the kit's libraries need these, which it lacks: ${unexpected//$'\n'/ }"

# The newest glibc symbol version the kit needs (the image must have it).
find "$root" -type f \( -name '*.so*' -o -path '*/usr/bin/*' \) -exec objdump -T {} + 2>/dev/null |
  grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 >"$root/usr/share/relay-gpu-kit/glibc.txt"

# ---- the archive ----
mkdir -p "$dist"
tmp=$archive.tmp
# Fixed owner, order and times: the same packages give the same archive.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf - . |
  xz -T0 "${RELAY_GPU_PACK_XZ:--9}" >"$tmp"
mv "$tmp" "$archive"
[ "$keep_work" = 1 ] || rm -rf "$root"

# The Qwen2 vocabulary, for check.sh's yardstick (scripts/models/qwen2.5-0.5b.sh
# writes the model directory there; ../shared does not travel with the tree).
qwen2_tokenizer=../shared/testdata/tokenizer_parity/qwen2/tokenizer.json
if [ -f "$qwen2_tokenizer" ]; then
  xz -T0 -9 -c "$qwen2_tokenizer" >"$dist/qwen2-tokenizer.json.xz"
else
  echo "pack.sh: no $qwen2_tokenizer: check.sh's yardstick step will have no tokenizer" >&2
  rm -f "$dist/qwen2-tokenizer.json.xz"
fi

kit_bytes=$(( $(stat -c %s "$archive") + $(stat -c %s "$dist/qwen2-tokenizer.json.xz" 2>/dev/null || echo 0) ))
tree_bytes=$(git ls-files -z | xargs -0 stat -c %s | awk '{ s += $1 } END { print s + 0 }')
untracked_bytes=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s |
                  awk '{ s += $1 } END { print s + 0 }')
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
total=$((kit_bytes + tree_bytes + untracked_bytes))
echo "kit: $archive, $(mib "$kit_bytes") MiB (${#packages[@]} packages)"
echo "with the working tree ($(mib "$tree_bytes") MiB tracked, $(mib "$untracked_bytes") MiB untracked): $(mib "$total") MiB of the device's $limit_mib MiB"
[ "$total" -lt $((limit_mib * 1048576 * 9 / 10)) ] ||
  die "over 90% of the $limit_mib MiB a device call carries: strip more"
