#!/bin/bash
# What TLS costs a migration (docs/performance.md, "Migration over TLS"): stop-and-copy of the
# `count` guest with a MIB MiB buffer (default 1024) that it rewrites every step, over
# tcp:127.0.0.1:PORT and over tls:localhost:PORT, alternating, REPS runs each (default 3).
# Certificates (a CA, a server certificate for localhost, a client certificate) are made with
# openssl in a scratch directory. Prints one line per migration: transport, RAM pages, total
# and paused ms, MB/s (pages * 4096 / total).
# Usage: scripts/migrate-tls-throughput.sh [path/to/vgpu-vmm] [MIB] [REPS]
set -eu
B=$(realpath "${1:-target/release/vgpu-vmm}")
MIB=${2:-1024}
REPS=${3:-3}
D=$(mktemp -d /tmp/migrate-tls.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$D"' EXIT
echo "host: $(grep -m1 'model name' /proc/cpuinfo), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

ossl() { openssl "$@" 2>/dev/null; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -keyout "$D/ca.key" -out "$D/ca.crt" -subj /CN=bench-ca
for n in server client; do
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$D/$n.key" \
    -out "$D/$n.csr" -subj "/CN=$n"
  printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >"$D/ext"
  ossl x509 -req -in "$D/$n.csr" -CA "$D/ca.crt" -CAkey "$D/ca.key" -CAcreateserial -days 1 \
    -extfile "$D/ext" -out "$D/$n.crt"
done

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# One migration over $1 (tcp or tls).
one() {
  local p url dargs=() sargs=()
  p=$(port)
  if [ "$1" = tls ]; then
    url=tls:localhost:$p
    dargs=(--tls-cert "$D/server.crt" --tls-key "$D/server.key" --tls-ca "$D/ca.crt")
    sargs=(--tls-cert "$D/client.crt" --tls-key "$D/client.key" --tls-ca "$D/ca.crt")
  else
    url=tcp:127.0.0.1:$p
  fi
  # (Removed first: the shell truncates the output file only once the VM's process starts.)
  rm -f "$D/vm.sock" "$D/src.out"
  "$B" --incoming "$url" "${dargs[@]}" --timeout 600 >"$D/dest.out" 2>"$D/dest.err" &
  local dest=$!
  "$B" --guest count --cmdline "steps=1000000 mib=$MIB ms=50" --memory $((MIB + 128)) \
    --api-socket "$D/vm.sock" "${sargs[@]}" --timeout 600 >"$D/src.out" 2>&1 &
  local src=$!
  until [ -S "$D/vm.sock" ] && grep -q "COUNT step=2 " "$D/src.out" 2>/dev/null; do sleep 0.1; done
  "$B" ctl "$D/vm.sock" migrate "$url" >"$D/done.json"
  wait $src || true
  kill $dest 2>/dev/null || true
  wait $dest 2>/dev/null || true
  python3 - "$1" "$D/done.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
mb = d["ram_pages"] * 4096 / 1e6
print("%s pages=%d ms=%.1f paused_ms=%.1f MB/s=%.0f" % (sys.argv[1], d["ram_pages"], d["ms"], d["paused_ms"], mb / (d["ms"] / 1e3)))
PY
}

for i in $(seq "$REPS"); do
  one tcp
  one tls
done
