#!/bin/sh
# Runs every program of the application suite (built by apps/build.sh) at one size and prints
# each one's verdict line, then a summary; exits non-zero if any program failed.
#   apps/run.sh [small|large] [DIR]     DIR: where the programs are (default target/apps)
# The CUDA libraries are whatever the loader finds: NVIDIA's on a GPU machine
# (LD_LIBRARY_PATH=target/apps/nvidia: the wheel's libcudart.so.13 beside the driver's
# libcuda.so.1), or the project's in-process ones (LD_LIBRARY_PATH=target/release).
set -u
size=${1:-small}
dir=${2:-$(cd "$(dirname "$0")/.." && pwd)/target/apps}
[ -f "$dir/PROGRAMS" ] || { echo "run.sh: no $dir/PROGRAMS: run apps/build.sh first" >&2; exit 2; }
pass=0 fail=0 failed=""
for p in $(cat "$dir/PROGRAMS"); do
  start=$(date +%s.%N)
  line=$("$dir/$p" "$size" 2>&1)
  rc=$?
  secs=$(awk "BEGIN { print $(date +%s.%N) - $start }")
  printf "%s   [exit %d, %.2f s]\n" "$line" "$rc" "$secs"
  if [ $rc -eq 0 ] && echo "$line" | grep -q ": PASS "; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $p"; fi
done
echo "apps: $pass passed, $fail failed${failed:+ (}${failed# }${failed:+)} at size $size"
[ $fail -eq 0 ]
