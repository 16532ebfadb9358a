#!/usr/bin/env bash
# Bad input must give one sentence on stderr ("error: ...") and exit status 1:
# never a crash, a sanitizer report or a silently wrong result.
# usage: tests/test_bad_input.sh BINDIR   (BINDIR holds infer, train and study,
#        and pretrain and benchmark where it has them)
set -u
bin=${1:-.}
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=tests/data/ref_gqa.bin   # dim 48, hidden 128, 2 layers, 6/2 heads, vocab 300, seq_len 64
tok=tests/data/tok_test.bin
passed=0 failed=0

# expect_error NAME CMD...: exit 1 with "error:" on stderr
expect_error() {
    local name=$1; shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    # exit 1 and exactly one error line, printable ASCII only (a file's bytes escaped), no sanitizer report
    if [ $rc -eq 1 ] && [ "$(grep -c "^error: " "$tmp/err")" = 1 ] && ! LC_ALL=C grep -q '[^ -~]' <(grep "^error: " "$tmp/err") &&
       ! grep -q "Sanitizer\|runtime error" "$tmp/err"; then
        printf '  %-52s ok: %s\n' "$name" "$(grep -m 1 '^error: ' "$tmp/err" | head -c 150)"
        passed=$((passed + 1))
    else
        printf '  %-52s FAIL (exit %d)\n' "$name" $rc
        sed 's/^/      /' "$tmp/err" | head -n 20
        failed=$((failed + 1))
    fi
}

# expect_ok NAME CMD...: exit 0, nothing from the sanitizers
expect_ok() {
    local name=$1; shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    if [ $rc -eq 0 ] && ! grep -q "Sanitizer\|runtime error" "$tmp/err"; then
        printf '  %-52s ok\n' "$name"; passed=$((passed + 1))
    else
        printf '  %-52s FAIL (exit %d)\n' "$name" $rc; sed 's/^/      /' "$tmp/err" | head -n 20
        failed=$((failed + 1))
    fi
}

echo "bad input ($bin)"
# good inputs first, so the checks below are not passing for a wrong reason
echo "1 20 30 40" > "$tmp/prompt.ids"
seq 3 42 | tr '\n' ' ' > "$tmp/doc.ids"
expect_ok "a valid run (no document)" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 5 -t 0
expect_ok "a valid run (document ids)" "$bin/infer" -m $model -D "$tmp/doc.ids" -I "$tmp/prompt.ids" -n 5 -t 0
expect_ok "a valid run (text, tokenizer)" "$bin/infer" -m $model -z $tok -i "the cat" -n 5 -t 0
expect_ok "--help" "$bin/infer" --help
expect_ok "study --help" "$bin/study" --help
expect_ok "study fit --help" "$bin/study" fit --help

# checkpoints
expect_error "missing model file" "$bin/infer" -m "$tmp/nothing.bin" -I "$tmp/prompt.ids"
head -c 10 $model > "$tmp/short.bin"
expect_error "file shorter than the header" "$bin/infer" -m "$tmp/short.bin" -I "$tmp/prompt.ids"
head -c 5000 $model > "$tmp/trunc.bin"
expect_error "truncated checkpoint" "$bin/infer" -m "$tmp/trunc.bin" -I "$tmp/prompt.ids"
{ cat $model; printf 'extra'; } > "$tmp/long.bin"
expect_error "file longer than its header says" "$bin/infer" -m "$tmp/long.bin" -I "$tmp/prompt.ids"
{ ints 0 128 2 6 2 300 64; tail -c +29 $model; } > "$tmp/zero.bin"
expect_error "zero dim in the header" "$bin/infer" -m "$tmp/zero.bin" -I "$tmp/prompt.ids"
{ ints 48 128 2 5 1 300 64; tail -c +29 $model; } > "$tmp/heads.bin"
expect_error "dim not a multiple of n_heads" "$bin/infer" -m "$tmp/heads.bin" -I "$tmp/prompt.ids"
{ ints 48 128 2 6 4 300 64; tail -c +29 $model; } > "$tmp/gqa.bin"
expect_error "n_heads not a multiple of n_kv_heads" "$bin/infer" -m "$tmp/gqa.bin" -I "$tmp/prompt.ids"
{ ints 48 128 2 16 2 300 64; tail -c +29 $model; } > "$tmp/odd.bin"
expect_error "odd head size" "$bin/infer" -m "$tmp/odd.bin" -I "$tmp/prompt.ids"
{ ints 48 128 2 6 2 2000000000 64; tail -c +29 $model; } > "$tmp/huge.bin"
expect_error "absurd vocab size" "$bin/infer" -m "$tmp/huge.bin" -I "$tmp/prompt.ids"
cp $model "$tmp/nan.bin" && poke "$tmp/nan.bin" $((28 + 4 * 960)) 2143289344  # a NaN in the token embedding
expect_error "a NaN weight" "$bin/infer" -m "$tmp/nan.bin" -I "$tmp/prompt.ids"

