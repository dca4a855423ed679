#!/usr/bin/env bash
# What the web console's browser test needs besides the venv (selenium is pinned in requirements-dev.lock): Debian's
# chromium and its chromedriver, the same version. Installs them with apt-get (root, Debian: CI and the developers'
# machines); exits non-zero, saying why, when it cannot; the test then skips, naming what is missing.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
echo "install-chromium: chromium or chromedriver missing; installing chromium chromium-driver with apt-get"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-chromium: not root: cannot apt-get install" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get on this machine" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium chromium-driver >/dev/null
for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-chromium: $tool still missing after apt-get" >&2; exit 1; }
done
echo "install-chromium: $(chromium --version 2>/dev/null | head -1)"
