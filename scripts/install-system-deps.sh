#!/usr/bin/env bash
# System packages attnlab's set-up needs, installed only when missing:
#   fonts-noto-cjk   glyphs for Chinese labels in heatmaps (小明 / 去了 / 学校)
#   chromium         the headless browser tests/browser/test_browser.py drives through Playwright
#   chromium-driver  (Playwright's own browser download needs the network; Debian's does not)
set -euo pipefail

need=()
# (grep without -q: with pipefail, -q's early exit would make fc-list's SIGPIPE count as failure)
if ! fc-list 2>/dev/null | grep -i "Noto Sans CJK" >/dev/null; then
    need+=(fonts-noto-cjk)
fi
if [ ! -x /usr/bin/chromium ]; then
    need+=(chromium)
fi
if ! command -v chromedriver >/dev/null 2>&1; then
    need+=(chromium-driver)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: no apt-get; please install yourself: ${need[*]}" >&2
    echo "  - a CJK font (e.g. Noto Sans CJK) for Chinese labels, or point ATTNLAB_CJK_FONT" >&2
    echo "    at a .ttf/.otf/.ttc file that has Chinese glyphs;" >&2
    echo "  - Chromium for the browser test, at /usr/bin/chromium or named by ATTNLAB_CHROMIUM." >&2
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "install-system-deps: need root (or sudo) to apt-get install ${need[*]}" >&2
        exit 1
    fi
fi
echo "install-system-deps: apt-get install ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
