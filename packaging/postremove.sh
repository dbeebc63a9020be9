#!/bin/sh
# After removal: a purge (dpkg's `purge`) removes what vmnetctl kept to
# outlive a reboot: the projects, the recorded networks.yaml, the DHCP
# leases and this host's WireGuard key, under /var/lib/vmnetctl. A plain
# removal, and rpm's erase, keep them (reinstalling brings the networks
# back), as packages keep the data of a service.
set -e
case "$1" in
  purge) rm -rf /var/lib/vmnetctl ;;
esac
exit 0
