#!/bin/sh
# Before removal: stop and disable the controller, but only when the
# package goes away, never on an upgrade (the new package's postinstall
# restarts it). dpkg calls this `remove` on removal (`upgrade NEW-VERSION`
# on an upgrade); rpm's %preun gets the number of versions left after it
# (0 on removal; on an upgrade it runs after the new package's %post, with
# 1). The networks and helpers are left to `vmnetctl down --all`, which the
# user runs before removing the package if they want them gone.
set -e
case "$1" in
  remove|purge|0) ;;
  *) exit 0 ;;
esac
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl disable --now vmnetctl.service >/dev/null 2>&1 || true
fi
exit 0
