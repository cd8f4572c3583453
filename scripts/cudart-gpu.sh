#!/usr/bin/env bash
# Our libcudart.so.13 over NVIDIA's libcuda.so.1 on a GPU machine, next to NVIDIA's own runtime,
# on the same nvcc-built programs. Two steps:
#   here (nvcc and cargo):   scripts/cudart-gpu.sh bundle DIR
#       builds cudart (release), the programs of cudart/tests/cuda with the default flags
#       (PTX for compute_80 and compute_90, -cudart shared) and one SASS-only build, and copies
#       them, our stripped library, NVIDIA's libcudart.so.13 from the wheel and, if built,
#       target/apps (apps/build.sh) into DIR;
#   on the GPU machine:      scripts/cudart-gpu.sh run DIR
#       runs every program with each runtime (LD_LIBRARY_PATH=DIR/ours or DIR/nvidia) and prints
#       one line per run (exit status, last output line), then the launch cost of each.
# C=<site-packages>/nvidia/cu13 names the wheel (default: the apps toolchain under target/).
set -u
cmd=${1:-}; D=${2:-}
[ -n "$cmd" ] && [ -n "$D" ] || { echo "usage: $0 bundle|run DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
case $cmd in
bundle)
  C=${C:-$(echo "$root"/target/cuda-toolchain/venv/lib/python3*/site-packages/nvidia/cu13)}
  [ -x "$C/bin/nvcc" ] || { echo "no nvcc under $C (run apps/build.sh or set C)" >&2; exit 3; }
  mkdir -p "$D/ours" "$D/nvidia" "$D/bin" "$D/lnk"
  (cd "$root" && cargo build --release -p cudart) || exit 1
  cp "$root/target/release/libcudart.so" "$D/ours/libcudart.so.13" && strip "$D/ours/libcudart.so.13"
  cp "$C/lib/libcudart.so.13" "$D/nvidia/"
  ln -sf "$C/lib/libcudart.so.13" "$D/lnk/libcudart.so"
  nv() { PATH=$C/bin:$PATH nvcc -cudart shared -L"$D/lnk" -L"$C/lib" "$@"; }
  for f in "$root"/cudart/tests/cuda/*.cu; do
    p=$(basename "$f" .cu)
    nv -gencode arch=compute_80,code=compute_80 -gencode arch=compute_90,code=compute_90 -o "$D/bin/$p" "$f" || exit 1
  done
  nv -gencode arch=compute_90,code=sm_90 -o "$D/bin/symbols-sass" "$root/cudart/tests/cuda/symbols.cu" || exit 1
  rm -rf "$D/lnk"
  if [ -f "$root/target/apps/PROGRAMS" ]; then mkdir -p "$D/apps" && cp -r "$root"/target/apps/. "$D/apps/"; fi
  echo "bundle in $D"
  ;;
run)
  D=$(realpath "$D")
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  one() { # runtime dir program [args]
    local rt=$1 dir=$2 p=$3; shift 3
    out=$(cd "$dir" && LD_LIBRARY_PATH=$D/$rt timeout 300 "./$p" "$@" 2>&1); rc=$?
    printf '%-7s %-14s rc=%-3s %s\n' "$rt" "$p" "$rc" "$(printf '%s\n' "$out" | tail -1)"
  }
  for p in symbols api threads fault symbols-sass; do one ours "$D/bin" $p; one nvidia "$D/bin" $p; done
  if [ -f "$D/apps/PROGRAMS" ]; then
    for p in $(cat "$D/apps/PROGRAMS"); do one ours "$D/apps" "$p"; one nvidia "$D/apps" "$p"; done
  fi
  for i in 1 2; do one ours "$D/bin" launch; one nvidia "$D/bin" launch; done
  echo "== the one line for a SASS-only program whose SASS the GPU cannot run is not expected on sm_90 (an H100 runs it)"
  ;;
*) echo "usage: $0 bundle|run DIR" >&2; exit 2 ;;
esac