# GGUF files: the small Llama-shaped model of tests/data (the reader's own
# cases, every kind of corrupt header, are in tests/test_gguf.c)
gguf=tests/data/gguf_llama.gguf
expect_ok "a valid GGUF run (text, the file's tokenizer)" "$bin/infer" -m $gguf -i "the cat" -n 3 -t 0
head -c 20 $gguf > "$tmp/short.gguf"
expect_error "GGUF shorter than its header" "$bin/infer" -m "$tmp/short.gguf" -I "$tmp/prompt.ids"
head -c 60000 $gguf > "$tmp/trunc.gguf"
expect_error "truncated GGUF (tensor data past the end)" "$bin/infer" -m "$tmp/trunc.gguf" -I "$tmp/prompt.ids"
cp $gguf "$tmp/version.gguf"; poke "$tmp/version.gguf" 4 7
expect_error "GGUF of version 7" "$bin/infer" -m "$tmp/version.gguf" -I "$tmp/prompt.ids"
LC_ALL=C sed 's/llama/gemma/g' $gguf > "$tmp/arch.gguf"
expect_error "GGUF of another architecture (gemma)" "$bin/infer" -m "$tmp/arch.gguf" -I "$tmp/prompt.ids"
LC_ALL=C sed 's/tokenizer\.ggml\.merges/tokenizer.ggml.mergez/' $gguf > "$tmp/nomerges.gguf"
expect_error "GGUF tokenizer without merges" "$bin/infer" -m "$tmp/nomerges.gguf" -i "the cat"
LC_ALL=C sed 's/\(tokenizer\.ggml\.model.\{12\}\)gpt2/\1bert/' $gguf > "$tmp/tokmodel.gguf"
expect_error "GGUF tokenizer of an unknown kind (bert)" "$bin/infer" -m "$tmp/tokmodel.gguf" -i "the cat"
expect_error "--chat with a model without a chat template" "$bin/infer" -m tests/data/gguf_mistral.gguf --chat -i "the"
expect_error "--chat with token ids" "$bin/infer" -m $gguf --chat -I "$tmp/prompt.ids"
expect_error "a text the GGUF vocabulary cannot spell" "$bin/infer" -m $gguf -i "über"

# tokens and lengths
echo "1 20 99999" > "$tmp/big.ids"
expect_error "token id out of range (prompt)" "$bin/infer" -m $model -I "$tmp/big.ids"
echo "1 20 300" > "$tmp/vocab.ids"
expect_error "token id equal to the vocabulary size (300)" "$bin/infer" -m $model -I "$tmp/vocab.ids"
echo "4294967301 10 11" > "$tmp/wrap.ids"
expect_error "token id beyond int (would wrap to 5)" "$bin/infer" -m $model -I "$tmp/wrap.ids"
echo "1 -5 7" > "$tmp/neg.ids"
expect_error "negative token id (document)" "$bin/infer" -m $model -D "$tmp/neg.ids" -I "$tmp/prompt.ids"
echo "12 abc 7" > "$tmp/text.ids"
expect_error "token-id file with a word in it" "$bin/infer" -m $model -I "$tmp/text.ids"
seq 3 63 | tr '\n' ' ' > "$tmp/long.ids"
expect_error "document plus prompt beyond the context (61+4 > 64)" "$bin/infer" -m $model -D "$tmp/long.ids" -I "$tmp/prompt.ids"
: > "$tmp/empty.ids"
expect_error "empty document" "$bin/infer" -m $model -D "$tmp/empty.ids" -I "$tmp/prompt.ids"
expect_error "document without a prompt" "$bin/infer" -m $model -D "$tmp/doc.ids"
expect_error "missing document file" "$bin/infer" -m $model -d "$tmp/none.txt" -i "x" -z $tok
printf 'the cat\0sat' > "$tmp/nul.txt"
expect_error "text document with a NUL byte" "$bin/infer" -m $model -d "$tmp/nul.txt" -i "x" -z $tok
expect_error "text without a tokenizer" "$bin/infer" -m $model -i "hello"
awk 'BEGIN { for (i = 0; i < 4000; i++) printf "word%d ", i }' > "$tmp/big.txt"
expect_error "text document of 30 KB, refused before merging" "$bin/infer" -m $model -z $tok -d "$tmp/big.txt" -i "x"

