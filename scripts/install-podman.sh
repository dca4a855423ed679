#!/usr/bin/env bash
# What `make compose-check` needs besides the venv (podman-compose is pinned in requirements-dev.lock): podman and the
# runc runtime, debootstrap for the stand-in images, iproute2 for the run's network namespace. Installs the missing
# ones with apt-get (root, Debian: CI and the developers' machines); exits non-zero, saying why, when it cannot.
set -euo pipefail

missing=()
for tool in podman runc debootstrap ip; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
echo "install-podman: missing ${missing[*]}; installing podman runc debootstrap iproute2 with apt-get"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-podman: not root: cannot apt-get install" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-podman: no apt-get on this machine" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq podman runc debootstrap iproute2 >/dev/null
for tool in podman runc debootstrap ip; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-podman: $tool still missing after apt-get" >&2; exit 1; }
done
echo "install-podman: $(podman --version)"
