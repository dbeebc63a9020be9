#!/usr/bin/env bash
# Installs what vmnetctl's tests need on a fresh Debian machine. Idempotent and
# quick when everything is there. Called by `make test`; needs root to install.
# Exits non-zero, saying what is missing, when it cannot provide everything:
# with CI=true the tests fail on a missing prerequisite rather than skip, and
# a broken machine should fail here first, with the clearest message.
set -euo pipefail

packages=(
  iproute2 nftables procps psmisc    # data plane: ip, nft, ps/pkill
  busybox-static                     # udhcpc, ping, nc in simulated VMs and guests
  iperf3 iputils-ping                # throughput tests and benchmarks; ping -f floods
  socat                              # helper socket tests
  prometheus                         # metrics: a real Prometheus scrapes us; promtool
  qemu-system-x86 cpio linux-image-amd64  # real guests in test/e2e
  slirp4netns                        # a peer to benchmark against
  util-linux                         # setpriv: qemu as an unprivileged user; unshare, mount: the packages' scripts
  systemd rpm                        # packages: systemd-analyze verify of the unit; rpm -qlp and the .rpm's scriptlets
  iptables                           # doctor: Docker's FORWARD DROP and its printed fix, in a namespace
  python3-pytest python3-scapy       # vmnet-helper's own suite against our helper (test/vmnethelpersuite)
  tcpdump                            # capture --filter: libpcap's compiler (tcpdump -ddd)
)

# The commands the tests run (testutil.RequireCommands), checked after
# installing: a package that installed but left no command is a failure too.
commands=(ip bridge nft sysctl ps pkill pgrep busybox iperf3 ping socat prometheus promtool qemu-system-x86_64 cpio slirp4netns setpriv unshare mount dpkg-deb make systemd-analyze rpm iptables vtysh tcpdump)

fail() {
  echo "test/setup.sh: $*" >&2
  exit 1
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    fail "missing packages: ${missing[*]}; run it as root (sudo test/setup.sh) to install them"
  fi
  echo "test/setup.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || fail "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    fail "apt-get install ${missing[*]} failed"
fi

# --- FRR (zebra, bgpd, vtysh) for the EVPN tests (TestEVPN) ---
# The tests start their own daemons, one FRR per namespace; installing the
# package must not start the host's own FRR (a service set up with it), so
# it is installed under a policy-rc.d that denies starting services, made
# here and removed after (one that is there already is left as it is).
if ! dpkg-query -W -f='${Status}' frr 2>/dev/null | grep -q "install ok installed"; then
  [ "$(id -u)" -eq 0 ] || fail "missing package: frr; run it as root (sudo test/setup.sh) to install it"
  echo "test/setup.sh: installing frr (its service not started)" >&2
  policy=/usr/sbin/policy-rc.d
  made_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# test/setup.sh: no service starts while frr installs\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  ok=1
  { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends frr >/dev/null; } || ok=""
  [ -z "$made_policy" ] || rm -f "$policy"
  [ -n "$ok" ] || fail "apt-get install frr failed"
fi
for d in zebra bgpd; do
  [ -x "/usr/lib/frr/$d" ] || fail "/usr/lib/frr/$d is missing after installing frr"
done
# --- end FRR ---

absent=()
PATH="$PATH:/usr/sbin:/sbin"  # nft and ip live there; a user's PATH may lack them
for c in "${commands[@]}"; do
  command -v "$c" >/dev/null 2>&1 || absent+=("$c")
done
[ ${#absent[@]} -eq 0 ] || fail "commands still missing after installing: ${absent[*]}"

# A guest kernel: a /boot/vmlinuz-VER with its modules (test/e2e/guest).
kernel=""
for k in /boot/vmlinuz-*; do
  [ -e "$k" ] && [ -e "/lib/modules/${k#/boot/vmlinuz-}/modules.dep" ] && kernel=$k
done
[ -n "$kernel" ] || [ -n "${VMNETCTL_E2E_KERNEL:-}" ] ||
  fail "no /boot/vmlinuz-VER with /lib/modules/VER/modules.dep (linux-image-amd64) for the guests of test/e2e"

# gvproxy, a peer of the throughput benchmark (bench/), is a Go program, not
# a Debian package: `go install`ed at a pinned version into bin/tools
# (git-ignored), where the benchmark looks first. Keep the version in step
# with gvproxyVersion in bench/throughput_linux_test.go.
gvproxy_version=v0.8.9
root="$(cd "$(dirname "$0")/.." && pwd)"
gvproxy="$root/bin/tools/gvproxy"
go="${GO:-go}"
command -v "$go" >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
if ! { [ -x "$gvproxy" ] && "$go" version -m "$gvproxy" 2>/dev/null |
  grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/containers/gvisor-tap-vsock[[:space:]]+$gvproxy_version[[:space:]]"; }; then
  command -v "$go" >/dev/null 2>&1 || fail "go not found: it is needed to install gvproxy $gvproxy_version"
  echo "test/setup.sh: installing gvproxy $gvproxy_version into bin/tools" >&2
  GOOS= GOARCH= GOBIN="$root/bin/tools" "$go" install "github.com/containers/gvisor-tap-vsock/cmd/gvproxy@$gvproxy_version" ||
    fail "go install github.com/containers/gvisor-tap-vsock/cmd/gvproxy@$gvproxy_version failed"
fi
"$gvproxy" -version >/dev/null 2>&1 || fail "$gvproxy does not run"
exit 0