# tokenizer and flags
expect_error "missing tokenizer" "$bin/infer" -m $model -z "$tmp/none.bin" -i "x"
head -c 100 $tok > "$tmp/tok.bin"
expect_error "truncated tokenizer" "$bin/infer" -m $model -z "$tmp/tok.bin" -i "x"
expect_error "--encode without a tokenizer" "$bin/infer" --encode -i "x"
expect_error "unknown option" "$bin/infer" -m $model --frobnicate
expect_error "-n that is not a number" "$bin/infer" -m $model -n lots
expect_error "-n empty" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n ''
expect_error "-n beyond int (2^32 + 1)" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 4294967297
expect_ok "-n 2^31 - 1 (cut to the context)" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 2147483647 -t 0
expect_error "-t nan" "$bin/infer" -m $model -I "$tmp/prompt.ids" -t nan
expect_error "-p nan" "$bin/infer" -m $model -I "$tmp/prompt.ids" -p nan
expect_error "negative seed" "$bin/infer" -m $model -I "$tmp/prompt.ids" -s -5
expect_error "top-p above 1" "$bin/infer" -m $model -p 1.5
expect_error "--json without --eval" "$bin/infer" -m $model -I "$tmp/prompt.ids" --json
# one clear sentence each: a directory where a file goes, a document of newlines alone, a budget too small,
# -z beside a GGUF model's own tokenizer, an option given twice
dm="-m data/model.bin -z data/tokenizer.bin"
expect_error "infer -z a directory" "$bin/infer" -m data/model.bin -z "$tmp" -i x
grep -q "is a directory" "$tmp/err" || { echo "    (no word of the directory)"; failed=$((failed + 1)); }
expect_error "infer -I a directory" "$bin/infer" -m data/model.bin -I "$tmp"
grep -q "is a directory" "$tmp/err" || { echo "    (no word of the directory)"; failed=$((failed + 1)); }
printf '\n\n\n' > "$tmp/newlines.txt"
expect_error "train on a document of three newlines" "$bin/train" $dm -d "$tmp/newlines.txt" -o "$tmp/x.nectar"
expect_error "train --rho 1e-9" "$bin/train" $dm -d data/doc.txt -o "$tmp/x.nectar" --rho 1e-9
expect_error "infer -z beside a GGUF model" "$bin/infer" -m tests/data/gguf_llama.gguf -z data/tokenizer.bin -i x
expect_error "train -z beside a GGUF model" "$bin/train" -m tests/data/gguf_llama.gguf -z data/tokenizer.bin \
    -d data/doc.txt -o "$tmp/x.nectar"
expect_error "infer -n given twice" "$bin/infer" -m data/model.bin -I "$tmp/prompt.ids" -n 3 -n 4
expect_error "train --batch (a study option)" "$bin/train" $dm -d data/doc.txt -o "$tmp/x.nectar" --batch 8
expect_error "train --eval-train (a study option)" "$bin/train" $dm -d data/doc.txt -o "$tmp/x.nectar" --eval-train
expect_error "study fit --chat and --no-chat" "$bin/study" fit $dm -d data/doc.txt -o "$tmp/x.nectar" --chat --no-chat
expect_error "study fit --eval-tasks with --eval-tasks-from" "$bin/study" fit $dm -d data/doc.txt -o "$tmp/x.nectar" \
    --eval-tasks 5 --eval-tasks-from "$tmp/none.nectar"
