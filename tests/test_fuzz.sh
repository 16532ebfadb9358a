#!/usr/bin/env bash
# The fuzz pass: corrupted files (tests/mutants, fixed seeds) and random
# command lines, run as a user runs them. Every run must end, within 10 s,
# in exit 0 or in exit 1 with one printable `error:` line, with nothing
# from the sanitizers. Besides:
#   - a GGUF file changed in its structure (header, lengths, types, tensor
#     infos) is refused or gives the same output; changed in its content
#     (names, values, tensor data: GGUF has no checksum) it may say
#     something else;
#   - a module file or a self-study file changed anywhere is refused (its checksum);
#   - train never changes one of its inputs.
# usage: tests/test_fuzz.sh BINDIR   (BINDIR holds infer and study; tests/mutants is built)
set -u
bin=${1:-.}
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

# outcome CMD...: runs CMD, sets $outcome to refused (exit 1, one printable
# error line), ran (exit 0, no error line) or bad (anything else: a crash,
# a hang, a sanitizer report, two error lines, an unprintable byte)
outcome() {
    timeout 10 "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$? errors
    errors=$(grep -c '^error: ' "$tmp/err")
    if grep -q "Sanitizer\|runtime error" "$tmp/err"; then outcome=bad
    elif [ $rc -eq 1 ] && [ "$errors" = 1 ] && ! LC_ALL=C grep -q '[^ -~]' <(grep '^error: ' "$tmp/err"); then
        outcome=refused
    elif [ $rc -eq 0 ] && [ "$errors" = 0 ]; then outcome=ran
    else outcome=bad; fi
}

# verdict GROUP WANT NAME: WANT is refused (only a refusal will do), same:FILE
# (a refusal, or a run whose stdout is FILE's) or clean (a refusal or a run)
declare -A count
verdict() {
    local group=$1 want=$2 name=$3 got=$outcome
    [ $got = ran ] && [ "${want%%:*}" = same ] && { cmp -s "$tmp/out" "${want#same:}" && got=same || got=changed; }
    count[$group,$got]=$(( ${count[$group,$got]:-0} + 1 ))
    case $want:$got in
        refused:refused | same:*:refused | same:*:same | clean:refused | clean:ran) passed=$((passed + 1)) ;;
        *) failed=$((failed + 1))
           printf '  FAIL %s: %s %s (want %s)\n' "$group" "$name" "$got" "${want%%:*}"
           sed 's/^/      /' "$tmp/err" | head -n 5 ;;
    esac
}

summary() {  # summary GROUP: its outcomes
    local group=$1 line="" o
    for o in refused same changed ran bad; do
        [ -n "${count[$group,$o]:-}" ] && line="$line, ${count[$group,$o]} $o"
    done
    printf '  %-38s %s\n' "$group" "${line#, }"
}

# fuzz_files KIND FILE SEED COUNT GROUP WANT CMD...: COUNT mutants of FILE,
# each run as CMD with @ replaced by its path; WANT as in verdict, where a
# GGUF mutant of the content is judged clean
fuzz_files() {
    local kind=$1 file=$2 seed=$3 n=$4 group=$5 want=$6 path where; shift 6
    mkdir -p "$tmp/m"
    while read -r path where; do
        outcome "${@/#@/$path}"
        case $where in
            content) verdict "$group (content)" clean "${path##*/}" ;;
            structure) verdict "$group (structure)" "$want" "${path##*/}" ;;
            *) verdict "$group" "$want" "${path##*/}" ;;
        esac
        rm -f "$path"
    done < <(tests/mutants "$kind" "$file" "$seed" "$n" "$tmp/m")
}

echo "fuzz pass ($bin)"
# the inputs, copied: a command line may name one as train's output
cp tests/data/ref_gqa.bin tests/data/tok_test.bin tests/data/gguf_*.gguf data/doc.qa "$tmp/"
model=$tmp/ref_gqa.bin tok=$tmp/tok_test.bin
echo "1 20 30 40" > "$tmp/prompt.ids"
seq 3 42 | tr '\n' ' ' > "$tmp/doc.ids"
printf 'The cat sat on the mat. The dog sat on the log.\n' > "$tmp/doc.txt"
quick=(--prompt-len 16 --n-prompts 6 --tasks 0 --eval-tasks 0 --steps 3 --rho 0.5)
"$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/good.nectar" "${quick[@]}" --save-self-study "$tmp/good.ss" \
    > /dev/null 2>&1 || { echo "  FAIL: the module file to corrupt was not made"; exit 1; }
cp "$tmp/good.nectar" "$tmp/old.nectar"

sample=(-i "one two" -n 12 -t 1 -s 7 --ids)   # sampled: a change in any logit tends to show
for name in llama mistral spm; do   # 170 mutants each
    "$bin/infer" -m "$tmp/gguf_$name.gguf" "${sample[@]}" > "$tmp/want_$name" 2> /dev/null ||
        { echo "  FAIL: tests/data/gguf_$name.gguf itself does not run"; exit 1; }
    fuzz_files gguf "$tmp/gguf_$name.gguf" 1 170 "GGUF $name" "same:$tmp/want_$name" \
        "$bin/infer" -m @ "${sample[@]}"
