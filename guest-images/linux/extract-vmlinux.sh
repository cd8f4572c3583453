#!/bin/sh
# Extracts the uncompressed vmlinux ELF from an XZ-compressed bzImage (Debian's), so that the
# VMM can skip the decompressor, which is very slow under PVM's instruction emulator.
# Usage: extract-vmlinux.sh BZIMAGE OUT   (needs python3 with lzma)
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BZIMAGE OUT" >&2; exit 2; }
python3 - "$1" "$2" <<'PY'
import lzma, sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"\xfd7zXZ\x00")
if at < 0:
    sys.exit("extract-vmlinux: no XZ stream in " + sys.argv[1])
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[at:])
if out[:4] != b"\x7fELF":
    sys.exit("extract-vmlinux: the XZ stream is not an ELF file")
open(sys.argv[2], "wb").write(out)
PY