expect_error "study without an instrument" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar"
expect_error "study --drift 0" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --drift 0
expect_error "study --drift-prompts without --drift" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" \
    --drift-prompts 3
expect_error "study --drift-prompts 0" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --drift 10 \
    --drift-prompts 0
expect_error "study --stops without a module file" "$bin/study" $dm -d data/doc.txt --stops
expect_error "study --stops with --drift" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --stops --drift 10
expect_error "study --joined with --stops" "$bin/study" $dm -d data/doc.txt -d data/doc.txt -k "$tmp/none.nectar" \
    --joined --stops
expect_error "study --joined of one document" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --joined
expect_error "study --qa without --joined" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --stops --qa data/doc.qa
expect_error "study --chat with token ids" "$bin/study" -m tests/data/gguf_llama.gguf --chat -D "$tmp/doc.ids" \
    -k "$tmp/none.nectar" --stops
expect_error "study of a missing module file" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --stops
expect_error "study --drift last, without its count" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --drift
expect_error "study --stops given twice" "$bin/study" $dm -d data/doc.txt -k "$tmp/none.nectar" --stops --stops
expect_error "infer --answers: --eval lists the answers" "$bin/infer" $dm -d data/doc.txt -k "$tmp/none.nectar" \
    --eval --answers
expect_error "study fit --far-len 0" "$bin/study" fit $dm -d data/doc.txt -o "$tmp/x.nectar" --far-prompts 2 --far-len 0
expect_error "study fit --self-study of a missing file" "$bin/study" fit $dm -d data/doc.txt -o "$tmp/x.nectar" \
    --self-study "$tmp/none.ss"
expect_error "benchmark -m given twice" "$bin/benchmark" -m data/model.bin -m data/model.bin
expect_error "pretrain --steps given twice" "$bin/pretrain" -o "$tmp/p" --steps 1 --steps 2
"$bin/infer" --help | grep -q -- "-p P .*0 or 1: off" && { printf '  %-52s ok\n' "infer --help: -p 0 turns top-p off"
    passed=$((passed + 1)); } || { printf '  %-52s FAIL\n' "infer --help: -p 0"; failed=$((failed + 1)); }
# question files (--qa): a bad one is refused with its line, before any work
dm="-m data/model.bin -z data/tokenizer.bin"
printf '? Where?\n- here\n- there\n' > "$tmp/noright.qa"
expect_error "infer --qa, a question without a right option" "$bin/infer" $dm -d data/doc.txt --qa "$tmp/noright.qa"
grep -q "noright.qa:1: the question has no right option" "$tmp/err" || { echo "    the message names no line"; failed=$((failed + 1)); }
expect_error "infer --qa without the document" "$bin/infer" $dm --qa data/doc.qa
expect_error "infer --qa with --eval" "$bin/infer" $dm -d data/doc.txt -k "$tmp/none.nectar" --eval --qa data/doc.qa
expect_error "infer --qa without a tokenizer (ids)" "$bin/infer" -m $model -D "$tmp/doc.ids" --qa data/doc.qa
expect_error "infer --qa last, without its file" "$bin/infer" $dm -d data/doc.txt --qa
expect_error "infer --qa of a missing file" "$bin/infer" $dm -d data/doc.txt --qa "$tmp/none.qa"
expect_error "train --qa of a bad file, before 10^6 steps" "$bin/train" $dm -d data/doc.txt -o "$tmp/x.nectar" \
    --steps 1000000 --qa "$tmp/noright.qa"
expect_error "study fit --lambda-A nan" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --lambda-A nan
expect_error "study fit --lambda-kl -1" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --lambda-kl -1
expect_error "train --lr inf" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --lr inf
expect_error "study fit --kl-top-k 301 (vocabulary 300)" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --kl-top-k 301
expect_error "study fit --kl-top-k -1" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --kl-top-k -1
expect_error "train --kl-steps -1" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --kl-steps -1
expect_error "train --steps -2147483648 (not read as left out)" "$bin/train" -m $model -D "$tmp/doc.ids" \
    -o "$tmp/x.nectar" --steps -2147483648
