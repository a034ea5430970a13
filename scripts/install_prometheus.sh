#!/usr/bin/env bash
# Install Prometheus (Debian package `prometheus`: /usr/bin/prometheus, /usr/bin/promtool) for
# tests/test_prometheus.py, which checks the documented queries, the dashboard and the alert rules
# against a real Prometheus. Idempotent: does nothing when `prometheus` is on PATH. Never fails:
# without root or apt-get it says why and exits 0 (the test then skips, or fails under
# RL_DATA_REQUIRE_PROMETHEUS=1, as CI sets it).
set -uo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_prometheus: not root: cannot apt-get install prometheus (install the Debian package prometheus by hand; tests/test_prometheus.py skips without it)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_prometheus: no apt-get on this machine: install Prometheus by hand (tests/test_prometheus.py skips without it)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "install_prometheus: installing the Debian package prometheus (apt-get; about a minute)"
# a fresh machine may have no package lists yet
if ! apt-cache show prometheus >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1 || echo "install_prometheus: apt-get update failed"
fi
log="$(mktemp)"
if apt-get install -y -qq --no-install-recommends prometheus >"$log" 2>&1; then
  echo "install_prometheus: $(prometheus --version 2>&1 | head -n 1)"
else
  echo "install_prometheus: apt-get install prometheus failed (tests/test_prometheus.py skips without it); its last lines:"
  tail -n 15 "$log"
fi
rm -f "$log"
exit 0
