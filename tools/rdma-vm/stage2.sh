#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Stage 2 of tools/rdma-vm.sh: runs as PID 1 on the host's userland (bash),
# from the run directory rdma-vm.sh filled (vm.conf, env.sh, cmd.sh). It
# builds the RDMA fixture, runs the command and ends the VM. Its own output
# goes to the console.
# vm.conf sets asset_dir, mtu, ip0, ip1, workdir and share_paths; cmd.sh cmd.
# shellcheck disable=SC2154
set -u
run=${BASH_SOURCE[0]%/*}
# shellcheck source=/dev/null
source "$run/vm.conf"
exec </dev/null >/dev/console 2>&1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

up() { local u; u=$(</proc/uptime); echo "${u%% *}"; }
log() { echo "rdma-vm stage2 [$(up)]: $*"; }
# 'b' reboots at once, and QEMU's -no-reboot turns that into its exit. The
# run directory is cache=none 9p, so everything written there has landed.
end_vm() { echo b >/proc/sysrq-trigger; exit 1; }
setup_failed() {
	log "SETUP FAILED: $*"
	echo "$*" >"$run/setup-error"
	end_vm
}
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run || setup_failed "tmpfs on /run"
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts || setup_failed "devpts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm || setup_failed "tmpfs on /dev/shm"
ln -sfn /proc/self/fd /dev/fd
ln -sfn /proc/self/fd/0 /dev/stdin
ln -sfn /proc/self/fd/1 /dev/stdout
ln -sfn /proc/self/fd/2 /dev/stderr
echo rdma-vm >/proc/sys/kernel/hostname
# sleep without exec'ing sleep (each exec is slow under TCG): a read that
# times out on a pipe nobody writes to
exec {nap_fd}<> <(:)
nap() { read -r -t "$1" -u "$nap_fd" || true; }
rd() { [[ -r $1 ]] && echo "$(<"$1")"; }

# The host has no modules for this kernel; the cache has them.
mkdir -p /lib/modules && mount --bind "$asset_dir/lib/modules" /lib/modules ||
	setup_failed "cannot bind the kernel modules from $asset_dir"
modprobe -a veth rdma_rxe rdma_ucm || setup_failed "modprobe veth rdma_rxe rdma_ucm"
log "modules loaded"

# Network. Both rxe devices must sit in the initial namespace (rxe's UDP
# tunnel socket lives there), so both ends of the veth pair do too, and
# 10.99.0.1 and .2 are then both local addresses of one kernel:
#  - rxe pins its egress netdev, so RoCE packets do cross the veth, but they
#    arrive carrying a source address that is local too: accept_local=1 and
#    rp_filter=0 keep the receiving veth from dropping them as martians;
#  - ordinary sockets between the two addresses would short-cut through lo;
#    policy routing (packets generated here for the peer address -> table
#    100 -> out of the veth; the local table consulted after that rule)
#    sends TCP across the pair as well, as between two hosts;
#  - permanent neighbour entries save the ARP round trips.
ip link set lo up || setup_failed "lo"
ip link add veth0 type veth peer name veth1 || setup_failed "veth pair"
for nd in veth0 veth1; do echo 1 >"/proc/sys/net/ipv6/conf/$nd/disable_ipv6"; done
for nd in all default veth0 veth1; do
	echo 0 >"/proc/sys/net/ipv4/conf/$nd/rp_filter"
	echo 1 >"/proc/sys/net/ipv4/conf/$nd/accept_local"
done
mac0=$(</sys/class/net/veth0/address)
mac1=$(</sys/class/net/veth1/address)
ip -batch - <<NET || setup_failed "ip -batch (addresses, routes, neighbours)"
link set veth0 mtu $mtu
link set veth1 mtu $mtu
addr add $ip0/24 dev veth0
addr add $ip1/24 dev veth1
link set veth0 up
link set veth1 up
rule add pref 100 iif lo lookup 100
route add $ip1/32 dev veth0 src $ip0 table 100
route add $ip0/32 dev veth1 src $ip1 table 100
rule add pref 200 lookup local
rule del pref 0 lookup local
neigh replace $ip1 lladdr $mac1 dev veth0 nud permanent
neigh replace $ip0 lladdr $mac0 dev veth1 nud permanent
NET
rdma link add rxe0 type rxe netdev veth0 || setup_failed "rdma link add rxe0"
rdma link add rxe1 type rxe netdev veth1 || setup_failed "rdma link add rxe1"

# The GID of an IPv4 address is ::ffff:a.b.c.d; find where each device put
# it with type RoCE v2, and wait for both ports to go ACTIVE.
v4gid() {
	local IFS=. a b c d
	read -r a b c d <<<"$1"
	printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
}
find_gid() { # dev ip -> index on stdout
	local p=/sys/class/infiniband/$1/ports/1 want f i t
	want=$(v4gid "$2")
	for f in "$p"/gids/*; do
		[[ $(rd "$f") == "$want" ]] || continue
		i=${f##*/}
		t=$(rd "$p/gid_attrs/types/$i" 2>/dev/null) || t=
		if [[ $t == "RoCE v2" ]]; then echo "$i"; return 0; fi
	done
	return 1
}
gid0='' gid1='' st0='' st1=''
deadline=$((SECONDS + 60))
while ((SECONDS < deadline)); do
	st0=$(rd /sys/class/infiniband/rxe0/ports/1/state) || st0=
	st1=$(rd /sys/class/infiniband/rxe1/ports/1/state) || st1=
	gid0=$(find_gid rxe0 "$ip0") || gid0=
	gid1=$(find_gid rxe1 "$ip1") || gid1=
	[[ $st0 == *ACTIVE && $st1 == *ACTIVE && -n $gid0 && -n $gid1 ]] && break
	nap 0.05
