#!/usr/bin/env bash
# Render every deck to one PNG per slide and to HTML, to look at them before teaching:
#   scripts/render_slides.sh [OUT_DIR]        (default /tmp/slides)
# Needs marp-cli and Chromium:  apt-get install -y chromium && npm install -g @marp-team/marp-cli
# --allow-local-files lets Chromium read the decks' figures from slides/figures/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/slides}
mkdir -p "$out"
export CHROME_PATH=${CHROME_PATH:-$(command -v chromium || command -v chromium-browser || command -v google-chrome)}
marp=(marp)
command -v marp >/dev/null || marp=(npx --yes @marp-team/marp-cli)
for deck in slides/[0-9]*.md; do
    name=$(basename "$deck" .md)
    "${marp[@]}" --allow-local-files --images png -o "$out/$name.png" "$deck"   # $out/NAME.001.png, .002.png, ...
    "${marp[@]}" --allow-local-files --html -o "$out/$name.html" "$deck"
    cp -r slides/figures "$out/" 2>/dev/null || true  # the HTML links figures/ relatively
done
ls "$out"/*.png | wc -l | xargs echo "slide images in $out:"
