#!/usr/bin/env bash
# Issue 25's several-GPUs figures on a machine with two GPUs (kind nvidia-h100-x2), with binaries
# built elsewhere. Usage, from the repository root there:
#   scripts/multigpu-machine.sh BIN_DIR OUT_DIR [seconds]
# (ONLY=move: only the moves, 3 and 4.)
# BIN_DIR holds vgpu-vmm, vgpud and vgpu-bench (release builds) and, optionally, cuda-switch-test
# (`cargo test --release -p pgpu --test cuda_switch --no-run`'s binary). Everything goes to
# OUT_DIR/log.txt; each fairness run's files to OUT_DIR/<run>/.
# 1. 16 VMs over 2 GPUs through one daemon, cuda backend: Jain within each GPU's VMs, shares per
#    GPU; nvidia-smi shows which device each VM process opened.
# 2. The same on sim (the software GPU, two VRAM objects).
# 3. A sim VM moved between the daemon's two GPUs while it runs kernels (beside a VM on each
#    GPU): downtime from the move's answer, every kernel result checked by the guests.
# 4. The same with cuda VMs (`vgpud --gpus all`: the devices discovered): each move makes a
#    cuda engine on the other device in the VM process and swaps it in; before that, the
#    engine-level switch test (a preempted job finishing on device 1, bytes checked).
set -u
B=$(realpath "$1"); OUT=$(realpath -m "$2"); SECS=${3:-5}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi -L || true
fair() { "$B/vgpu-bench" fairness --vmm "$B/vgpu-vmm" --vgpud "$B/vgpud" --duration "$SECS" "$@" | tail -1; }

if [ "${ONLY:-}" != move ]; then
echo "== cuda: 16 VMs over 2 GPUs, one-block 5 ms kernels"
fair --backend cuda --gpus 2 --vms 16 --policy timeslice --kernel-us 5000 --out "$OUT/cuda16-2gpu" &
BP=$!
sleep $((SECS / 2 + 8))
nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv || true
wait $BP
echo "== cuda: 16 VMs over 2 GPUs, sliceable grids (33792 blocks)"
fair --backend cuda --gpus 2 --vms 16 --policy timeslice --kernel-us 5000 --blocks 33792 \
  --guest-args sys_mib=32 --out "$OUT/cuda16-2gpu-grid"
echo "== sim: 16 VMs over 2 GPUs"
fair --gpus 2 --vms 16 --policy timeslice --kernel-us 500,5000 --vm-memory 64 --vram-per-vm 16M \
  --out "$OUT/sim16-2gpu"
fi

movetest() { # backend, daemon --gpus, guest run ms, guest iterations
  local be=$1 gpus=$2 ms=$3 iters=$4
  echo "== $be: a running VM moved between GPU 0 and GPU 1"
  M=$OUT/move-$be; mkdir -p "$M"
  "$B/vgpud" --socket "$M/s" --gpus "$gpus" --vram 1G --sched policy=timeslice,slice=2ms \
    --report "$M/vgpud.json" --log-level info 2> "$M/vgpud.log" &
  DP=$!; sleep 1
  grep -H "CUDA device" "$M/vgpud.log" || true
  vm() { # name, gpu, extra args...
    local n=$1 g=$2; shift 2
    "$B/vgpu-vmm" --guest fairness --gpu "host=$M/s,name=$n,vram=64M,gpu=$g,backend=$be" \
      --cmdline "iters=$iters depth=2 ms=$ms report_ms=100" --timeout 120 "$@" > "$M/$n.log" 2>&1 &
    VMS="$VMS $!"
  }
  VMS=
  vm mover 0 --api-socket "$M/api"
  vm left 0
  vm right 1
  sleep 4
  for i in 1 2 3; do
    "$B/vgpu-vmm" ctl "$M/api" move-gpu $((i % 2)) | tee -a "$M/moves.json"
    sleep 1
  done
  nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv || true
  wait $VMS
  kill -TERM $DP; wait $DP
  grep -H "FAIRNESS end\|fault\|error" "$M"/*.log | head -20
  python3 - "$M" <<'EOF'
import json, sys
d = sys.argv[1]
moves = [json.loads(l) for l in open(d + "/moves.json") if l.strip()]
for m in moves:
    print(f"move {m['from']} -> {m['to']}: downtime {m['downtime_ms']:.2f} ms, total {m['ms']:.1f} ms, "
          f"pre-copy {m['precopy_bytes']} B, last round {m['last_round_bytes']} B")
r = json.load(open(d + "/vgpud.json"))
for v in r["vms"]:
    print(f"vm {v['name']}: gpu {v['gpu']}, moves {v['moves']}, gpu {v['gpu_ns']/1e6:.0f} ms, evicted {v['evicted']}")
for g in r["gpus"]:
    print(f"gpu {g['index']}: vms {g['vms']}, busy {g['busy_ns']/1e6:.0f} ms, vram free {g['vram_free'] >> 20} MiB")
EOF
}
movetest sim 2 8000 20000
if [ -x "$B/cuda-switch-test" ]; then
  echo "== cuda: engine switch test (device 0 -> 1)"
  "$B/cuda-switch-test" --ignored --nocapture --test-threads=1
fi
movetest cuda all 15000 2000000
