#!/usr/bin/env bash
# Regenerate samples/hello.wav: a short English sentence spoken by espeak-ng,
# converted by sox to 16 kHz mono 16-bit PCM WAV (no dither, so the output is reproducible).
# Needs Debian's espeak-ng and sox; installs them with apt-get when missing (as root).
set -euo pipefail

if ! command -v espeak-ng >/dev/null || ! command -v sox >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends espeak-ng sox
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
text="Speech recognition turns sound into text. Cross attention shows where the model listens."
raw="$(mktemp --suffix=.wav)"
trap 'rm -f "$raw"' EXIT

espeak-ng -v en -s 130 -g 2 -w "$raw" "$text"
sox -D "$raw" -r 16000 -c 1 -b 16 "$here/hello.wav" norm -1 pad 0.5 0
soxi "$here/hello.wav"
