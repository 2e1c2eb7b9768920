#!/usr/bin/env bash
# Writes the UCI 8x8 handwritten digits (1,797 rows: 64 pixels 0..16, then the label) as CSV to
# the path given (default: build/data/digits.csv). The data comes from Debian's python3-sklearn
# package, which ships it as sklearn/datasets/data/digits.csv.gz: the package is downloaded with
# apt-get and only that file is unpacked (no Python needed). Does nothing when the file exists.
set -euo pipefail
out=${1:-build/data/digits.csv}
[[ -s $out ]] && exit 0
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -qq python3-sklearn >/dev/null 2>&1) || {
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  (cd "$tmp" && apt-get download -qq python3-sklearn >/dev/null 2>&1)
}
deb=$(ls "$tmp"/python3-sklearn_*.deb)
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards '*/sklearn/datasets/data/digits.csv.gz'
zcat "$(find "$tmp" -name digits.csv.gz)" > "$out.part"
mv "$out.part" "$out"
echo "wrote $out ($(wc -l < "$out") rows)"
