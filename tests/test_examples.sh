#!/usr/bin/env bash
# The examples as README's "Lifting the core out" has them: its list of the
# core's files and examples/ copied into an empty folder, each example built
# there with README's command (the example's name in place of
# examples/compile.c) and run; and every line README quotes from
# examples/compile.c is one of its lines.
set -u
cd "$(dirname "$0")/.."
passed=0 failed=0
ok()   { printf '  %-60s ok\n' "$1"; passed=$((passed + 1)); }
fail() { printf '  %-60s FAIL\n' "$1"; failed=$((failed + 1)); }
section=$(sed -n '/^## Lifting the core out/,/^## /p' README.md)
files=$(printf '%s\n' "$section" | grep -m1 -E '^    nectar\.h ')
build=$(printf '%s\n' "$section" | sed -n '/^```sh/,/^```/p' | sed '1d;$d' | sed -e ':a' -e '/\\$/N; s/\\\n//; ta')
if [ -z "$files" ] || [ -z "$build" ]; then
    echo "README.md: no file list or build command in its \"Lifting the core out\" section"; exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in $files; do
    mkdir -p "$tmp/$(dirname "$f")" && cp "$f" "$tmp/$f" || { echo "README.md lists $f, which does not exist"; exit 1; }
done
cp -r examples "$tmp/"
echo "the examples, built from README's file list alone in $tmp"
for example in examples/*.c; do
    name=$(basename "$example" .c)
    command=${build//examples\/compile.c/$example}
    if (cd "$tmp" && eval "$command -o $name" > "$name.build.log" 2>&1); then ok "$example builds with README's command"
    else fail "$example builds with README's command"; cat "$tmp/$name.build.log"; continue; fi
    (cd "$tmp" && "./$name" > "$name.log" 2> "$name.err")
    status=$? last=$(tail -n 1 "$tmp/$name.log")
    [ $status -eq 0 ] && [[ $last =~ ^[0-9]+\ passed,\ 0\ failed$ ]] && ok "$example runs: $last" \
        || { fail "$example runs (status $status): $last"; cat "$tmp/$name.log" "$tmp/$name.err"; }
done
quoted=$(printf '%s\n' "$section" | sed -n '/^```c/,/^```/p' | sed '1d;$d')
missing=0
while IFS= read -r line; do
    [ -n "$line" ] && ! grep -qF -- "$line" examples/compile.c && { echo "    not in examples/compile.c: $line"; missing=1; }
done <<< "$quoted"
[ -n "$quoted" ] && [ $missing -eq 0 ] && ok "README's quoted lines are examples/compile.c's" \
    || fail "README's quoted lines are examples/compile.c's"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
