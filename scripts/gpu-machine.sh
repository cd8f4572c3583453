#!/usr/bin/env bash
# The GPU-machine checks of the cuda backend and the fairness figures, with binaries built
# elsewhere (the GPU machine has no Rust toolchain). Usage, from the repository root there:
#   scripts/gpu-machine.sh BIN_DIR OUT_DIR [fairness-seconds]
# BIN_DIR holds vgpu-vmm, vgpud, vgpu-bench and gpu-tests (the binary of `cargo test --release
# -p vmm --test gpu --no-run`); optionally snapshot-gpu-tests (`cargo test --release -p vmm
# --test snapshot_gpu --no-run`), standby-tests (`cargo test --release -p vmm --test standby
# --no-run`), live-gpu-tests (`cargo test --release -p vmm --test live_gpu --no-run`),
# migration-standby-tests (`cargo test --release -p vmm --test migration_standby --no-run`) and
# pgpu-cuda-tests (`cargo test --release -p pgpu --test cuda --no-run`). Everything goes to OUT_DIR/log.txt and OUT_DIR/*.tar.gz.
# SKIP_CUDA=1 runs only the fairness figures. PGPU_FILTER picks pgpu's cuda tests (default
# `bulk`; empty: all of them). scripts/pack-gpu.sh DIR builds and strips all of BIN_DIR.
set -u
B=$(realpath "$1"); OUT=$(realpath -m "$2"); SECS=${3:-5}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi -L || true
if [ -z "${SKIP_CUDA:-}" ]; then
echo "== cuda: workloads in both modes, a kernel fault beside a good VM (ignored Rust tests)"
VGPU_VMM=$B/vgpu-vmm "$B/gpu-tests" --ignored --test-threads=1 cuda
for mode in full para; do
  echo "== cuda workloads mode=$mode"
  "$B/vgpu-vmm" --guest workloads --gpu "backend=cuda,mode=$mode" --timeout 300 | grep -E "^(INIT|RESULT|workloads)"
done
echo "== cuda: two fairness VMs sharing the GPU through vgpud (timeslice 2 ms)"
D=$OUT/cuda-shared; mkdir -p "$D"
"$B/vgpud" --socket "$D/s" --vram 4G --sched policy=timeslice --report "$D/vgpud.json" --log-level warn &
DP=$!; sleep 0.5
for i in 1 2; do
  "$B/vgpu-vmm" --guest fairness --gpu "backend=cuda,host=$D/s,name=c$i,vram=64M" \
    --cmdline "iters=2000000 threads=256 blocks=528 depth=2 ms=3000" --timeout 60 > "$D/c$i.log" 2>&1 &
done
wait %2 %3; kill -TERM $DP; wait $DP
grep -h "FAIRNESS end\|fault" "$D"/c*.log
fi
echo "== sim fairness on this host (${SECS} s runs)"
F=$OUT/fair; mkdir -p "$F"
run() { "$B/vgpu-bench" fairness --vmm "$B/vgpu-vmm" --vgpud "$B/vgpud" --duration "$SECS" "$@" | tail -1; }
for p in timeslice fifo credit band; do
  run --vms 8 --policy $p --kernel-us 500,5000 --out "$F/eq8-$p"
done
run --vms 4 --policy timeslice --weights 1,2,4,8 --kernel-us 5000 --out "$F/w1248-timeslice"
run --vms 32 --policy timeslice --kernel-us 500,5000 --vm-memory 64 --vram-per-vm 16M --out "$F/vm32-timeslice"
tar czf "$OUT/fair.tar.gz" -C "$OUT" fair $( [ -d "$OUT/cuda-shared" ] && echo cuda-shared )
if [ -z "${SKIP_CUDA:-}" ]; then
  echo "== cuda fairness (vgpud time-slicing VMs that each own a CUDA context)"
  C=$OUT/fair-cuda; mkdir -p "$C"
  run --backend cuda --vms 4 --policy timeslice --kernel-us 500,5000 --out "$C/eq4"
  run --backend cuda --vms 8 --policy timeslice --kernel-us 500,5000 --out "$C/eq8"
  run --backend cuda --vms 3 --policy timeslice --weights 1,2,4 --kernel-us 5000 --out "$C/w124"
  tar czf "$OUT/fair-cuda.tar.gz" -C "$OUT" fair-cuda
fi
if [ -z "${SKIP_CUDA:-}" ]; then
  echo "== cuda: VRAM checkpoint/restore speed (vgpu-bench snapshot) and snapshots across backends"
  S=$OUT/snapshot; mkdir -p "$S"
  "$B/vgpu-bench" snapshot --backend cuda --vram 4G --fill 0.5 --reps 5 --out "$S/4g" | tail -1
  "$B/vgpu-bench" snapshot --backend cuda --vram 4G --fill 0.5 --run-pages 1 --reps 3 --out "$S/4g-pages" | tail -1
  "$B/vgpu-bench" snapshot --backend cuda --vram 8G --fill 1 --reps 3 --no-device --out "$S/8g-full" | tail -1
  if [ -x "$B/pgpu-cuda-tests" ]; then
    # shellcheck disable=SC2086 # PGPU_FILTER= (empty) runs every ignored cuda test
    "$B/pgpu-cuda-tests" --ignored --test-threads=1 --nocapture ${PGPU_FILTER-bulk}
  fi
  if [ -x "$B/snapshot-gpu-tests" ]; then
    VGPU_VMM=$B/vgpu-vmm "$B/snapshot-gpu-tests" --ignored --test-threads=1 cuda
  fi
  if [ -x "$B/live-gpu-tests" ]; then
    # Live migration onto a prepared cuda destination; a planted out-of-extent store.
    VGPU_VMM=$B/vgpu-vmm "$B/live-gpu-tests" --ignored --test-threads=1 cuda
  fi
  echo "== cuda: restore to running, cold --restore against a --standby process (vgpu-bench restore)"
  "$B/vgpu-bench" restore --backend cuda --reps 20 --vmm "$B/vgpu-vmm" --out "$S/restore-cuda" | tail -1
  if [ -x "$B/standby-tests" ]; then
    VGPU_VMM=$B/vgpu-vmm "$B/standby-tests" --ignored --test-threads=1 cuda
  fi
  if [ -x "$B/migration-standby-tests" ]; then
    # Live migration into a cuda standby (its engine made before the migration).
    VGPU_VMM=$B/vgpu-vmm "$B/migration-standby-tests" --ignored --test-threads=1 cuda
  fi
  tar czf "$OUT/snapshot.tar.gz" -C "$OUT" snapshot
fi
