#!/bin/sh
# Builds the vgpu-vmm Linux guest under target/linux-guest (override: VGPU_LINUX_CACHE):
#   vmlinux          Linux 6.1 from Debian's linux-source-6.1: `make tinyconfig` + guest.config,
#                    with the PVM patches in patches/ (see patches/README.md); rebuilt only when
#                    the source version, the config, the patches or the compiler change
#   rootfs.ext2      the root file system, a read-only ext2 image that vgpu-vmm attaches as the
#                    guest's last virtio disk: busybox-static, /init (init.sh), /etc/fstab and the
#                    guest tools (vgpu, linked as vgpu-smi, vgpu-run, vgpu-exit), static. A link
#                    to rootfs-KEY.ext2, KEY a hash of its contents: an image is never rewritten
#                    (a snapshot of a running guest keeps reading the one it booted from), a new
#                    one is made when the contents change (cargo keeps the tools' build
#                    incremental). Not an initramfs: the kernel copies every initramfs byte in
#                    PVM's CPL0 emulator (~12 s for 3.3 MB), while a disk's pages arrive by the
#                    device's copy and only those the guest touches (a boot ~3 s shorter,
#                    docs/performance.md). Old images stay (snapshots of running guests name
#                    them, docs/snapshot.md); remove those no snapshot needs.
# Installs what it lacks from Debian's packages when run as root (apt-get).
# Usage: guest-images/linux/build.sh [--add FILE]...   (FILEs go to /root in the image)
# Prints the two paths; exits non-zero when anything cannot be built.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${VGPU_LINUX_CACHE:-$root/target/linux-guest}
jobs=${VGPU_LINUX_JOBS:-$(nproc)}
extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --add) [ $# -ge 2 ] && [ -f "$2" ] || { echo "build.sh: --add needs a file" >&2; exit 2; }
           extra="$extra $(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
    *) echo "usage: $0 [--add FILE]..." >&2; exit 2 ;;
  esac
done
log() { echo "linux-guest: $*" >&2; }

# --- what the build needs, from Debian's packages ---
src_tar=/usr/src/linux-source-6.1.tar.xz
need_pkgs=""
for pair in make:make gcc:gcc bc:bc bison:bison flex:flex cpio:cpio xz:xz-utils patch:patch; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_pkgs="$need_pkgs ${pair#*:}"
done
[ -f /usr/include/gelf.h ] || need_pkgs="$need_pkgs libelf-dev"
[ -f "$src_tar" ] || need_pkgs="$need_pkgs linux-source-6.1"
[ -x /bin/busybox ] || need_pkgs="$need_pkgs busybox-static"
# The root image, vgpu-vmm --run's program images and tests/disk.rs's data disk: mke2fs -d.
[ -x /usr/sbin/mke2fs ] || [ -x /sbin/mke2fs ] || need_pkgs="$need_pkgs e2fsprogs"
if [ -n "$need_pkgs" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing$need_pkgs"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    apt-get install -y --no-install-recommends $need_pkgs >&2 ||
      { apt-get update >&2 && apt-get install -y --no-install-recommends $need_pkgs >&2; } ||
      { log "cannot install$need_pkgs"; exit 1; }
  else
    log "missing$need_pkgs (install them: apt-get install$need_pkgs)"; exit 1
  fi
fi
case "$(file -b /bin/busybox 2>/dev/null || echo static)" in
  *dynamic*) log "/bin/busybox is dynamically linked: install busybox-static"; exit 1 ;;
esac

