#!/usr/bin/env bash
# Install what the airspace map page and its real-browser test need. Idempotent: reruns are
# no-ops once everything is in place, so `make setup` can call it every time.
#   - Debian: chromium + chromium-driver (headless test), fonts-wqy-zenhei (CJK text in screenshots)
#   - npm: deck.gl standalone bundles, topojson-client and world-atlas land data, pinned by
#     web/package-lock.json into web/node_modules (mappage.py inlines them into the page)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(chromium chromium-driver fonts-wqy-zenhei)
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install_browser_deps: apt-get install ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
fi

# npm ci only when the lockfile changed since the last install (its hash is the stamp).
stamp=web/node_modules/.clover-lock.sha256
want=$(sha256sum web/package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "install_browser_deps: npm ci in web/"
    (cd web && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
    echo "$want" > "$stamp"
fi
