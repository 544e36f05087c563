#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# rdma-vm.sh - run one command against real RDMA verbs on a machine that has
# no RDMA NIC (and possibly no InfiniBand support in its kernel).
#
# A throw-away QEMU VM boots Debian's stock kernel, which ships rdma_rxe
# (Soft-RoCE), and wires two rxe devices back to back in the guest's one
# network namespace:
#
#     rxe0 on veth0 10.99.0.1/24  <--- veth pair --->  rxe1 on veth1 10.99.0.2/24
#
# The guest has no userland of its own. It mounts this machine's root file
# system read-only over virtio-9p, under a tmpfs overlay that takes the
# writes, so programs built here run inside unchanged. The caller's working
# directory (and every --share DIR) is mounted read-write at the same path:
# meson build directories keep absolute paths (rpaths, test arguments), and
# those must resolve identically inside. The VM has no network device at all;
# 10.99.0.0/24 exists only inside the guest kernel.
#
# Usage:
#   tools/rdma-vm.sh --prepare                     install packages, build the cache
#   tools/rdma-vm.sh [options] -- CMD [ARGS...]    run CMD inside the VM
#
# Exit status: CMD's own; 124 when --timeout expired; 125 when the VM could
# not be prepared, booted or set up; 77 when this machine cannot host the VM
# at all (not root, and packages or cached assets are missing), with the
# reason on stderr. 77 is what meson (and automake) read as "skipped".
set -euo pipefail

readonly ME=rdma-vm
readonly EXIT_SKIP=77
readonly EXIT_TIMEOUT=124
readonly EXIT_VM=125
# The guest's two scripts: rdma-vm/stage1-init.sh (the initramfs's /init)
# and rdma-vm/stage2.sh (PID 1 on this machine's userland).
VM_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/rdma-vm
readonly VM_LIB

# ------------------------------------------------------------------ settings
cache_dir=${KVP_RDMA_VM_CACHE:-}
accel=${KVP_RDMA_VM_ACCEL:-auto}
kernel_pkg=${KVP_RDMA_VM_KERNEL:-}	# e.g. linux-image-6.1.0-57-amd64; default: what linux-image-amd64 pulls
vcpus=2
mem_mib=1024
mtu=1500
timeout_s=600
boot_timeout_s=180
verbose=${KVP_RDMA_VM_VERBOSE:-0}
keep=0
prepare_only=0
shares=()