done
[[ $st0 == *ACTIVE && $st1 == *ACTIVE ]] || setup_failed "rxe ports not ACTIVE (rxe0: '$st0', rxe1: '$st1')"
[[ -n $gid0 && -n $gid1 ]] || setup_failed "no IPv4 RoCE v2 GID on rxe0/rxe1"
[[ $gid0 == "$gid1" ]] || setup_failed "IPv4 RoCE v2 GID at different indices (rxe0: $gid0, rxe1: $gid1)"
log "rxe0/rxe1 ACTIVE, RoCE v2 GID index $gid0"

# Read-write shares at their host paths; parents were sorted first.
for ((i = 0; i < ${#share_paths[@]}; i++)); do
	mkdir -p "${share_paths[i]}" &&
		mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=mmap "kvp_share$i" "${share_paths[i]}" ||
		setup_failed "cannot mount the share ${share_paths[i]}"
done
[[ -d $workdir ]] || setup_failed "working directory $workdir is not reachable in the guest"
ulimit -l unlimited
ulimit -n 65536
echo "$(up)" >"$run/ready"
log "ready"

(
	cd "$workdir" || exit 125
	# shellcheck source=/dev/null
	source "$run/env.sh"
	export KVP_RDMA_VM=1 KVP_RDMA_DEV0=rxe0 KVP_RDMA_DEV1=rxe1 \
		KVP_RDMA_NETDEV0=veth0 KVP_RDMA_NETDEV1=veth1 \
		KVP_RDMA_IP0=$ip0 KVP_RDMA_IP1=$ip1 KVP_RDMA_GID_INDEX=$gid0
	# shellcheck source=/dev/null
	source "$run/cmd.sh"
	exec "${cmd[@]}"
) >"$run/stdout" 2>"$run/stderr"
rc=$?
echo "$rc" >"$run/exit-status.tmp" && mv "$run/exit-status.tmp" "$run/exit-status"
log "command exited with status $rc"
sync
end_vm
