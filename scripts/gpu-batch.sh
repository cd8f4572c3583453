#!/usr/bin/env bash
# The open GPU checks and figures of issues 23/24/25, in phases sized for one device-tool call
# each (≤ 10 min; the machine goes back 30 s after a call, so issue the next phase at once).
# Usage, from the repository root on the GPU machine (kind nvidia-h100-x2: phase C needs two
# GPUs; A, B and D use GPU 0):
#   scripts/gpu-batch.sh A|B|C|D BIN_DIR APPS_DIR OUT_DIR
# BIN_DIR: `scripts/pack-gpu.sh BIN_DIR` (vgpu-vmm, vgpud, vgpu-bench and the ignored-cuda test
# binaries). APPS_DIR (BIN_DIR/suite: pack-gpu.sh packs it when target/apps is built): apps/ =
# target/apps (NVIDIA's libcudart.so.13 in apps/nvidia), lib/ = our stripped libcudart.so.13
# and libcuda.so.1. Each step is under `timeout`; rc=124 in the log is a hang or a run past its
# limit. Output: OUT_DIR/log-PHASE.txt and OUT_DIR/PHASE.tar.gz (summaries, CSVs, daemon
# reports; VM logs dropped: the device tool brings back at most 8 files).
#   A (~6 min)  correctness: every ignored cuda test (the slow ckpath measurement tests last,
#               each bounded), a fairness guest run far past its old heap limit (~81k kernels)
#   B (~9 min)  issue 23: the application suite never preempted under each method, in process
#   C (~8 min)  issue 25: 16 VMs over 2 GPUs ×3; 64 sim VMs ×3 at rt=0 and rt=1;
#               issue 24: migrate ×3 with the destination on the same GPU and on GPU 1
#   D (~6 min)  issue 23: wait on the suite's short kernels (40 µs budget against 0), the long
#               kernels under auto, the request paths' breakdown
#   E (~9 min)  session 12: wait and adaptive-path tests, migration into a cuda standby, the long
#               kernels under the adaptive path and the fixed one, migrate --dest standby, 64 VMs
#   F (~9 min)  before flipping ck_path's default to adaptive: the suite (never preempted and
#               forced) and 16 vgpud VMs under it, beside the fixed path
#   G (~8 min)  session 13, correctness after the flip: every ignored cuda test (new_paths too)
#   H (~9 min)  session 13, issue 23: the long kernels ×3 (adaptive default, atomic weight 64;
#               long_atomic at weight 8 beside), priority with filling at 2 and 20 ms LP
#               kernels under auto, 8 VMs beside plain CUDA processes under auto
#   I (~8 min)  session 13, issues 24/25: 64 sim VMs ×3, migrate into a standby ×2 (3 reps),
#               a 1 GiB working set into a standby
set -u
P=$1; B=$(realpath "$2"); AP=$(realpath "$3"); O=$(realpath -m "$4")
mkdir -p "$O"
exec > >(tee "$O/log-$P.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date +%T
exec 3>&1 # the log: t's own lines reach it even when the caller pipes t's output through a filter
t() { local lim=$1; shift; echo "== $(date +%T) [$lim s] $*" >&3; timeout "$lim" "$@"; echo "rc=$? $(date +%T)" >&3; }
last() { tail -n "$1"; } # the bench's summary lines
T=$B/pgpu-cuda-tests
case $P in
A)
  t 200 "$T" --ignored --test-threads=1 --skip ckpath 2>&1 | grep -vE "^test .* ok$"
  for x in gpu snapshot-gpu standby live-gpu migration-standby; do
    VGPU_VMM=$B/vgpu-vmm t 120 "$B/$x-tests" --ignored --test-threads=1 cuda 2>&1 | grep -vE "^test .* ok$"
  done
  t 90 "$B/vgpu-vmm" --guest fairness --memory 64 --gpu vram=64M,backend=cuda --timeout 80 \
    --cmdline "iters=200 threads=64 blocks=1 depth=3 ms=20000 report_ms=5000 out=vram stray=1 heap=1" 2>&1 | last 4
  t 150 "$T" --ignored --test-threads=1 --nocapture gpu_ckpath_armed_notice_mirror_on_every_long_kernel 2>&1 | grep -E "MEASURE|panicked|test result"
  t 200 "$T" --ignored --test-threads=1 --nocapture gpu_ckpath_new_paths_give_identical_bytes 2>&1 | grep -E "MEASURE|path|panicked|test result"
  ;;
