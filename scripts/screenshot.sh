#!/usr/bin/env bash
# Takes a screenshot of parsim-gui for the README: installs a virtual X server and Mesa's
# software OpenGL (Debian/Ubuntu packages), starts the app under Xvfb with --screenshot (the
# app captures its own window, writes a PNG and exits) and leaves the PNG at OUT.
#
# Usage: scripts/screenshot.sh [OUT.png] [extra parsim-gui flags...]
#   default OUT: docs/gui.png; default flags: --compare 1f1b --search (the README picture:
#   interleaved 1F1B over plain 1F1B, with the search panel's results).
# Or:    scripts/screenshot.sh --measured [OUT.png]
#   default OUT: docs/measured-timeline.png (docs/executor.md's picture): records a trace of
#   tests/fixtures/executor_pp2_dp2_zbv.toml with `parsim execute --trace --trace-predicted`
#   on the CPU backend and opens it in the GUI under its predicted timeline.
# Needs root or sudo for apt-get when the packages are missing. Not run by CI.
# PARSIM_SCREENSHOT_PROFILE=debug uses a debug build (quicker to build, same picture);
# CARGO_TARGET_DIR is honoured.
set -euo pipefail

cd "$(dirname "$0")/.."
MEASURED=0
if [ "${1:-}" = --measured ]; then
    MEASURED=1
    shift
fi
if [ "$MEASURED" = 1 ]; then
    OUT="${1:-docs/measured-timeline.png}"
else
    OUT="${1:-docs/gui.png}"
fi
shift || true
FLAGS=("$@")
if [ ${#FLAGS[@]} -eq 0 ] && [ "$MEASURED" = 0 ]; then
    FLAGS=(--compare 1f1b --search)
fi
WIDTH=1600
HEIGHT=1000

PACKAGES=(xvfb xauth libgl1-mesa-dri libegl1 libegl-mesa0 libgl1 libglx-mesa0
          libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PROFILE="${PARSIM_SCREENSHOT_PROFILE:-release}"
if [ "$PROFILE" = release ]; then
    cargo build --release -p parsim-gui
else
    cargo build -p parsim-gui
fi
BIN="${CARGO_TARGET_DIR:-target}/$PROFILE/parsim-gui"
if [ "$MEASURED" = 1 ]; then
    TRACE="$(mktemp --suffix .json)"
    trap 'rm -f "$TRACE"' EXIT
    CONFIG=tests/fixtures/executor_pp2_dp2_zbv.toml
    if [ "$PROFILE" = release ]; then
        cargo run --release -p parsim-cli -- execute --config "$CONFIG" --steps 2 --warmup 1 \
            --trace "$TRACE" --trace-predicted >/dev/null
    else
        cargo run -p parsim-cli -- execute --config "$CONFIG" --steps 2 --warmup 1 \
            --trace "$TRACE" --trace-predicted >/dev/null
    fi
    FLAGS=(--config "$CONFIG" --trace "$TRACE" "${FLAGS[@]}")
fi
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
# Mesa's llvmpipe renders OpenGL on the CPU; no GPU or display needed.
export LIBGL_ALWAYS_SOFTWARE=1
timeout 300 xvfb-run -a -s "-screen 0 ${WIDTH}x${HEIGHT}x24" \
    "$BIN" --size "${WIDTH}x${HEIGHT}" --screenshot "$OUT" "${FLAGS[@]}"
test -s "$OUT" || { echo "no screenshot was written" >&2; exit 1; }
echo "screenshot: $OUT"