done
fuzz_files bytes "$tmp/good.nectar" 2 300 "module file" refused \
    "$bin/infer" -m $model -k @ -I "$tmp/prompt.ids" -n 6 -t 0 --ids
fuzz_files bytes "$tmp/good.ss" 5 100 "self-study file" refused \
    "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/out.nectar" --self-study @ --prompt-len 16 --steps 3 --rho 0.5
fuzz_files bytes $model 3 100 "llama2.c checkpoint" clean "$bin/infer" -m @ -I "$tmp/prompt.ids" -n 6 -t 0 --ids
fuzz_files bytes $tok 4 100 "tokenizer.bin" clean "$bin/infer" -m $model -z @ -i "the cat" -n 6 -t 0 --ids

# Random command lines (bash's RANDOM, seeded): each option of the program
# given or not, with a value drawn from good and bad ones; after each, the
# inputs must be as they were (old.nectar, an output that exists, is no input)
# (no $(...) here: a subshell draws from another RANDOM)
add() { local values=("${@:2}"); line+=("$1" "${values[RANDOM % ${#values[@]}]}"); }   # add FLAG VALUE...
add_one() { local values=("$@"); line+=("${values[RANDOM % ${#values[@]}]}"); }         # add_one WORD...
infer_options() {
    line=("$bin/infer")
    ((RANDOM % 4)) && add -m $model $model "$tmp/gguf_llama.gguf" "$tmp/doc.txt" "$tmp" "$tmp/none" ""
    ((RANDOM % 3)) || add -z $tok "$tmp/doc.txt" "$tmp" ""
    ((RANDOM % 2)) && { add_one -i -I; add_one "the cat" "$tmp/prompt.ids" "" $'\xff\xfe' "$tmp"; }
    ((RANDOM % 3)) || { add_one -d -D; add_one "$tmp/doc.txt" "$tmp/doc.ids" /dev/null "$tmp" "$tmp/none"; }
    ((RANDOM % 3)) || add -k "$tmp/good.nectar" "$tmp/doc.txt" "$tmp/gguf_llama.gguf" "$tmp/none"
    ((RANDOM % 2)) && add -n 6 0 1 -1 1000 abc 99999999999 6x
    ((RANDOM % 2)) && add -t 0 0.5 -1 nan inf x
    ((RANDOM % 3)) || add -p 0 0.9 1 2 -0.1
    ((RANDOM % 3)) || add -s 1 -5 x
    ((RANDOM % 4)) || add_one --chat --eval --compare --ids --json --gpu -x --qa --help
    ((RANDOM % 5)) || add_one "$tmp/doc.qa" "$tmp/doc.txt" 7
}
train_options() {
    line=("$bin/study" fit "${quick[@]:0:8}")   # train's run with the study options: prompt length, prompts, tasks, evaluation tasks
    ((RANDOM % 4)) && add -m $model $model "$tmp/gguf_llama.gguf" "$tmp/doc.txt" "$tmp"
    ((RANDOM % 4)) && { add_one -d -D; add_one "$tmp/doc.txt" "$tmp/doc.ids" "$tmp" "$tmp/none"; }
    ((RANDOM % 5)) && add -o "$tmp/out.nectar" "$tmp/out.nectar" "$tmp/doc.txt" "$tmp/doc.ids" "$tmp/old.nectar" \
                          "$tmp" "" /proc/version "$tmp/none/x.nectar" $model
    add --steps 3 3 3 0 -1 x
    ((RANDOM % 2)) && add --rho 0.5 0 -1 nan 1e9 1e-9
    ((RANDOM % 4)) || add --arch mlp quad x
    ((RANDOM % 4)) || add --loss kl regression mixed x
    ((RANDOM % 5)) || { add_one --init --resume; add_one "$tmp/good.nectar" "$tmp/doc.txt" "$tmp/none"; }
    ((RANDOM % 5)) || add --checkpoint "$tmp/ck.nectar" "$tmp/doc.ids" "$tmp/old.nectar"
    ((RANDOM % 5)) || add --qa "$tmp/doc.qa" "$tmp/doc.txt"
    ((RANDOM % 6)) || { add_one --self-study --save-self-study; add_one "$tmp/good.ss" "$tmp/out.ss" "$tmp/good.nectar"; }
    ((RANDOM % 5)) || add_one --json --chat --help --steps -z
}
RANDOM=5
inputs() { md5sum $model $tok "$tmp"/gguf_*.gguf "$tmp/doc.qa" "$tmp/doc.txt" "$tmp/doc.ids" "$tmp/good.nectar" \
    "$tmp/good.ss" 2> /dev/null; }
inputs > "$tmp/inputs.md5"
for i in $(seq 100); do
    if ((i % 2)); then infer_options; else train_options; fi
    outcome "${line[@]}"
    verdict "command lines" clean "$(printf '%q ' "${line[@]#$tmp/}")"
    inputs | cmp -s - "$tmp/inputs.md5" || { failed=$((failed + 1)); echo "  FAIL: an input changed: ${line[*]}"; inputs > "$tmp/inputs.md5"; }
    rm -f "$tmp/out.nectar" "$tmp/ck.nectar"
done

for group in "${!count[@]}"; do echo "${group%,*}"; done | sort -u | while read -r group; do summary "$group"; done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