usage() {
	cat <<'EOF'
usage: tools/rdma-vm.sh --prepare
       tools/rdma-vm.sh [options] -- CMD [ARGS...]

Boots a QEMU VM (Debian's stock kernel) with two Soft-RoCE devices wired back
to back and runs CMD inside, as root, in the caller's directory, with the
caller's environment plus:
  KVP_RDMA_VM=1  KVP_RDMA_DEV0=rxe0  KVP_RDMA_DEV1=rxe1
  KVP_RDMA_NETDEV0=veth0  KVP_RDMA_NETDEV1=veth1
  KVP_RDMA_IP0=10.99.0.1  KVP_RDMA_IP1=10.99.0.2
  KVP_RDMA_GID_INDEX=<index of the IPv4 RoCE v2 GID on both devices>
CMD's stdout and stderr come back on ours.

options:
  --prepare          install missing packages and build the asset cache, then exit
  --timeout S        limit for boot + CMD, in seconds (default 600)      -> 124
  --boot-timeout S   limit until the guest is ready (default 180)        -> 125
  --share DIR        also mount DIR read-write at the same path (repeatable;
                     the caller's directory is always shared unless it is /)
  --cpus N           vCPUs (default 2; one vCPU makes every round trip wait
                     for a scheduler tick)
  --mem MiB          guest memory (default 1024)
  --mtu N            MTU of veth0/veth1 (default 1500 -> RDMA MTU 1024)
  --accel A          auto, kvm or tcg (default auto: KVM when /dev/kvm is
                     usable and has booted this kernel before, else TCG)
  --cache DIR        asset cache (default $KVP_RDMA_VM_CACHE, else
                     /var/cache/kvproxy-rdma-vm)
  --keep             keep the run directory (guest console log) for debugging
  -v, --verbose      progress on stderr; twice: also the guest console
  -h, --help

exit status: CMD's; 124 timeout; 125 VM could not be prepared/booted/set up;
77 this machine cannot host the VM (reason on stderr).
EOF
}

# Our own messages go to a saved copy of stderr, so that they survive the
# stretch where fd 2 is silenced (see boot_once).
exec {msg_fd}>&2
say() { printf '%s: %s\n' "$ME" "$*" >&"$msg_fd"; }
note() { if ((verbose > 0)); then say "$*"; fi; }
fail() { say "error: $*"; exit "$EXIT_VM"; }
skip() { say "cannot run here: $*"; exit "$EXIT_SKIP"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------------ arguments
while (($# > 0)); do
	case $1 in
	--prepare) prepare_only=1 ;;
	--timeout | --boot-timeout | --share | --cpus | --mem | --mtu | --accel | --cache)
		(($# >= 2)) || { say "error: $1 needs a value"; exit 2; }
		case $1 in
		--timeout) timeout_s=$2 ;;
		--boot-timeout) boot_timeout_s=$2 ;;
		--share) shares+=("$2") ;;
		--cpus) vcpus=$2 ;;
		--mem) mem_mib=$2 ;;
		--mtu) mtu=$2 ;;
		--accel) accel=$2 ;;
		--cache) cache_dir=$2 ;;
		esac
		shift
		;;
	--keep) keep=1 ;;
	-v | --verbose) verbose=$((verbose + 1)) ;;
	-vv) verbose=$((verbose + 2)) ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) say "error: unknown argument '$1' (the command goes after '--')"; usage >&2; exit 2 ;;
	esac
	shift
