#!/usr/bin/env bash
# Builds the GUI as a static web page (docs/web.md): the wasm in the `web` profile (release,
# optimised for size), wasm-bindgen's JS glue, and index.html, into one folder any file server
# can serve. Installs the wasm target and wasm-bindgen-cli (the version in Cargo.lock) when
# missing. Usage: scripts/web-build.sh [OUT_DIR]   (default: target/web-dist)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/web-dist}"
target_dir="${CARGO_TARGET_DIR:-target}"

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
fi

# wasm-bindgen-cli must be exactly the wasm-bindgen version the wasm links.
version="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)"
if [ -z "$version" ]; then
    echo "web-build: no wasm-bindgen in Cargo.lock" >&2
    exit 1
fi
if ! command -v wasm-bindgen >/dev/null 2>&1 || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$version" ]; then
    # --debug: the CLI only rewrites one file per build; a debug build of it installs in a
    # fraction of a release build's time (CI's budget).
    start=$SECONDS
    cargo install --debug --locked wasm-bindgen-cli --version "=$version" \
        || cargo install --debug wasm-bindgen-cli --version "=$version"
    echo "web-build: installed wasm-bindgen-cli $version in $((SECONDS - start)) s"
fi

start=$SECONDS
cargo build -p parsim-gui --bin parsim-gui --target wasm32-unknown-unknown --profile web
echo "web-build: wasm built in $((SECONDS - start)) s"

rm -rf "$out"
mkdir -p "$out"
wasm-bindgen --target web --no-typescript --out-dir "$out" \
    "$target_dir/wasm32-unknown-unknown/web/parsim-gui.wasm"
cp crates/gui/web/index.html "$out/"

wasm="$out/parsim-gui_bg.wasm"
raw=$(wc -c <"$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
echo "web-build: wrote $out (wasm $((raw / 1024)) KiB, $((gz / 1024)) KiB gzip-compressed)"
echo "web-build: serve it with: python3 -m http.server -d $out 8080"
