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
    # fraction of a release build's time (CI's budget). Only the `wasm-bindgen` binary, and no
    # TLS (its test runner's downloads): fewer crates to compile. Its lock file may name a
    # version the registry no longer serves: then the newest compatible ones.
    start=$SECONDS
    install=(cargo install --debug --no-default-features --bin wasm-bindgen wasm-bindgen-cli --version "=$version")
    "${install[@]}" --locked || "${install[@]}"
    echo "web-build: installed wasm-bindgen-cli $version in $((SECONDS - start)) s"
fi

# The workspace's crates compile through clippy-driver with warnings denied, so the wasm-only
# code is linted as it is built (what `cargo clippy --target wasm32-unknown-unknown -- -D
# warnings` checks, without a second pass over every dependency). PARSIM_WEB_LINT=0 builds
# with plain rustc.
clippy_driver="$(dirname "$(command -v cargo)")/clippy-driver"
if command -v rustup >/dev/null 2>&1; then
    clippy_driver="$(dirname "$(rustup which cargo)")/clippy-driver"
fi
lint=()
if [ "${PARSIM_WEB_LINT:-1}" != 0 ]; then
    if [ -x "$clippy_driver" ]; then
        lint=(env RUSTC_WORKSPACE_WRAPPER="$clippy_driver" RUSTFLAGS="${RUSTFLAGS:-} -D warnings")
    else
        echo "web-build: no clippy-driver next to cargo: building without lints" >&2
    fi
fi
start=$SECONDS
"${lint[@]}" cargo build -p parsim-gui --bin parsim-gui --target wasm32-unknown-unknown --profile web
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
