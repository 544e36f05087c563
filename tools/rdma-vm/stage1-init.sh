#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Stage 1 of tools/rdma-vm.sh: the initramfs's /init (busybox sh). It only
# has to reach the host's root: load the virtio/9p/overlay modules, mount the
# root read-only with a tmpfs overlay, mount the run directory, and hand over
# to stage 2 on bash. It is baked into the cached initramfs; rdma-vm.sh
# rebuilds the cache entry when this file changes (comment lines aside).
# shellcheck disable=SC2013,SC2005
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
log() { echo "rdma-vm stage1: $*" >/dev/console; }
die() {
	log "FATAL: $*"
	dmesg | tail -n 20 >/dev/console
	echo b >/proc/sysrq-trigger	# QEMU runs with -no-reboot: this ends it
	sleep 60
}
for m in $(cat /modules.order); do
	insmod "/modules/$m" || log "insmod $m failed"
done
run=
for word in $(cat /proc/cmdline); do
	case $word in kvp.run=*) run=${word#kvp.run=} ;; esac
done
[ -n "$run" ] || die "no kvp.run= on the kernel command line"
o9p=trans=virtio,version=9p2000.L,msize=262144
tries=0
# the virtio device may still be probing when we get here
until mount -t 9p -o "$o9p,ro,cache=loose" kvp_root /lower 2>/dev/null; do
	tries=$((tries + 1))
	[ $tries -lt 100 ] || die "cannot mount the host root (9p tag kvp_root)"
	sleep 0.1
done
mount -t tmpfs -o mode=0755 tmpfs /rw || die "tmpfs for the overlay"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
	die "overlay over the host root"
mkdir -p "/newroot$run"
mount -t 9p -o "$o9p,cache=none" kvp_run "/newroot$run" || die "cannot mount the run directory"
echo "$(cut -d' ' -f1 /proc/uptime)" >"/newroot$run/booted"
for d in dev proc sys; do mount --move "/$d" "/newroot/$d" || die "move /$d"; done
exec switch_root /newroot /bin/bash "$run/stage2.sh"
