#!/usr/bin/env bash
# The web page in a real browser (docs/web.md): serves the folder scripts/web-build.sh wrote
# on localhost, opens it in headless Chromium (Debian's, installed when missing) with a
# configuration in the URL, and checks that the canvas draws, that the title carries the
# parameter count the native `parsim estimate --json` gives for the same file, that the
# console has no errors, that a malformed configuration shows the CLI's field-named error,
# and that a search run in the page (in slices between frames) finds the native search's
# fastest mix while frames keep coming. Writes a screenshot; reports the wasm's compressed size and the page's time to its
# first estimate. Usage: scripts/web-test.sh [DIST_DIR] [SCREENSHOT.png]
#        scripts/web-test.sh --prepare   (only installs the browser and its driver; .ci/run
#                                         starts this in the background, early)
set -euo pipefail
cd "$(dirname "$0")/.."
work="target/web-test"
mkdir -p "$work"

if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
# playwright-core only drives the browser (it downloads none); kept out of the repository.
if [ ! -d "$work/node/node_modules/playwright-core" ]; then
    mkdir -p "$work/node"
    npm install --no-save --no-audit --no-fund --silent --prefix "$work/node" playwright-core@1.64.1
fi
[ "${1:-}" = --prepare ] && exit 0

dist="${1:-target/web-dist}"
shot="${2:-$work/web.png}"
mkdir -p "$(dirname "$shot")"
[ -f "$dist/index.html" ] || { echo "web-test: no $dist/index.html (run scripts/web-build.sh)" >&2; exit 1; }

# What the page must show, from the native CLI on the same files.
# `PARSIM` names a built binary (CI passes the debug one its tests built: `cargo run` would
# resolve the root package's features alone and rebuild part of the workspace, about 95 s).
parsim() {
    if [ -n "${PARSIM:-}" ]; then "$PARSIM" "$@"; else cargo run -q --bin parsim -- "$@"; fi
}
expected_params=$(parsim estimate --json --config tests/web/config.toml \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["params"]["total"])')
# The fastest mix of the search the page runs (the GUI's defaults: top 10, micro batch <= 2).
expected_search=$(parsim search --config tests/web/search.toml --top 10 --mbs-max 2 --json \
    | python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"candidates": d["candidates"], "mix": d["top"][0]["mix"], "step_s": d["top"][0]["time"]["step_s"]}))')
malformed_error=$(parsim estimate --config tests/web/malformed.toml 2>&1 >/dev/null || true)
case "$malformed_error" in
    *"field \`cluster.num_gpus\`"*) ;;
    *) echo "web-test: the CLI no longer names cluster.num_gpus: $malformed_error" >&2; exit 1 ;;
esac

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server -d "$dist" --bind 127.0.0.1 "$port" >"$work/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT

gz=$(gzip -9 -c "$dist/parsim-gui_bg.wasm" | wc -c)
echo "web-test: wasm $((gz / 1024)) KiB gzip-compressed"

PLAYWRIGHT_CORE="$PWD/$work/node/node_modules/playwright-core" \
URL="http://127.0.0.1:$port/" \
CONFIG_TOML="$(cat tests/web/config.toml)" \
MALFORMED_TOML="$(cat tests/web/malformed.toml)" \
SEARCH_TOML="$(cat tests/web/search.toml)" \
EXPECTED_SEARCH="$expected_search" \
EXPECTED_PARAMS="$expected_params" \
CLI_ERROR="$malformed_error" \
SCREENSHOT="$shot" \
USER_DATA_DIR="$(mktemp -d)" \
    node scripts/web-test.cjs