# --- the kernel (cached by a key over its inputs) ---
mkdir -p "$cache"
src_ver=$(dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null || stat -c %s-%Y "$src_tar")
key=$( { echo "$src_ver"; gcc --version | head -1; grep -E '^(CONFIG_|# CONFIG_)' "$here/guest.config"; cat "$here"/patches/*.patch; } |
       sha256sum | cut -c1-16)
kdir=$cache/kernel
if [ -f "$kdir/vmlinux" ] && [ "$(cat "$kdir/.vgpu-key" 2>/dev/null)" = "$key" ]; then
  log "kernel up to date ($key)"
else
  log "building the kernel (linux-source-6.1 $src_ver, key $key): a few minutes"
  start=$(date +%s)
  # A tree prepared for this key (extracted, patched, configured) is built on incrementally.
  if [ "$(cat "$kdir/.vgpu-prepared" 2>/dev/null)" != "$key" ]; then
    rm -rf "$kdir"
    mkdir -p "$kdir"
    tar -xJf "$src_tar" -C "$kdir" --strip-components=1
    for p in "$here"/patches/*.patch; do
      patch -d "$kdir" -p1 --quiet --forward < "$p" || { log "patch $p does not apply"; exit 1; }
    done
    make -C "$kdir" -s tinyconfig >&2
    "$kdir/scripts/kconfig/merge_config.sh" -m -O "$kdir" "$kdir/.config" "$here/guest.config" >/dev/null
    make -C "$kdir" -s olddefconfig >&2
    # Every option the fragment sets must have survived olddefconfig (a dependency may drop it).
    grep -E '^(CONFIG_[A-Z0-9_]+=|# CONFIG_[A-Z0-9_]+ is not set)' "$here/guest.config" | while read -r line; do
      case "$line" in
        "# "*) opt=${line#\# }; opt=${opt%% *}
               ! grep -q "^$opt=[ym]" "$kdir/.config" || { log "$opt should be off"; exit 1; } ;;
        *) grep -qx "$line" "$kdir/.config" || { log "config lost: $line"; exit 1; } ;;
      esac
    done
    echo "$key" > "$kdir/.vgpu-prepared"
  fi
  nice -n 10 make -C "$kdir" -s -j"$jobs" vmlinux >&2
  echo "$key" > "$kdir/.vgpu-key"
  log "kernel built in $(( $(date +%s) - start )) s"
fi
cp "$kdir/vmlinux" "$cache/vmlinux"

# --- the guest tools: one static binary ---
cargo=${CARGO:-cargo}
tools_target=x86_64-unknown-linux-gnu
# A nested cargo (this script run from a test) must not take the outer build's flags.
unset CARGO_ENCODED_RUSTFLAGS RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER CARGO_BUILD_RUSTFLAGS
# Small (every page the guest touches costs emulated kernel work to bring in).
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" \
  "$cargo" build --quiet --release -p vgpu-linux-tools --bin vgpu --target "$tools_target" \
  --config 'profile.release.opt-level="s"' --config profile.release.lto=true \
  --config profile.release.codegen-units=1 --config 'profile.release.panic="abort"' \
  --manifest-path "$root/Cargo.toml" --target-dir "$cache/tools-target" >&2
tool="$cache/tools-target/$tools_target/release/vgpu"

# --- the root file system: a read-only ext2 image, named by its contents ---
# Per-process names: two runs at once never share a stage or a half-written image.
stage="$cache/rootfs-stage.$$"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/etc" "$stage/root"
for d in dev proc sys tmp mnt run; do mkdir -p "$stage/$d"; done
# --run: the program's image is mounted at /run/prog; the x86-64 loader's path leads there.
ln -s /run/prog/lib "$stage/lib64"
cp /bin/busybox "$stage/bin/busybox"
for a in sh mount mkdir cat echo ls poweroff sleep dmesg uname head grep hexdump; do
  ln -s busybox "$stage/bin/$a"
done
cp "$tool" "$stage/bin/vgpu"
for a in vgpu-smi vgpu-run vgpu-exit lspci; do ln -s vgpu "$stage/bin/$a"; done
cp "$here/init.sh" "$stage/init"
chmod 0755 "$stage/init" "$stage/bin/busybox" "$stage/bin/vgpu"
# What /init mounts with one `mount -a` (each exec costs emulated kernel work); /dev is the
# kernel's devtmpfs (DEVTMPFS_MOUNT). Writable: /tmp and /run, in RAM (/init makes /run/prog
# and /run/work there; the guest's libcuda keeps its state in /run/vgpu-cuda).
cat > "$stage/etc/fstab" <<'FSTAB'
proc /proc proc defaults 0 0
sysfs /sys sysfs defaults 0 0
ramfs /tmp ramfs defaults 0 0
ramfs /run ramfs defaults 0 0
FSTAB
for f in "$here"/examples/*.ptx $extra; do cp "$f" "$stage/root/$(basename "$f")"; done
# The key: how the image is made (bump the layout when that changes), every entry's name, type,
# mode and link target, and every file's contents (NUL-separated: any name).
mkfs="mke2fs -q -F -t ext2 -b 4096 -m 0 -L vgpu-root -E root_owner=0:0"
listing=$(cd "$stage" && find . -printf '%p %y %m %l\n' | LC_ALL=C sort)
sums=$(cd "$stage" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
key=$(printf 'vgpu-rootfs-1 %s\n%s\n%s\n' "$mkfs" "$listing" "$sums" | sha256sum | cut -c1-16)
image="$cache/rootfs-$key.ext2"
if [ ! -f "$image" ]; then
  kib=$(( $(du -sk "$stage" | cut -f1) * 5 / 4 + 1024 ))
  # shellcheck disable=SC2086
  $mkfs -d "$stage" "$image.tmp.$$" "${kib}k" >&2
  mv "$image.tmp.$$" "$image"
  log "root image $image ($kib KiB)"
fi
ln -sfn "rootfs-$key.ext2" "$cache/rootfs.ext2.tmp.$$"
mv -T "$cache/rootfs.ext2.tmp.$$" "$cache/rootfs.ext2"
rm -rf "$stage"
echo "vmlinux: $cache/vmlinux"
echo "rootfs: $image"
