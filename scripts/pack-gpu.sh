#!/usr/bin/env bash
# Builds and strips what a GPU-machine run needs (the GPU machine has no Rust toolchain) into
# one folder, named as scripts/gpu-machine.sh and scripts/ab-machine.sh expect them. Usage,
# from the repository root here:
#   scripts/pack-gpu.sh DIR
# DIR (e.g. .devcarry/new, a folder .git/info/exclude ignores, named in the device tool's
# `carry`) gets vgpu-vmm, vgpud, vgpu-bench and the ignored-cuda test binaries: gpu-tests,
# snapshot-gpu-tests, standby-tests, live-gpu-tests, migration-standby-tests (vmm) and
# pgpu-cuda-tests (pgpu). DIR must
# be new or empty: nothing of the user's is overwritten. With target/apps built, DIR/suite
# gets the suite and our stripped CUDA libraries. Prints the total size (the device
# tool carries at most 64 MiB in all).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
D=$1
if [ -e "$D" ] && [ -n "$(ls -A "$D")" ]; then
  echo "$0: $D is not empty; give a new or empty folder" >&2
  exit 2
fi
mkdir -p "$D"
cargo build --release -p vmm -p vgpud -p vgpu-bench
for b in vgpu-vmm vgpud vgpu-bench; do strip -o "$D/$b" "target/release/$b"; done
# test target -> name in DIR: the executable cargo reports for it
tests() { # package test-target name
  local exe
  exe=$(cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$2")
  [ -n "$exe" ] || { echo "$0: no executable for $1 --test $2" >&2; exit 1; }
  strip -o "$D/$3" "$exe"
}
tests vmm gpu gpu-tests
tests vmm snapshot_gpu snapshot-gpu-tests
tests vmm standby standby-tests
tests vmm live_gpu live-gpu-tests
tests vmm migration_standby migration-standby-tests
tests pgpu cuda pgpu-cuda-tests
# The application suite and the project's CUDA libraries (scripts/gpu-batch.sh's APPS_DIR):
# DIR/suite/apps (apps/build.sh's target/apps, NVIDIA's runtime in nvidia/) and DIR/suite/lib.
if [ -d target/apps ]; then
  cargo build --release -p cuda -p cudart
  mkdir -p "$D/suite/lib"
  cp -a target/apps "$D/suite/apps"
  strip -o "$D/suite/lib/libcudart.so.13" target/release/libcudart.so
  strip -o "$D/suite/lib/libcuda.so.1" target/release/libcuda.so
else
  echo "$0: no target/apps (apps/build.sh builds it): DIR/suite not packed" >&2
fi
ls -la "$D"
du -sh "$D"
