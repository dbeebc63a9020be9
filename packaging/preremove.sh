#!/bin/sh
# Stop the service; networks and helpers are left to `vmnetctl down --all`,
# which the user runs before removing the package if they want them gone.
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl disable --now vmnetctl.service >/dev/null 2>&1 || true
fi
