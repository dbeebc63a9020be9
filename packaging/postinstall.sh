#!/bin/sh
# After install or upgrade, as debhelper's dh_installsystemd and the
# %systemd_post/%systemd_postun_with_restart rpm macros do: on a first
# install, enable the controller and start it; on an upgrade, restart it if
# it runs (try-restart: an admin's disable or stop is kept) so the new
# binary serves. dpkg calls this `configure [OLD-VERSION]` (OLD-VERSION set
# on an upgrade), rpm's %post with the number of versions installed now (1
# on a first install, 2 or more on an upgrade). Nothing is done where
# systemd does not run or when dpkg installs into another root (DPKG_ROOT).
set -e
action=
case "$1" in
  configure) if [ -n "$2" ]; then action=upgrade; else action=install; fi ;;
  1) action=install ;;
  [0-9]*) action=upgrade ;;
esac
if [ -n "$action" ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
  if [ "$action" = install ]; then
    systemctl enable --now vmnetctl.service >/dev/null 2>&1 || true
  else
    systemctl try-restart vmnetctl.service >/dev/null 2>&1 || true
  fi
fi
exit 0