expect_error "study fit --kl-lr 0" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --kl-steps 5 --kl-lr 0
expect_error "study fit --kl-lr without --kl-steps" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --kl-lr 1e-3
expect_error "train --steps + --kl-steps beyond int" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" \
    --steps 2147483647 --kl-steps 1
echo "4294967301 10 11 12" > "$tmp/wide.ids"
expect_error "study fit prompt id beyond int" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" \
    --prompt-ids "$tmp/wide.ids" --prompt-len 8 --steps 1
expect_error "study fit --depths whose sum overflows" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" \
    --depths 2147483647,2147483647,3
expect_error "study fit --depths with junk after" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --depths 1,1,1x
expect_error "study fit --batch x heads beyond int" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" \
    --batch 1000000000
expect_error "study fit --stop-after -1" "$bin/study" fit -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --stop-after -1 \
    --checkpoint "$tmp/ck"
expect_error "train -o a directory" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp"
# no input is ever overwritten, and an output that cannot be written is found before any step (each run below
# would train for 10^6 steps), the inputs' bytes unchanged
long="--steps 1000000"
cp "$tmp/doc.ids" "$tmp/keep.ids"
ln -sf "$tmp/keep.ids" "$tmp/link.ids"
expect_error "train -o the document (-D)" "$bin/train" -m $model -D "$tmp/keep.ids" -o "$tmp/keep.ids" $long
expect_error "train -o the document, through a link" "$bin/train" -m $model -D "$tmp/link.ids" -o "$tmp/keep.ids" $long
expect_error "train -o the model" "$bin/train" -m $model -D "$tmp/doc.ids" -o $model $long
expect_error "study fit -o the --prompt-ids file" "$bin/study" fit -m $model -D "$tmp/doc.ids" --prompt-ids "$tmp/keep.ids" \
    -o "$tmp/keep.ids" $long
expect_error "train --checkpoint the document" "$bin/train" -m $model -D "$tmp/keep.ids" -o "$tmp/x.nectar" \
    --checkpoint "$tmp/keep.ids" $long
expect_error "train -o and --checkpoint the same file" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" \
    --checkpoint "$tmp/x.nectar" $long
cmp -s "$tmp/doc.ids" "$tmp/keep.ids" && [ ! -e "$tmp/x.nectar" ] && { printf '  %-52s ok\n' "the inputs unchanged, nothing written"
    passed=$((passed + 1)); } || { printf '  %-52s FAIL\n' "the inputs unchanged, nothing written"; failed=$((failed + 1)); }
expect_error "train -o empty" "$bin/train" -m $model -D "$tmp/doc.ids" -o "" $long
expect_error "train -o in a folder that does not exist" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/none/x.nectar" $long
expect_error "train -o /proc/version" "$bin/train" -m $model -D "$tmp/doc.ids" -o /proc/version $long
: > "$tmp/readonly.nectar" && chmod 444 "$tmp/readonly.nectar"
expect_error "train -o a read-only file" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/readonly.nectar" $long
[ -s "$tmp/readonly.nectar" ] && { printf '  %-52s FAIL\n' "the read-only file kept"; failed=$((failed + 1)); }
: > "$tmp/immutable.nectar"
if chattr +i "$tmp/immutable.nectar" 2> /dev/null; then  # (root in a container that allows it)
    expect_error "train -o an immutable file" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/immutable.nectar" $long
    chattr -i "$tmp/immutable.nectar"
fi
seq 3 22 | tr '\n' ' ' > "$tmp/doc20.ids"
# (by regression: its loss overflows; pure KL's saturates at a finite value)
expect_error "train --lr 1e30 diverges" "$bin/train" -m $model -D "$tmp/doc20.ids" -o "$tmp/nan.nectar" \
    --rho 1 --lr 1e30 --steps 20 --loss regression
expect_error "train --lr 3e38 diverges in its last step" "$bin/train" -m $model -D "$tmp/doc20.ids" \
    -o "$tmp/nan.nectar" --rho 1 --lr 3e38 --steps 1 --loss regression
