#!/usr/bin/env bash
# Builds, on the development machine, what check.sh runs on a GPU machine (no Rust there).
# Usage from the repository root: cuda/tests/gpu/bundle.sh BIN_DIR
# Needs cc, g++, and the pinned CUDA 13.0 wheels at $C (default: the venv of COMMON notes)
# for nvcc (the PTX of saxpy.cu) and cuda.h (drv.cpp).
set -eu
B=$(realpath -m "$1"); mkdir -p "$B"
C=${C:-/tmp/nvccvenv/lib/python3.11/site-packages/nvidia/cu13}
T=cuda/tests
cargo build --release -p cuda
cp target/release/libcuda.so "$B/libcuda.so.1" && strip "$B/libcuda.so.1"
api=$(cargo test --release -p cuda --test api --no-run 2>&1 | grep -o 'target/release/deps/api-[0-9a-f]*' | head -1)
cp "$api" "$B/api" && strip "$B/api"
cc "$T/c/driver.c" -o "$B/driver" -Ltarget/release -l:libcuda.so.1
cp "$T/kernels.ptx" "$B/"
PATH=$C/bin:$PATH nvcc -ptx -arch=compute_80 "$T/gpu/saxpy.cu" -o "$B/saxpy.ptx"
g++ -O2 "$T/gpu/drv.cpp" -o "$B/drv" -I"$C/include" -Ltarget/release -l:libcuda.so.1
cp "$T/gpu/check.sh" "$B/"
echo "bundle in $B: $(ls "$B" | tr '\n' ' ')"
