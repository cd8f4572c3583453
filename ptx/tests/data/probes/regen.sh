#!/bin/sh
# Regenerates the probes' PTX with the pinned nvcc 13.0 (apps/build.sh installs the wheels):
# C=/path/to/site-packages/nvidia/cu13 sh regen.sh
# Each probe is compiled for compute_80 (default -O3, as the application suite is) and
# committed, so the ptx tests need no nvcc. The compute_90 output is compiled too and must
# differ only in `.target` (the tests parse the compute_80 text retargeted to sm_90).
set -eu
cd "$(dirname "$0")"
: "${C:?set C to the nvidia/cu13 directory of the pinned CUDA 13.0 wheels}"
export PATH="$C/bin:$PATH"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in *.cu; do
    b=${f%.cu}
    nvcc -ptx -arch=compute_80 -o "$b.80.ptx" "$f"
    nvcc -ptx -arch=compute_90 -o "$tmp/$b.90.ptx" "$f"
    sed 's/^\.target sm_80$/.target sm_90/' "$b.80.ptx" | cmp -s - "$tmp/$b.90.ptx" \
        || { echo "$b: compute_90 PTX differs beyond .target: commit it and test it" >&2; exit 1; }
done
