#!/bin/sh
# /init of the vgpu-vmm Linux guest (guest-images/linux/build.sh puts it in the root image, a
# read-only ext2 disk; the kernel has mounted its devtmpfs on /dev). Mounts /proc, /sys and the
# writable /tmp and /run (/etc/fstab, one `mount -a`: every exec costs ~0.2-1 s of emulated
# kernel work), makes /run/prog and /run/work, prints the uptime, then either runs a program and stops the VM
# with its exit status (vgpu-exit), or, without one, gives a shell on the console and powers
# off when it ends. The program: with vgpu_prog=NAME (vgpu-vmm --run), the one on the
# read-only image /dev/vda, mounted at /run/prog, whose run.sh is sourced in a subshell (it
# sets LD_LIBRARY_PATH, changes to the writable /run/work and execs the program); else the
# shell command given as vgpu_run="..." on the kernel command line.
export PATH=/bin
# The kernel runs without XSAVE (noxsave: PVM's CPL0 emulator has no XSAVE), so a context
# switch saves and restores only the x87/SSE state (FXSAVE). Under PVM user mode still runs
# with the host's XCR0, and glibc's ifuncs pick AVX2/AVX-512 memcpy, memset and string
# routines: their YMM/ZMM registers (upper halves, ZMM16-31) then carry one process's data into
# another's at the next switch (a large memcpy's first 64 bytes came back as another process's
# bytes). Every program started from here inherits this: glibc stays on its SSE2 routines.
export GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AVX_Fast_Unaligned_Load
mount -a
mkdir -p /run/prog /run/work
# A kernel without DEVTMPFS_MOUNT, or an initramfs root: /dev is still empty.
[ -e /dev/console ] || mount -t devtmpfs devtmpfs /dev
read -r up _ < /proc/uptime
echo "vgpu-linux: /init running, uptime $up s"
cd /root || exit 1
if [ -n "$vgpu_prog" ]; then
  # A fork, not a new shell, for run.sh: each exec costs ~0.2 s in the emulated kernel.
  if mount -t ext2 -o ro /dev/vda /run/prog; then
    ( . /run/prog/run.sh )
    rc=$?
  else
    echo "vgpu-linux: cannot mount the program's image /dev/vda"
    rc=125
  fi
  vgpu_run="$vgpu_prog"
elif [ -n "$vgpu_run" ]; then
  sh -c "$vgpu_run"
  rc=$?
fi
if [ -n "$vgpu_run" ]; then
  read -r up _ < /proc/uptime
  echo "vgpu-linux: '$vgpu_run' exited $rc, uptime $up s"
  vgpu-exit "$rc"
  # Still here: no debug-exit port. Never return (init's end would panic and reboot, which
  # the VMM reports as exit 0): wait for the VMM's --timeout instead.
  echo "vgpu-linux: vgpu-exit failed; waiting"
  while :; do sleep 3600; done
fi
echo "vgpu-linux: shell (lspci, vgpu-smi, vgpu-run --help; exit to power off)"
sh
poweroff -f
