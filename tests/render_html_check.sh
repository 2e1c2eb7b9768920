#!/usr/bin/env bash
# The HTML report as a browser shows it: `shardplan plan --html` on the embedded model (or,
# with a third argument, `shardplan train-plan --html` on that config.json; with `memory TRACE`,
# `shardplan trace memory TRACE --html`), a screenshot by headless Chromium, then checks that
# the picture is not blank (size, colours) and that OCR (tesseract) reads the title and a
# heading in it.
# Usage: tests/render_html_check.sh SHARDPLAN_BINARY WORK_DIR [TRAIN_CONFIG | memory TRACE]
# Needs chromium and tesseract-ocr (scripts/deps.sh installs them); fails when either is missing.
set -euo pipefail
cli=$1
work=$2
train_config=${3:-}

fail() {
  echo "render_html_check: FAILED: $*" >&2
  exit 1
}
for tool in chromium tesseract python3; do
  command -v "$tool" >/dev/null ||
    fail "'$tool' is not installed (scripts/deps.sh installs chromium and tesseract-ocr)"
done

rm -rf "$work"
mkdir -p "$work"
html=$work/plan.html
png=$work/plan.png
if [[ $train_config == memory ]]; then
  "$cli" trace memory "${4:?memory needs a trace}" --html "$html" >"$work/stdout.txt" ||
    fail "shardplan trace memory --html exited $?"
  title_words=("shardplan" "memory" "trace.json")
  heading="Live at the peak"
elif [[ -z $train_config ]]; then
  "$cli" plan --summary --html "$html" >"$work/stdout.txt" || fail "shardplan plan --html exited $?"
  title_words=("shardplan" "LLaMA-2-7B" "embedded example" "Mesh")
  heading="Bytes per device"
else
  "$cli" train-plan -c "$train_config" --mesh fsdp:8 --batch 8 --seq 256 --hardware h100-sxm \
    --html "$html" >"$work/stdout.txt" || fail "shardplan train-plan --html exited $?"
  title_words=("shardplan" "train-plan" "parameters" "Mesh")
  heading="Live bytes over the step"
fi
[[ -s $html ]] || fail "$html was not written"

# Root (as in CI containers) needs --no-sandbox; a private profile keeps runs independent.
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$work/profile" --window-size=1200,2000 --screenshot="$png" \
  "file://$html" >"$work/chromium.log" 2>&1 || fail "chromium exited $? (log: $work/chromium.log)"
[[ -s $png ]] || fail "chromium wrote no screenshot (log: $work/chromium.log)"

# Not blank: the PNG is 1200x2000, has many colours, and the background covers at most 90%.
python3 - "$png" <<'EOF' || fail "the screenshot $png looks blank"
import collections, struct, sys, zlib

path = sys.argv[1]
data = open(path, 'rb').read()
if data[:8] != b'\x89PNG\r\n\x1a\n':
    sys.exit(f'{path}: not a PNG')
pos, idat = 8, b''
while pos < len(data):
    (n,) = struct.unpack('>I', data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b'IHDR':
        w, h, depth, ctype, _, _, interlace = struct.unpack('>IIBBBBB', body)
    elif kind == b'IDAT':
        idat += body
if depth != 8 or ctype not in (2, 6) or interlace:
    sys.exit(f'{path}: unexpected PNG format (bit depth {depth}, colour type {ctype})')
bpp = 3 if ctype == 2 else 4
stride = w * bpp
raw = zlib.decompress(idat)
prev = bytearray(stride)
colours = collections.Counter()
for y in range(h):
    kind = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if kind == 1:  # PNG row filters: sub, up, average, Paeth
        for x in range(bpp, stride):
            line[x] = (line[x] + line[x - bpp]) & 255
    elif kind == 2:
        line = bytearray((a + b) & 255 for a, b in zip(line, prev))
    elif kind == 3:
        for x in range(stride):
            left = line[x - bpp] if x >= bpp else 0
            line[x] = (line[x] + ((left + prev[x]) >> 1)) & 255
    elif kind == 4:
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        colours[bytes(line[x:x + 3])] += 1
    prev = line
background = colours.most_common(1)[0][1] / (w * h)
print(f'screenshot {w}x{h}, {len(colours)} colours, background {background:.0%}')
if (w, h) != (1200, 2000):
    sys.exit(f'{path}: {w}x{h}, expected 1200x2000')
if len(colours) < 64 or background > 0.9:
    sys.exit(f'{path}: {len(colours)} colours, background {background:.0%} of the picture')
EOF

# The title, read back from the pixels.
tesseract "$png" - >"$work/ocr.txt" 2>"$work/tesseract.log" || fail "tesseract exited $?"
title=$(head -n 3 "$work/ocr.txt" | tr '\n' ' ')
for word in "${title_words[@]}"; do
  grep -qF -- "$word" <<<"$title" ||
    fail "OCR of $png did not find '$word' in the title; it read: $title"
done
grep -qF "$heading" "$work/ocr.txt" || fail "OCR did not find the '$heading' heading"
echo "render_html_check: ok (title read back: $title)"
