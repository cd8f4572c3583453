#!/bin/sh
# /init of the vgpu-vmm Linux guest (guest-images/linux/build.sh puts it in the initramfs).
# Mounts /proc, /sys and /dev, prints the uptime, then either runs the command given on the
# kernel command line as vgpu_run="..." and stops the VM with its exit status (vgpu-exit), or,
# without one, gives a shell on the console and powers off when it ends.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
read -r up _ < /proc/uptime
echo "vgpu-linux: /init running, uptime $up s"
cd /root || exit 1
if [ -n "$vgpu_run" ]; then
  sh -c "$vgpu_run"
  rc=$?
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
