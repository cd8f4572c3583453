#!/bin/sh
# Fetches Debian's stock amd64 kernel (and busybox-static) into a cache under target/ and
# builds a trivial initramfs; prints the paths. Kernel binaries are never committed.
# Usage: guest-images/linux/fetch-kernel.sh [CACHE_DIR]   (default: target/linux-guest)
set -eu
for t in apt-get dpkg-deb cpio gzip python3; do
  command -v "$t" >/dev/null || { echo "fetch-kernel: needs $t" >&2; exit 1; }
done
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${1:-$root/target/linux-guest}
mkdir -p "$cache/debs" "$cache/x"
cd "$cache/debs"
# linux-image-amd64 is a metapackage; resolve it to the versioned image package.
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "fetch-kernel: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 1; }
ls "$pkg"_*.deb >/dev/null 2>&1 || apt-get download "$pkg"
ls busybox-static_*.deb >/dev/null 2>&1 || apt-get download busybox-static
rm -rf "$cache/x" && mkdir -p "$cache/x"
dpkg-deb -x "$pkg"_*.deb "$cache/x/kernel"
dpkg-deb -x busybox-static_*.deb "$cache/x/busybox"
cp "$cache"/x/kernel/boot/vmlinuz-* "$cache/vmlinuz"
"$root/guest-images/linux/extract-vmlinux.sh" "$cache/vmlinuz" "$cache/vmlinux"
# initramfs: static busybox with /init printing a marker and powering off.
ird="$cache/x/initramfs"
mkdir -p "$ird/bin" "$ird/proc" "$ird/sys" "$ird/dev"
cp "$cache/x/busybox/bin/busybox" "$ird/bin/busybox"
ln -sf busybox "$ird/bin/sh"
cat > "$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox echo "vgpu-linux: /init running"
/bin/busybox mount -t proc proc /proc
/bin/busybox cat /proc/uptime
/bin/busybox poweroff -f
INIT
chmod +x "$ird/init"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -9) > "$cache/initramfs.cpio.gz"
echo "kernel: $cache/vmlinuz ($pkg)"
echo "vmlinux: $cache/vmlinux (boot with --linux)"
echo "initramfs: $cache/initramfs.cpio.gz"
