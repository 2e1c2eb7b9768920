#!/usr/bin/env bash
# Installs the Debian packages shardplan builds with, only those that are missing.
# Usage: scripts/deps.sh [extra packages...]   (run as root, or with sudo available)
set -euo pipefail
packages=(build-essential cmake ninja-build ccache python3
          libboost-regex-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
          libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev libtbb-dev librange-v3-dev
          libopenmpi-dev openmpi-bin libxxhash-dev libtomlplusplus-dev python3-numpy
          chromium tesseract-ocr fonts-dejavu-core  # the HTML report's rendering test
          coinor-libcbc-dev pkgconf  # the partitioner's integer-program comparison (a test only)
          "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
