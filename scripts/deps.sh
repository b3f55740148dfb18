#!/usr/bin/env bash
# Installs the Debian packages the build needs when they are missing (as root), or names them.
set -euo pipefail
pkgs=(cmake make g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev python3 python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "deps: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "deps: missing Debian packages: ${missing[*]} (install them with: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
