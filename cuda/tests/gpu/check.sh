#!/usr/bin/env bash
# libcuda.so.1 on a GPU machine: the same programs on the cuda backend (pgpu's cuda engine
# in-process, NVIDIA's driver loaded by pgpu::cuda::sys), on sim, and on NVIDIA's driver alone.
# Usage: BIN_DIR/check.sh BIN_DIR OUT_DIR   (BIN_DIR from bundle.sh)
set -u
B=$(realpath "$1"); OUT=$(realpath -m "$2"); mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi -L || true
cd "$B"
export LD_LIBRARY_PATH=$B
echo "== C program (vecadd, a __constant__), cuda backend"
VGPU_CUDA_BACKEND=cuda VGPU_CUDA_STATS=$OUT/c-cuda.json ./driver kernels.ptx; echo "rc=$?"
echo "== nvcc PTX (saxpy, __constant__, __device__, struct by value), cuda backend"
VGPU_CUDA_BACKEND=cuda VGPU_CUDA_STATS=$OUT/drv-cuda.json ./drv saxpy.ptx; echo "rc=$?"
echo "== same, sim backend"
VGPU_CUDA_BACKEND=sim VGPU_CUDA_STATS=$OUT/drv-sim.json ./drv saxpy.ptx; echo "rc=$?"
echo "== same on NVIDIA's driver (native: this library not on the path)"
env -u LD_LIBRARY_PATH ./drv saxpy.ptx; echo "rc=$?"
echo "== Rust API tests on the cuda backend (the fault test alone: it loses the process's CUDA context)"
VGPU_CUDA_BACKEND=cuda ./api --test-threads=1 --skip faulting; echo "rc=$?"
VGPU_CUDA_BACKEND=cuda ./api --test-threads=1 faulting; echo "rc=$?"
for f in "$OUT"/*.json; do echo "== $f"; cat "$f"; done
