#!/bin/sh
# Start the controller now and at boot, where systemd runs.
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
  systemctl enable --now vmnetctl.service >/dev/null 2>&1 || true
fi
