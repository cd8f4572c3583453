#!/bin/sh
# Builds the project's CUDA application suite (apps/*.cu) with NVIDIA's pinned CUDA 13.0 compiler.
#
#   1. The toolchain: the CUDA 13.0 wheels from PyPI, every one pinned (the GPU machine's driver,
#      580, is CUDA 13.0 and cannot JIT the PTX of a newer nvcc), in a Python venv under
#      target/cuda-toolchain (override: VGPU_CUDA_TOOLCHAIN); installed once, then reused (a stamp
#      over the pinned list). Installs python3-venv, g++ and binutils with apt-get when it lacks
#      them and runs as root.
#   2. The programs, with nvcc's DEFAULT flags for what matters here: compressed PTX (CUDA 13's
#      default), `-cudart shared`, PTX only, for compute_80 and compute_90. One executable per
#      program in target/apps (override: VGPU_APPS_OUT): X.cu a runtime program; X.kernels.cu
#      becomes X.fatbin (what the driver-API program loads with cuModuleLoadData); X.cpp a
#      driver-API program (no runtime) linked with -lcuda against a stub generated here (the
#      wheels carry no libcuda; the real one comes at run time: the GPU driver's, or the
#      project's target/release/libcuda.so.1). Rebuilt only when a source, common.h or this
#      script is newer than the executable.
#   3. target/apps/nvidia/libcudart.so.13: NVIDIA's runtime from the wheel, for native runs on a
#      GPU (LD_LIBRARY_PATH=target/apps/nvidia target/apps/matmul large); target/apps/PROGRAMS
#      lists the programs, one a line (apps/run.sh and the tests read it).
#
# Usage: apps/build.sh [--ptx]    --ptx: also the PTX text of every program's kernels, for
#        compute_80, in target/apps/ptx/NAME.ptx (what the fat binaries carry, compressed).
#        Exit status: 0 built; 3 the toolchain cannot be installed
#        (no python3/pip/network: the message says which); 1 a program does not compile.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
tc=${VGPU_CUDA_TOOLCHAIN:-$root/target/cuda-toolchain}
out=${VGPU_APPS_OUT:-$root/target/apps}
log() { echo "apps: $*" >&2; }
ptx=0
for a in "$@"; do
  case "$a" in
    --ptx) ptx=1 ;;
    *) echo "usage: $0 [--ptx]" >&2; exit 2 ;;
  esac
done
cannot() { log "cannot install the CUDA toolchain: $*"; exit 3; }

# Every wheel pinned: nvcc's wheel alone would pull the newest nvvm (PTX the 13.0 driver rejects).
pins="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-profiler-api==13.0.85"

# --- 1. the toolchain ---
# Debian packages it needs (nvcc drives the host's g++; binutils' nm makes the libcuda stub).
apt_install() { # apt_install PACKAGE...: as root with apt-get, else exit 3 naming them
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "$@" >&2 ||
      { apt-get update >&2 && apt-get install -y --no-install-recommends "$@" >&2; } ||
      cannot "apt-get install $* failed"
  else
    cannot "missing $* (apt-get install $*, as root)"
  fi
}
command -v g++ >/dev/null || apt_install g++
command -v nm >/dev/null || apt_install binutils
stamp=$tc/.vgpu-pins
if [ "$(cat "$stamp" 2>/dev/null)" != "$pins" ]; then
  command -v python3 >/dev/null || apt_install python3 python3-venv
  python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
  log "installing the pinned CUDA 13.0 wheels into $tc (once)"
  rm -rf "$tc/venv"
  mkdir -p "$tc"
  python3 -m venv "$tc/venv" >&2 || cannot "python3 -m venv failed"
  # shellcheck disable=SC2086
  "$tc/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir $pins >&2 ||
    cannot "pip install of the CUDA wheels failed (network? PyPI reachable?)"
fi
cu=$(echo "$tc"/venv/lib/python3*/site-packages/nvidia/cu13)
[ -x "$cu/bin/nvcc" ] || cannot "no nvcc in $cu after installing (remove $tc and retry)"
# `-cudart shared` links -lcudart: the wheel has only libcudart.so.13.
ln -sf libcudart.so.13 "$cu/lib/libcudart.so"
echo "$pins" > "$stamp"
nvcc="$cu/bin/nvcc"
export PATH="$cu/bin:$PATH"

# --- 2. the programs ---
mkdir -p "$out/nvidia" "$tc/stub"
cp -f "$cu/lib/libcudart.so.13" "$out/nvidia/libcudart.so.13"
gencode="-gencode arch=compute_80,code=compute_80 -gencode arch=compute_90,code=compute_90"
# Host code at -O3 (the CPU references of the large sizes, vectorized); device code is nvcc's default.
hflags="-O3 -std=c++17 -I$here -L$cu/lib"
flags="$hflags -cudart shared"
newer() { # newer TARGET SOURCE...: true when TARGET is missing or older than a SOURCE
  t=$1; shift
  [ -e "$t" ] || return 0
  for s in "$@"; do [ "$s" -nt "$t" ] && return 0; done
  return 1
}
built=0
programs=""
for src in "$here"/*.cu "$here"/*.cpp; do
  [ -e "$src" ] || continue
  file=$(basename "$src")
  case "$file" in
    *.kernels.cu)
      fb="$out/${file%.kernels.cu}.fatbin"
      if newer "$fb" "$src" "$0"; then
        log "fatbin $(basename "$fb")"
        # shellcheck disable=SC2086
        "$nvcc" -fatbin $gencode -o "$fb" "$src" || { log "$src does not compile"; exit 1; }
        built=$((built + 1))
      fi
      continue ;;
  esac
  name=${file%.*}
  programs="$programs $name"
  exe="$out/$name"
  newer "$exe" "$src" "$here/common.h" "$0" || continue
  log "nvcc $name"
  case "$file" in
    *.cu)
      # shellcheck disable=SC2086
      "$nvcc" $flags $gencode -o "$exe" "$src" || { log "$src does not compile"; exit 1; } ;;
    *.cpp)
      # A driver-API program: host C++ without the runtime, linked with -lcuda against a stub
      # for libcuda.so.1 made of the cu* symbols its object needs (empty functions; the loader
      # finds the real libcuda.so.1 at run time).
      obj="$tc/stub/$name.o"
      # shellcheck disable=SC2086
      "$nvcc" $hflags -cudart none -c -o "$obj" "$src" || { log "$src does not compile"; exit 1; }
      nm -u "$obj" | awk '$2 ~ /^cu[A-Z]/ { print "void " $2 "(void) {}" }' > "$tc/stub/libcuda.c"
      gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tc/stub/libcuda.so" "$tc/stub/libcuda.c" ||
        { log "cannot build the libcuda link stub"; exit 1; }
      # shellcheck disable=SC2086
      "$nvcc" $hflags -cudart none -o "$exe" "$obj" -L"$tc/stub" -lcuda ||
        { log "$name does not link"; exit 1; } ;;
  esac
  built=$((built + 1))
done
if [ $ptx = 1 ]; then
  mkdir -p "$out/ptx"
  for src in "$here"/*.cu; do
    p="$out/ptx/$(basename "$src" .cu).ptx"
    newer "$p" "$src" "$here/common.h" || continue
    "$nvcc" -std=c++17 -I"$here" -ptx -arch=compute_80 -o "$p" "$src" || { log "$src: no PTX"; exit 1; }
  done
  log "PTX in $out/ptx"
fi
echo "$programs" | tr ' ' '\n' | sed '/^$/d' > "$out/PROGRAMS"
log "$(wc -l < "$out/PROGRAMS") programs in $out ($built rebuilt)"
