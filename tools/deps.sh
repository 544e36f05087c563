#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install what kvproxy needs to build, test and run its demo on Debian 12.
# Used by tools/test.sh, tools/demo.sh and .ci/run. Does nothing when every
# package is already installed; otherwise needs root (apt-get).
set -euo pipefail

PACKAGES=(
	clang
	gcc
	iperf3
	iproute2
	libclang-rt-14-dev
	libconfig-dev
	libdpdk-dev
	libibverbs-dev
	libjansson-dev
	libssl-dev
	liburing-dev
	meson
	ninja-build
	nftables
	pkg-config
	python3
)

missing=()
for p in "${PACKAGES[@]}"; do
	if [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) != installed ]]; then
		missing+=("$p")
	fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
	echo "deps: all ${#PACKAGES[@]} packages present"
	exit 0
fi

echo "deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
	echo "deps: need root to install packages (run as root)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update </dev/null
apt-get install -y --no-install-recommends "${PACKAGES[@]}" </dev/null