[ ! -e "$tmp/nan.nectar" ] && { printf '  %-52s ok\n' "no module file written by the diverged runs"; passed=$((passed + 1)); } ||
    { printf '  %-52s FAIL\n' "no module file written by the diverged runs"; failed=$((failed + 1)); }
expect_error "train --loss of no preset" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --loss klx
# these programs are the CPU-only build: --gpu says where the GPU build is
expect_error "infer --gpu (CPU-only build)" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 2 --gpu
expect_error "train --gpu (CPU-only build)" "$bin/train" -m $model -D "$tmp/doc.ids" -o "$tmp/x.nectar" --gpu

# pretrain and benchmark (at the top level and in build-asan/)
if [ -x "$bin/pretrain" ] && [ -x "$bin/benchmark" ]; then
    expect_error "pretrain --copy-start above 1" "$bin/pretrain" -o "$tmp/p" --copy-start 2
    expect_error "pretrain --batch 2^31 - 1" "$bin/pretrain" -o "$tmp/p" --batch 2147483647
    expect_error "pretrain -o under a file: refused before training" "$bin/pretrain" -o "$tmp/prompt.ids/out"
    expect_error "pretrain --lr 1e30 diverges" "$bin/pretrain" -o "$tmp/p" --steps 30 --lr 1e30
    expect_error "pretrain, an unknown option last" "$bin/pretrain" -o "$tmp/p" --bogus
    expect_error "pretrain --write-doc under a file" "$bin/pretrain" --write-doc "$tmp/prompt.ids/doc"
    expect_error "pretrain --write-doc with --doc-index -1" "$bin/pretrain" --write-doc "$tmp/w" --doc-index -1
    expect_error "pretrain -o and --write-doc together" "$bin/pretrain" -o "$tmp/p" --write-doc "$tmp/w"
    mkdir -p "$tmp/small" && cp $model "$tmp/small/model.bin"
    expect_error "pretrain --eval of a model with a short context" "$bin/pretrain" --eval "$tmp/small"
    ./tests/random_model "$tmp/vocab100.bin" 48 128 2 6 2 100 64 1 0.15 2> /dev/null
    expect_error "benchmark of a vocabulary below its ids" "$bin/benchmark" -m "$tmp/vocab100.bin" --max-doc 1024
    expect_error "benchmark --max-doc with junk" "$bin/benchmark" -m $model --max-doc 3000x
    expect_error "benchmark --max-doc 2^31 - 1" "$bin/benchmark" -m $model --max-doc 2147483647
    expect_error "benchmark --min-doc too short for a module" "$bin/benchmark" -m $model --min-doc 1 --max-doc 4
    expect_error "benchmark --arch of neither form" "$bin/benchmark" -m $model --arch tree
    expect_error "benchmark --json --gpu (the GPU tables are text)" "$bin/benchmark" -m $model --json --gpu
fi

# OpenBLAS's generic kernels on a CPU that can run faster ones (src/parallel.c): a
# program warns exactly where scripts/fast_blas.sh names the faster core, and
# not once that core is set (on a CPU OpenBLAS knows, neither says anything)
check_blas_warning() {
    local fast; fast=$(scripts/fast_blas.sh "$bin/infer")
    "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 2 > /dev/null 2> "$tmp/err"
    local warned=0; grep -q "^warning: OpenBLAS does not know this CPU" "$tmp/err" && warned=1
    if [ -n "$fast" ]; then env "$fast" "$bin/infer" -m $model -I "$tmp/prompt.ids" -n 2 > /dev/null 2> "$tmp/err2"
    else : > "$tmp/err2"; fi
    if [ $warned -eq "$([ -n "$fast" ] && echo 1 || echo 0)" ] && ! grep -q "^warning: OpenBLAS" "$tmp/err2"; then
        printf '  %-52s ok%s\n' "OpenBLAS's generic kernels: warned where slow" "${fast:+ ($fast fixes it)}"
        passed=$((passed + 1))
    else
        printf '  %-52s FAIL (warned %d, fast_blas.sh: "%s")\n' "OpenBLAS's generic kernels: warned where slow" $warned "$fast"
        failed=$((failed + 1))
    fi
}
check_blas_warning

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
