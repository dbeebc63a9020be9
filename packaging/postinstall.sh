#!/bin/sh
# Start the controller now and at boot, where systemd runs (not when dpkg
# installs into another root: DPKG_ROOT is set then).
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
  systemctl enable --now vmnetctl.service >/dev/null 2>&1 || true
fi
