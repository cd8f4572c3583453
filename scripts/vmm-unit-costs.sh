#!/bin/bash
# The VMM unit costs in docs/performance.md: start-to-exit wall time of the hello and exit
# guests (40 runs each) and the trap round trip of MMIO and port reads (3 runs of the exits
# guest). Usage: scripts/vmm-unit-costs.sh [path/to/vgpu-vmm]  (default: the release build)
set -u
B=${1:-target/release/vgpu-vmm}
echo "host: $(grep -m1 'model name' /proc/cpuinfo) kernel $(uname -r) kvm: $(ls /sys/module | grep -E '^kvm' | tr '\n' ' ')"
for g in "hello" "exit --cmdline code=7" "fault --cmdline mode=ud" "fault --cmdline mode=triple" "pcitest --testdev"; do
  $B --guest $g --timeout 10 > /tmp/o 2>&1; echo "guest $g -> rc=$? $(tail -1 /tmp/o)"
done
python3 - "$B" <<'PY'
import subprocess,sys,time,statistics
for g in ["hello","exit"]:
    ts=[]
    for i in range(40):
        t=time.perf_counter(); r=subprocess.run([sys.argv[1],"--guest",g],capture_output=True); ts.append((time.perf_counter()-t)*1e3)
        assert r.returncode==0, r
    ts.sort(); print(g,"wall ms: median %.1f p10 %.1f p90 %.1f min %.1f"%(statistics.median(ts),ts[4],ts[36],ts[0]))
PY
for i in 1 2 3; do $B --guest exits --testdev --stats 2>&1 | python3 -c "
import json,sys; t=sys.stdin.read(); i=t.index('{'); d=json.loads(t[i:]); v=d['vcpus'][0]; n=v['io_in']+v['io_out']+v['mmio_read']+v['mmio_write']; print(' '.join(t[:i].split()), 'vmm_handle_ns_per_exit=%.0f'%(v['handle_ns']/n))"; done
