#!/usr/bin/env bash
# System packages attnlab's set-up needs, installed only when missing:
#   fonts-noto-cjk  glyphs for Chinese labels in heatmaps (小明 / 去了 / 学校)
set -euo pipefail

need=()
if ! fc-list 2>/dev/null | grep -qi "Noto Sans CJK"; then
    need+=(fonts-noto-cjk)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: please install a CJK font (e.g. Noto Sans CJK) for Chinese labels," >&2
    echo "  or point ATTNLAB_CJK_FONT at a .ttf/.otf/.ttc file that has Chinese glyphs." >&2
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