B)
  A="--apps $AP/apps --lib $AP/lib --vmm $B/vgpu-vmm"
  t 560 "$B/vgpu-bench" apps --backend cuda --size large --configs native,inproc \
    --preempt checkpoint,restart,auto --reps 3 --native-lib "$AP/apps/nvidia" $A --out "$O/apps" 2>/dev/null | last 2
  find "$O" -name '*.svg' -delete; tar czf "$O/B.tar.gz" -C "$O" apps
  ;;
C)
  for i in 1 2 3; do
    t 90 "$B/vgpu-bench" fairness --backend cuda --gpus 2 --vms 16 --policy timeslice --kernel-us 5000 \
      --duration 5 --gpu-extra preempt=checkpoint --out "$O/fair-$i" 2>/dev/null | last 1
  done
  chrt -f 1 true; echo "rt_permitted=$?"
  for i in 1 2 3; do
    for rt in 0 1; do
      t 60 taskset -c 0-15 "$B/vgpu-bench" fairness --backend sim --vms 64 --policy timeslice --weights 1 \
        --kernel-us 500,5000 --duration 10 --vm-memory 64 --vram-per-vm 16M --gpu-extra rt=$rt \
        --out "$O/s64rt$rt-$i" 2>/dev/null | last 1
      grep -h "after its slice end" "$O/s64rt$rt-$i"/vm*.err 2>/dev/null | sed 's/.*stopped //' | sort -rn | head -3
    done
  done
  t 200 "$B/vgpu-bench" migrate --backend cuda --reps 3 --out "$O/mig" 2>/dev/null | last 1
  t 200 "$B/vgpu-bench" migrate --backend cuda --reps 3 --dest-gpu 1 --out "$O/migdest" 2>/dev/null | last 1
  find "$O" \( -name 'vm*.log' -o -name 'vm*.err' -o -name '*.svg' -o -name '*.sock' \) -delete
  tar czf "$O/C.tar.gz" -C "$O" $(cd "$O" && ls -d fair-* s64rt* mig migdest 2>/dev/null)
  ;;
D)
  for w in 40 0; do
    t 120 "$B/vgpu-bench" preempt --backend cuda --method auto --workload all --size large --samples 200 \
      --requester warm --wait-us $w --out "$O/w$w" 2>/dev/null | last 20
  done
  t 120 "$B/vgpu-bench" preempt --backend cuda --method auto --workload long --size xl --samples 20 \
    --out "$O/long" 2>/dev/null | last 8
  t 150 "$T" --ignored --test-threads=1 --nocapture gpu_ckpath_breakdown_of_every_path 2>&1 | grep -E "MEASURE|panicked|test result"
  find "$O" -name '*.svg' -delete; tar czf "$O/D.tar.gz" -C "$O" w40 w0 long
  ;;
E)
  # Session 12's new paths, in order of need (the call's limit may cut the tail): auto's
  # wait and the adaptive request path (tests), live migration into a cuda standby (test),
  # the long kernels under the adaptive path, a migration into a standby, 64 sim VMs, and the
  # fixed path and the plain destination as baselines on the same card.
  t 200 "$T" --ignored --test-threads=1 --nocapture ckwait ckadapt 2>&1 | grep -E "MEASURE|panicked|test result|^test .*FAILED"
  VGPU_VMM=$B/vgpu-vmm t 100 "$B/migration-standby-tests" --ignored --test-threads=1 cuda 2>&1 | grep -vE "^test .* ok$"
  t 180 "$B/vgpu-bench" preempt --backend cuda --method auto --workload long --size xl --samples 30 \
    --ck-path adaptive --out "$O/padapt" 2>/dev/null | last 8
  t 180 "$B/vgpu-bench" migrate --backend cuda --reps 3 --dest standby --out "$O/migsb" 2>/dev/null | last 1
  for i in 1 2; do
    t 45 taskset -c 0-15 "$B/vgpu-bench" fairness --backend sim --vms 64 --policy timeslice --weights 1 \
      --kernel-us 500,5000 --duration 10 --vm-memory 64 --vram-per-vm 16M --out "$O/s64-$i" 2>/dev/null | last 1
  done
  t 150 "$B/vgpu-bench" preempt --backend cuda --method auto --workload long --size xl --samples 30 \
    --ck-path fixed --out "$O/pfixed" 2>/dev/null | last 8
  find "$O" \( -name 'vm*.log' -o -name 'vm*.err' -o -name '*.svg' -o -name '*.sock' \) -delete
  tar czf "$O/E.tar.gz" -C "$O" $(cd "$O" && ls -d padapt migsb s64-* pfixed 2>/dev/null)
  ;;
