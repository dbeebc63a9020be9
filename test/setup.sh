#!/usr/bin/env bash
# Installs what vmnetctl's tests need on a fresh Debian machine. Idempotent and
# quick when everything is there. Called by `make test`; needs root to install.
set -euo pipefail

packages=(
  iproute2 nftables procps psmisc    # data plane: ip, nft, ps/pkill
  busybox-static                     # udhcpc, ping, nc in simulated VMs and guests
  iperf3 iputils-ping                # throughput tests and benchmarks; ping -f floods
  socat                              # helper socket tests
  prometheus                         # metrics: a real Prometheus scrapes us; promtool
  qemu-system-x86 cpio linux-image-amd64  # real guests in test/e2e
  slirp4netns                        # a peer to benchmark against
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "test/setup.sh: missing packages: ${missing[*]} (run as root to install them)" >&2
  exit 0
fi
echo "test/setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