done
if ((prepare_only == 0 && $# == 0)); then
	say "error: no command given"
	usage >&2
	exit 2
fi
for n in timeout_s boot_timeout_s vcpus mem_mib mtu; do
	[[ ${!n} =~ ^[1-9][0-9]*$ ]] || { say "error: ${n%_*} must be a positive integer"; exit 2; }
done
((mem_mib >= 256)) || { say "error: --mem below 256 MiB does not boot"; exit 2; }
((mtu >= 576 && mtu <= 9000)) || { say "error: --mtu must be within 576..9000"; exit 2; }
[[ $accel == auto || $accel == kvm || $accel == tcg ]] || { say "error: --accel must be auto, kvm or tcg"; exit 2; }

is_root() { [[ $(id -u) -eq 0 ]]; }

# depmod, modprobe and friends live in sbin, which a user PATH may lack
PATH=$PATH:/usr/sbin:/sbin

# Default cache: system-wide for root (CI, shared by every checkout);
# a user who cannot write there gets one under their home.
if [[ -z $cache_dir ]]; then
	cache_dir=/var/cache/kvproxy-rdma-vm
	if ! is_root && [[ ! -w $cache_dir ]] && ! compgen -G "$cache_dir/*/ok" >/dev/null; then
		cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/kvproxy-rdma-vm
	fi
fi

# ------------------------------------------------------------------ cleanup
# Everything we start is remembered by pid and only that is stopped.
qemu_pid=
stream_pids=()
run_dir=
work_dir=

stop_pid() { # pid: TERM, a grace period, then KILL
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 20; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.25
	done
	kill -KILL "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317 # (reached through the EXIT trap)
cleanup() {
	local p
	if [[ -n $qemu_pid ]]; then stop_pid "$qemu_pid"; fi
	for p in "${stream_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	if [[ -n $work_dir ]]; then rm -rf "$work_dir"; fi
	if [[ -n $run_dir && -d $run_dir ]]; then
		if ((keep)); then say "run directory kept: $run_dir"; else rm -rf "$run_dir"; fi
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ packages
# What the host must have. The guest runs the host's own userland, so the
# tools used inside (ip, rdma, modprobe, bash) and the rxe verbs provider
# come from here too. busybox-static and the kernel are not installed: they
# are fetched with 'apt-get download' and unpacked into the cache.
apt_opts=(-q -o DPkg::Lock::Timeout=600 -o APT::Sandbox::User=root)

missing_packages() {
	local -A by_cmd=(
		[qemu-system-x86_64]=qemu-system-x86
		[ip]=iproute2
		[rdma]=iproute2
		[modprobe]=kmod
		[depmod]=kmod
		[cpio]=cpio
		[flock]=util-linux
		[setpriv]=util-linux
		[xz]=xz-utils
		[dpkg-deb]=dpkg
		[apt-get]=apt
	)
	local c
	for c in "${!by_cmd[@]}"; do
		command -v "$c" >/dev/null 2>&1 || echo "${by_cmd[$c]}"
	done
	# libraries, which have no command to look for
	compgen -G '/usr/lib/*/libibverbs/librxe-rdmav*.so' >/dev/null || echo ibverbs-providers
	compgen -G '/usr/lib/*/libibverbs.so.1' >/dev/null || echo libibverbs1
}

ensure_packages() {
	local -a need
	mapfile -t need < <(missing_packages | sort -u)
	((${#need[@]} > 0)) || return 0
	is_root || skip "missing packages: ${need[*]}; run 'tools/rdma-vm.sh --prepare' once as root"
	command -v apt-get >/dev/null || skip "missing packages (${need[*]}) and no apt-get to install them"
	say "installing ${need[*]} (apt)"
	local log
	log=$(mktemp "${TMPDIR:-/tmp}/$ME-apt.XXXXXX")
	export DEBIAN_FRONTEND=noninteractive
	# Try the current lists first: an update is slow and may be unreachable.
	if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${need[@]}" >"$log" 2>&1; then
		apt-get "${apt_opts[@]}" update >>"$log" 2>&1 || true
		if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
			tail -n 15 "$log" >&2
			rm -f "$log"
			skip "apt-get install ${need[*]} failed"
		fi
	fi
	rm -f "$log"
	mapfile -t need < <(missing_packages | sort -u)
	((${#need[@]} == 0)) || fail "still missing after apt-get install: ${need[*]}"
}

# ------------------------------------------------------------------ assets
# Cache layout, one directory per kernel package version:
#   $cache_dir/<pkg>_<version>/
#       kernel      ELF vmlinux (booted through its PVH entry) or the bzImage
#       initrd      uncompressed cpio: busybox, 9p/overlay modules, stage 1
#       lib/modules/<kver>/   the kernel's modules, depmod'ed
#       kver  pkg   ok (written last: the entry is complete)

# Prints "<package> <version>" of the kernel to boot, from the apt lists.
# apt-cache takes seconds here, so the answer is kept in the cache until the
# apt lists (or the override) change.
kernel_candidate() {
	local key memo=$cache_dir/candidate answer
	key=$( (stat -c '%n %Y %s' /var/lib/apt/lists/*_Packages* /etc/apt/preferences* 2>/dev/null || true;
		echo "$kernel_pkg") | cksum)
	if [[ -r $memo && $(head -n1 "$memo") == "$key" ]]; then
		answer=$(sed -n 2p "$memo")
		if [[ -n $answer ]]; then echo "$answer"; return 0; fi
	fi
	answer=$(kernel_candidate_apt) || return 1
	if [[ -d $cache_dir && -w $cache_dir ]]; then
		if printf '%s\n%s\n' "$key" "$answer" >"$memo.$$"; then mv -f "$memo.$$" "$memo" || true; fi
	fi
	echo "$answer"
}

kernel_candidate_apt() {
	local pkg=$kernel_pkg ver
	if [[ -z $pkg ]]; then
		pkg=$(apt-cache depends --important linux-image-amd64 2>/dev/null |
			awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
	fi
	[[ -n $pkg ]] || return 1
	ver=$(apt-cache policy "$pkg" 2>/dev/null | awk '$1 == "Candidate:" { print $2; exit }')
	[[ -n $ver && $ver != "(none)" ]] || return 1
	echo "$pkg $ver"
}

# bzImage -> ELF vmlinux. QEMU can start an ELF kernel at its PVH entry
# point, which skips the kernel's self-decompression: seconds under TCG.
# Debian compresses x86 kernels with xz; gzip and zstd are tried as well.
unpack_vmlinux() {
	local bz=$1 out=$2 sig off
	for sig in 'xz:\xFD7zXZ\x00' 'zstd:\x28\xB5\x2F\xFD' 'gzip:\x1F\x8B\x08'; do
		command -v "${sig%%:*}" >/dev/null || continue
		off=$(LC_ALL=C grep -obUaP -m1 "${sig#*:}" "$bz" 2>/dev/null | head -n1 | cut -d: -f1) || true
		[[ -n $off ]] || continue
		case ${sig%%:*} in
		xz) tail -c +$((off + 1)) "$bz" | xz -dcq --single-stream >"$out" 2>/dev/null || true ;;
		zstd) tail -c +$((off + 1)) "$bz" | zstd -dcq 2>/dev/null >"$out" || true ;;
		gzip) tail -c +$((off + 1)) "$bz" | gzip -dcq 2>/dev/null >"$out" || true ;;
		esac
		[[ $(head -c 4 "$out" 2>/dev/null | od -An -tx1 | tr -d ' \n') == 7f454c46 ]] && return 0
	done
	rm -f "$out"
	return 1
}

# Whether the entry at $1 is complete and its initramfs holds the current
# stage 1 (it is baked in there: a changed one means a rebuild; comment
# lines do not count).
entry_current() {
	[[ -f $1/ok ]] || return 1
	cmp -s <(cpio -i --quiet --to-stdout init <"$1/initrd" 2>/dev/null | grep -v '^[[:space:]]*#') \
		<(grep -v '^[[:space:]]*#' "$VM_LIB/stage1-init.sh")
}


build_assets() { # pkg version dest; returns 3 when the download failed
	local pkg=$1 ver=$2 dest=$3 t0 kver m
	t0=$(now)
	say "building VM assets from $pkg $ver (one time, cached in $cache_dir)"
	rm -rf "$cache_dir"/.work.*	# leftovers of an interrupted build; we hold the lock
	work_dir=$(mktemp -d "$cache_dir/.work.XXXXXX")
	if ! (cd "$work_dir" && apt-get "${apt_opts[@]}" download "$pkg=$ver" busybox-static >apt.log 2>&1); then
		tail -n 5 "$work_dir/apt.log" >&2
		return 3
	fi
	dpkg-deb -x "$work_dir"/linux-image-*.deb "$work_dir/pkg" || fail "cannot unpack $pkg"
	dpkg-deb -x "$work_dir"/busybox-static_*.deb "$work_dir/bb" || fail "cannot unpack busybox-static"
	rm -f "$work_dir"/*.deb
	kver=$(ls "$work_dir/pkg/lib/modules")
	[[ -n $kver && $kver != *$'\n'* && -f $work_dir/pkg/boot/vmlinuz-$kver ]] ||
		fail "unexpected layout of $pkg"
	# drivers for hardware the VM never has: 40 % of the modules' size
	rm -rf "$work_dir/pkg/lib/modules/$kver/kernel"/{sound,drivers/{bluetooth,gpu,iio,media,net/wireless,staging}}
	depmod -b "$work_dir/pkg" "$kver" || fail "depmod for $kver failed"
	modprobe -d "$work_dir/pkg" -S "$kver" --show-depends rdma_rxe veth >/dev/null 2>&1 ||
		fail "kernel $kver has no rdma_rxe or veth module"

	# initramfs tree
	local ir=$work_dir/initramfs
	mkdir -p "$ir"/{bin,dev,lower,modules,newroot,proc,rw,sys}
	cp "$work_dir/bb/bin/busybox" "$ir/bin/"
	for m in cat cut dmesg echo insmod mkdir mount sh sleep switch_root tail; do
		ln -s busybox "$ir/bin/$m"
	done
	: >"$ir/modules.order"
	# --show-depends lists each module after what it needs; builtins show as
	# "builtin ...", and are skipped.
	while read -r m; do
		local base=${m##*/}
		base=${base%.xz}
		base=${base%.zst}
		grep -qxF "$base" "$ir/modules.order" && continue
		case $m in
		*.xz) xz -dc "$m" >"$ir/modules/$base" ;;
		*.zst) zstd -dcq "$m" >"$ir/modules/$base" ;;
		*) cp "$m" "$ir/modules/$base" ;;
		esac
		echo "$base" >>"$ir/modules.order"
	done < <(modprobe -d "$work_dir/pkg" -S "$kver" --show-depends -a virtio_pci 9pnet_virtio 9p overlay |
		awk '$1 == "insmod" { print $2 }')
	cp "$VM_LIB/stage1-init.sh" "$ir/init"
	chmod 755 "$ir/init"
	mkdir -p "$work_dir/out/lib/modules"
	# uncompressed: the guest would spend longer inflating it than reading it
	(cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work_dir/out/initrd" ||
		fail "cannot pack the initramfs"

	if grep -qx 'CONFIG_PVH=y' "$work_dir/pkg/boot/config-$kver" &&
		unpack_vmlinux "$work_dir/pkg/boot/vmlinuz-$kver" "$work_dir/out/kernel"; then
		:
	else
		cp "$work_dir/pkg/boot/vmlinuz-$kver" "$work_dir/out/kernel"
	fi
	mv "$work_dir/pkg/lib/modules/$kver" "$work_dir/out/lib/modules/"
	# (errexit does not reach in here: this runs on the left of '||')
	[[ -s $work_dir/out/kernel && -s $work_dir/out/initrd && -s $ir/modules.order &&
		-x $ir/bin/busybox && -f $work_dir/out/lib/modules/$kver/modules.dep ]] ||
		fail "the asset build came out incomplete"
	echo "$kver" >"$work_dir/out/kver"
	echo "$pkg $ver" >"$work_dir/out/pkg"
	touch "$work_dir/out/ok"
	rm -rf "$dest"
	mv "$work_dir/out" "$dest" || fail "cannot move the assets into $dest"
	rm -rf "$work_dir"
	work_dir=
	say "assets ready in $(elapsed "$t0") s: $dest"

	# A new kernel replaces the old ones; drop those unused for a week
	# (a run touches its entry's 'used'), leaving any still in use alone.
	local old
	for old in "$cache_dir"/*/ok; do
		old=${old%/ok}
		[[ -f $old/ok && $old != "$dest" ]] || continue
		[[ -n $(find "$old/used" -mtime -7 2>/dev/null) ]] && continue
		say "removing the stale cache entry $old"
		rm -rf "$old"
	done
}

# Sets asset_dir and kver: a complete cache entry for the current candidate
# kernel, built now if needed. Offline, the newest complete entry is used.
ensure_assets() {
	local cand="" pkg ver rc
	cand=$(kernel_candidate) || true
	if [[ -z $cand ]] && is_root && ! compgen -G "$cache_dir/*/ok" >/dev/null; then
		say "apt lists do not know linux-image-amd64; running apt-get update"
		apt-get "${apt_opts[@]}" update >/dev/null 2>&1 || true
		cand=$(kernel_candidate) || true
	fi
	if [[ -z $cand ]]; then
		asset_dir=$(ls -1dt "$cache_dir"/*/ok 2>/dev/null | head -n1) || true
		[[ -n $asset_dir ]] || skip "cannot resolve linux-image-amd64 through apt and nothing is cached in $cache_dir"
		asset_dir=${asset_dir%/ok}
		note "apt gives no kernel candidate; using the cached $asset_dir"
	else
		pkg=${cand% *}
		ver=${cand#* }
		asset_dir=$cache_dir/${pkg}_$ver
		if ! entry_current "$asset_dir"; then
			[[ ! -f $asset_dir/ok ]] || say "the cached initramfs has an older stage 1; rebuilding $asset_dir"
			mkdir -p "$cache_dir" 2>/dev/null ||
				skip "cannot create the cache $cache_dir (run --prepare as root, or set KVP_RDMA_VM_CACHE)"
			[[ -w $cache_dir ]] || skip "cache $cache_dir is not writable (run --prepare as root, or set KVP_RDMA_VM_CACHE)"
			# one builder at a time; the others wait and then find it done
			exec {lock_fd}>"$cache_dir/.lock"
			flock -w 1200 "$lock_fd" || fail "timed out waiting for $cache_dir/.lock"
			if ! entry_current "$asset_dir"; then
				rc=0
				build_assets "$pkg" "$ver" "$asset_dir" || rc=$?
				if ((rc == 3)); then
					# stale lists name a version the mirror no longer has
					is_root || skip "apt-get download $pkg=$ver failed and only root can refresh the apt lists"
					say "download failed; refreshing the apt lists and trying again"
					apt-get "${apt_opts[@]}" update >/dev/null 2>&1 || true
					cand=$(kernel_candidate) || fail "no linux-image-amd64 candidate after apt-get update"
					pkg=${cand% *}
					ver=${cand#* }
					asset_dir=$cache_dir/${pkg}_$ver
					rc=0
					entry_current "$asset_dir" || build_assets "$pkg" "$ver" "$asset_dir" || rc=$?
				fi
				if ((rc != 0)); then
					if compgen -G "$cache_dir/*/ok" >/dev/null; then
						asset_dir=$(ls -1dt "$cache_dir"/*/ok | head -n1)
						asset_dir=${asset_dir%/ok}
						say "cannot download $pkg $ver; using the cached $asset_dir"
					else
						skip "cannot download $pkg $ver and busybox-static (no apt archive reachable?)"
					fi
				fi
			fi
			exec {lock_fd}>&-
		fi
	fi
	kver=$(<"$asset_dir/kver")
	touch "$asset_dir/used" 2>/dev/null || true
}

# ------------------------------------------------------------------ the VM
# Whether KVM boots this kernel is remembered per host kernel and guest
# kernel: /dev/kvm can exist and still fail (nested virtualization).
kvm_verdict_file() { echo "$cache_dir/kvm.$(uname -r).$(tr ' ' '_' <"$asset_dir/pkg")"; }

pick_accel() {
	[[ $accel != auto ]] && { echo "$accel"; return; }
	if [[ -r /dev/kvm && -w /dev/kvm ]] && [[ $(cat "$(kvm_verdict_file)" 2>/dev/null) != no ]]; then
		echo kvm
	else
		echo tcg
	fi
}

# Comma is the separator in QEMU's option strings; it is escaped by doubling.
qemu_path() { echo "${1//,/,,}"; }

# Waits until QEMU ends or a deadline passes (then stops it), and reaps it
# and the output streams. Sets boot_result for the deadlines; ready_after.
watch_vm() { # accel t0
	local acc=$1 t0=$2 ready=0 booted=0 deadline boot_deadline grace_deadline p
	deadline=$((start_seconds + timeout_s))
	boot_deadline=$((SECONDS + boot_timeout_s))
	grace_deadline=$((SECONDS + 30))	# KVM reaches stage 1 in ~1 s when it works
	while kill -0 "$qemu_pid"; do
		if ((!booted)) && [[ -f $run_dir/booted ]]; then booted=1; fi
		if ((!ready)) && [[ -f $run_dir/ready ]]; then
			ready=1
			ready_after=$(elapsed "$t0")
			note "guest ready after $ready_after s ($acc; guest uptime at stage 1" \
				"$(<"$run_dir/booted") s, ready $(<"$run_dir/ready") s)"
		fi
		if ((SECONDS >= deadline)); then boot_result=timeout; break; fi
		if ((!ready && SECONDS >= boot_deadline)); then boot_result=notready; break; fi
		if [[ $acc == kvm ]] && ((!booted && SECONDS >= grace_deadline)); then
			boot_result=noboot
			break
		fi
		sleep 0.2
	done
	stop_pid "$qemu_pid"
	wait "$qemu_pid" || true
	qemu_pid=
	for p in "${stream_pids[@]}"; do wait "$p" || true; done
	stream_pids=()
}

# One boot. Sets boot_result to one of: exited (exit-status written),
# setup (guest setup failed), noboot (guest never reached stage 1),
# notready (boot timeout), timeout, crashed.
boot_once() {
	local acc=$1 t0 i
	rm -f "$run_dir"/{booted,ready,exit-status,setup-error}
	: >"$run_dir/stdout"
	: >"$run_dir/stderr"
	: >"$run_dir/console.log"

	# shellcheck disable=SC2054 # (the commas belong to QEMU option strings)
	local -a qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -vga none
		-monitor none -serial "file:$run_dir/console.log" -net none -no-reboot
		-machine pc -smp "$vcpus" -m "$mem_mib"
		-kernel "$asset_dir/kernel" -initrd "$asset_dir/initrd"
		-append "console=ttyS0 loglevel=4 panic=-1 mitigations=off nokaslr no_timer_check 8250.nr_uarts=1 rdinit=/init kvp.run=$run_dir"
		-fsdev "local,id=root,path=/,readonly=on,security_model=none,multidevs=remap"
		-device virtio-9p-pci,fsdev=root,mount_tag=kvp_root
		-fsdev "local,id=run,path=$(qemu_path "$run_dir"),security_model=none"
		-device virtio-9p-pci,fsdev=run,mount_tag=kvp_run)
	if [[ $acc == kvm ]]; then
		qemu+=(-accel kvm -cpu host)
	else
		qemu+=(-accel "tcg,thread=multi" -cpu max)
	fi
	for ((i = 0; i < ${#share_paths[@]}; i++)); do
		qemu+=(-fsdev "local,id=share$i,path=$(qemu_path "${share_paths[i]}"),security_model=none,multidevs=remap"
			-device "virtio-9p-pci,fsdev=share$i,mount_tag=kvp_share$i")
	done

	t0=$(now)
	# --pdeathsig: should this script be killed outright (no trap runs), the
	# kernel still takes the VM down with it.
	setpriv --pdeathsig KILL -- "${qemu[@]}" >"$run_dir/qemu.log" 2>&1 &
	qemu_pid=$!
	tail -c +1 -f --pid="$qemu_pid" "$run_dir/stdout" &
	stream_pids+=($!)
	tail -c +1 -f --pid="$qemu_pid" "$run_dir/stderr" >&2 &
	stream_pids+=($!)
	if ((verbose > 1)); then
		tail -c +1 -f --pid="$qemu_pid" "$run_dir/console.log" >&2 &
		stream_pids+=($!)
	fi

	boot_result=crashed
	# fd 2 is silenced while we watch and reap QEMU: when it dies of a signal
	# (QEMU aborts on some nested-KVM hosts), bash would print a job notice.
	watch_vm "$acc" "$t0" 2>/dev/null
	vm_seconds=$(elapsed "$t0")
	if [[ -f $run_dir/exit-status ]]; then
		boot_result=exited
	elif [[ -f $run_dir/setup-error ]]; then
		boot_result=setup
	elif [[ $boot_result == crashed && ! -f $run_dir/booted ]]; then
		boot_result=noboot
	fi
	return 0
}

show_console() {
	say "last lines of the guest console:"
	tail -n 30 "$run_dir/console.log" | sed 's/^/    /' >&2
	if [[ -s $run_dir/qemu.log ]]; then
		say "qemu said:"
		tail -n 10 "$run_dir/qemu.log" | sed 's/^/    /' >&2
	fi
}

run_vm() {
	local acc rc tmp p
	# The run directory's path goes on the kernel command line: keep it plain.
	tmp=${TMPDIR:-/tmp}
	[[ $tmp =~ ^/[A-Za-z0-9._/-]*$ && -d $tmp && -w $tmp ]] || tmp=/tmp
	run_dir=$(mktemp -d "$tmp/$ME.XXXXXX")
	chmod 755 "$run_dir"

	# Read-write shares: the caller's directory (never /) plus --share, by
	# physical path, parents before children, duplicates dropped.
	local -a want=()
	workdir=$(pwd -P)
	[[ $workdir != / ]] && want+=("$workdir")
	for p in "${shares[@]}"; do
		[[ -d $p ]] || fail "--share $p: not a directory"
		p=$(cd "$p" && pwd -P)
		[[ $p != / ]] || fail "--share /: the root is already shared (read-only)"
		want+=("$p")
	done
	mapfile -t share_paths < <(printf '%s\n' "${want[@]}" | awk 'NF' | LC_ALL=C sort -u)

	# Configuration, environment and command for stage 2, all as bash source.
	{
		printf 'asset_dir=%q\nmtu=%q\nip0=10.99.0.1\nip1=10.99.0.2\nworkdir=%q\n' \
			"$asset_dir" "$mtu" "$workdir"
		printf 'share_paths=('
		# (printf repeats its format at least once, even for no arguments)
		if ((${#share_paths[@]} > 0)); then printf ' %q' "${share_paths[@]}"; fi
		printf ' )\n'
	} >"$run_dir/vm.conf"
	local name
	while IFS= read -r name; do
		case $name in
		PWD | OLDPWD | SHLVL | _ | BASH_* | SHELLOPTS | BASHOPTS) continue ;;
		esac
		printf 'export %s=%q\n' "$name" "${!name}"
	done < <(compgen -e) >"$run_dir/env.sh"
	{
		printf 'cmd=('
		printf ' %q' "$@"
		printf ' )\n'
	} >"$run_dir/cmd.sh"
	cp "$VM_LIB/stage2.sh" "$run_dir/stage2.sh"
	chmod 755 "$run_dir/stage2.sh"

	acc=$(pick_accel)
	note "booting $kver ($acc, $vcpus vCPUs, $mem_mib MiB)"
	ready_after="?"
	boot_once "$acc"
	if [[ $acc == kvm && $accel == auto && $boot_result == noboot ]]; then
		say "KVM did not boot the guest; falling back to TCG (remembered in the cache)"
		echo no >"$(kvm_verdict_file)" 2>/dev/null || true
		acc=tcg
		boot_once "$acc"
	elif [[ $acc == kvm && $boot_result == exited ]]; then
		echo yes >"$(kvm_verdict_file)" 2>/dev/null || true
	fi

	case $boot_result in
	exited)
		rc=$(<"$run_dir/exit-status")
		[[ $rc =~ ^[0-9]+$ ]] || rc=$EXIT_VM
		say "$acc guest ready in $ready_after s; command exit status $rc; VM up $vm_seconds s"
		return "$rc"
		;;
	setup) say "error: guest setup failed: $(<"$run_dir/setup-error")" ;;
	timeout)
		say "error: --timeout $timeout_s s expired; VM stopped"
		show_console
		return "$EXIT_TIMEOUT"
		;;
	notready) say "error: the guest was not ready within --boot-timeout $boot_timeout_s s" ;;
	noboot) say "error: the guest kernel did not reach its initramfs" ;;
	*) say "error: the VM stopped before the command reported its status (crash? out of memory?)" ;;
	esac
	show_console
	return "$EXIT_VM"
}

# ------------------------------------------------------------------ main
start_seconds=$SECONDS
ensure_packages
ensure_assets
note "assets: $asset_dir (kernel $kver)"
if ((prepare_only)); then
	say "prepared: $asset_dir"
	exit 0
fi
rc=0
run_vm "$@" || rc=$?
exit "$rc"