F)
  # Before `ck_path=adaptive` becomes the default (pgpu/src/cuda/ckchoice.rs DEFAULT_CK_PATH):
  # the VM-level checks under it. The suite never preempted and force-preempted in process
  # (VGPU_CUDA_CK_PATH), 16 VMs through vgpud on one GPU with one-CTA kernels under
  # checkpoint (--gpu ck_path=adaptive; beside the same without it), the vmm cuda tests.
  A="--apps $AP/apps --lib $AP/lib --vmm $B/vgpu-vmm"
  VGPU_CUDA_CK_PATH=adaptive t 330 "$B/vgpu-bench" apps --backend cuda --size large --configs inproc \
    --preempt auto --reps 3 $A --out "$O/apps-adaptive" 2>/dev/null | last 2
  VGPU_CUDA_CK_PATH=adaptive t 90 "$B/vgpu-bench" apps --backend cuda --size small --configs inproc \
    --preempt checkpoint,restart,auto --preempt-test 1:3 --reps 1 $A --out "$O/appt-adaptive" 2>/dev/null | last 2
  for x in "" ",ck_path=adaptive"; do
    t 90 "$B/vgpu-bench" fairness --backend cuda --vms 16 --policy timeslice --kernel-us 5000 \
      --duration 5 --gpu-extra "preempt=checkpoint$x" --out "$O/fair16${x#,ck_path=}" 2>/dev/null | last 1
  done
  find "$O" \( -name 'vm*.log' -o -name 'vm*.err' -o -name '*.svg' -o -name '*.sock' \) -delete
  tar czf "$O/F.tar.gz" -C "$O" $(cd "$O" && ls -d apps-adaptive appt-adaptive fair16* 2>/dev/null)
  ;;
G)
  t 240 "$T" --ignored --test-threads=1 --skip ckpath 2>&1 | grep -vE "^test .* ok$"
  t 150 "$T" --ignored --test-threads=1 --nocapture gpu_ckpath_new_paths_give_identical_bytes 2>&1 |
    grep -E "MEASURE|panicked|test result|FAILED"
  for x in gpu snapshot-gpu standby live-gpu migration-standby; do
    VGPU_VMM=$B/vgpu-vmm t 120 "$B/$x-tests" --ignored --test-threads=1 cuda 2>&1 | grep -vE "^test .* ok$"
  done
  ;;
H)
  for i in 1 2 3; do
    t 100 "$B/vgpu-bench" preempt --backend cuda --method auto --workload long --size xl --samples 50 \
      --out "$O/long-$i" 2>/dev/null | last 6
  done
  t 60 "$B/vgpu-bench" preempt --backend cuda --method auto --workload long_atomic --size xl --samples 50 \
    --atomic-weight 8 --out "$O/atomic8" 2>/dev/null | last 1
  for k in 2000 20000; do
    t 100 "$B/vgpu-bench" priority --backend cuda --lp 4 --duration 5 --kernel-us 500,$k \
      --gpu-extra preempt=auto --out "$O/prio$k" 2>&1 | grep -vE "^\s*$" | tail -12
  done
  t 90 "$B/vgpu-bench" fairness --backend cuda --vms 8 --policy timeslice --kernel-us 500,5000 \
    --duration 5 --gpu-extra preempt=auto --baseline native --out "$O/fair8" 2>&1 | tail -3
  find "$O" \( -name 'vm*.log' -o -name 'vm*.err' -o -name '*.svg' -o -name '*.sock' \) -delete
  tar czf "$O/H.tar.gz" -C "$O" $(cd "$O" && ls -d long-* atomic8 prio* fair8 2>/dev/null)
  ;;
I)
  for i in 1 2 3; do
    t 45 taskset -c 0-15 "$B/vgpu-bench" fairness --backend sim --vms 64 --policy timeslice --weights 1 \
      --kernel-us 500,5000 --duration 10 --vm-memory 64 --vram-per-vm 16M --out "$O/s64-$i" 2>/dev/null | last 1
  done
  for i in 1 2; do
    t 180 "$B/vgpu-bench" migrate --backend cuda --reps 3 --dest standby --out "$O/migsb-$i" 2>/dev/null | last 1
  done
  t 150 "$B/vgpu-bench" migrate --backend cuda --reps 1 --dest standby --vram-mib 2048 --pool-mib 1024 \
    --dirty-mib-per-s 100 --out "$O/migsb1g" 2>/dev/null | last 1
  find "$O" \( -name 'vm*.log' -o -name 'vm*.err' -o -name '*.svg' -o -name '*.sock' \) -delete
  tar czf "$O/I.tar.gz" -C "$O" $(cd "$O" && ls -d s64-* migsb* 2>/dev/null)
  ;;
*) echo "phase A|B|C|D|E|F|G|H|I" >&2; exit 2 ;;
esac
