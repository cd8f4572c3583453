#!/usr/bin/env bash
# Issues 23/24/25's open GPU figures, two builds side by side on ONE machine (kind
# nvidia-h100-x2: the 2-GPU runs need it; the 64-VM sim runs are pinned to 16 cores with
# taskset). The same binaries have given a 0.6 ms and a 24 ms preemption max on two machines, so
# a figure is only compared with the other build's in the same call. Usage, from the repository
# root there:
#   scripts/ab-machine.sh NEW_DIR BASE_DIR OUT_DIR [reps]
# Each DIR holds vgpu-vmm, vgpud and vgpu-bench (release, stripped); NEW_DIR may also hold
# pgpu-cuda-tests (`cargo test --release -p pgpu --test cuda --no-run`). Runs alternate
# new/base, `reps` times each (default 3). Output: OUT_DIR/log.txt (every summary line) and one
# tarball per experiment (the device tool brings back only a few files: logs of the VMs are
# dropped, summaries, CSVs and daemon reports kept). Every step is under `timeout`: rc=124 in
# the log is a hang or a run past its limit.
# ONLY=fair|s64|restart|restore|migrate|armed runs one experiment.
set -u
NEW=$(realpath "$1"); BASE=$(realpath "$2"); OUT=$(realpath -m "$3"); REPS=${4:-3}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
nproc
want() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
# keep NAME: tar OUT/NAME-* (without the VMs' logs) into OUT/NAME.tar.gz
keep() {
  (cd "$OUT" && find . -maxdepth 2 -path "./$1-*" \( -name 'vm*.log' -o -name 'vm*.err' \
    -o -name '*.svg' -o -name '*.sock' \) -delete 2>/dev/null
   tar czf "$1.tar.gz" "$1"-* 2>/dev/null && rm -rf "$1"-*)
}
run() { # name limit_s bench-args...
  local name=$1 lim=$2; shift 2
  for i in $(seq 1 "$REPS"); do
    for b in new base; do
      local d=$NEW; [ $b = base ] && d=$BASE
      echo "== $name $b $i"
      timeout "$lim" ${PIN:-} "$d/vgpu-bench" "$@" --out "$OUT/$name-$b-$i" 2>&1 | tail -1
      echo "rc=${PIPESTATUS[0]}"
    done
  done
  keep "$name"
}
# bench with --vmm/--vgpud of its own build: vgpu-bench finds them next to itself.
if want fair; then
  # Issue 25: 16 VMs over 2 GPUs, one-CTA 5 ms kernels, checkpoint preemption; per-GPU Jain.
  run fair 90 fairness --backend cuda --gpus 2 --vms 16 --policy timeslice --kernel-us 5000 \
    --duration 5 --gpu-extra preempt=checkpoint
fi
if want s64; then
  # Issue 25: 64 VMs on one sim GPU, 16 cores (taskset on a 32-core machine); max preemption (worst_preemptions: due_at_ns).
  PIN="taskset -c 0-15" run s64 90 fairness --backend sim --vms 64 --policy timeslice \
    --weights 1 --kernel-us 500,5000 --duration 10 --vm-memory 64 --vram-per-vm 16M
fi
if want restart; then
  # Issue 25: vgpud SIGKILLed and restarted under 8 cuda VMs (restart.json).
  run restart 60 fairness --backend cuda --vms 8 --duration 6 --kernel-us 500,2000 \
    --kill-daemon-at 2000
fi
if want restore; then
  # Issue 24: restore to running, cold against a standby (10 reps inside each run).
  run restore 120 restore --backend cuda --reps 10
fi
if want migrate; then
  # Issue 24: live migration downtime and the guest's slowdown (~45 s per rep inside).
  REPS_SAVED=$REPS; REPS=1
  run migrate 240 migrate --backend cuda --reps 3
  REPS=$REPS_SAVED
fi
if want armed && [ -x "$NEW/pgpu-cuda-tests" ]; then
  # Issue 23: the armed/notice/mirror request path beside the default, bytes checked; the whole
  # output (the failing path's message is on the line after `panicked`).
  echo "== armed test"
  timeout 180 "$NEW/pgpu-cuda-tests" --ignored --test-threads=1 --nocapture \
    gpu_ckpath_armed_notice_mirror_on_every_long_kernel 2>&1 | tail -40
  echo "rc=${PIPESTATUS[0]}"
fi
