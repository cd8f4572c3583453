#!/bin/sh
# Regenerates the probes' PTX with the pinned nvcc 13.0 (apps/build.sh installs the wheels):
# C=/path/to/site-packages/nvidia/cu13 sh regen.sh
# Each probe is compiled for compute_80 (default -O3, as the application suite is) and
# committed, so the ptx tests need no nvcc. The compute_90 output is compiled too: where it
# differs from the compute_80 one beyond `.target` it is kept as NAME.90.ptx (and tested);
# otherwise the tests parse the compute_80 text retargeted to sm_90.
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
    if sed 's/^\.target sm_80$/.target sm_90/' "$b.80.ptx" | cmp -s - "$tmp/$b.90.ptx"; then
        rm -f "$b.90.ptx"
    else
        cp "$tmp/$b.90.ptx" "$b.90.ptx"
    fi
done
