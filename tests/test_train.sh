#!/usr/bin/env bash
# train and infer end to end on a small random GQA model: fitting helps,
# runs are deterministic, resume equals an uninterrupted run, --init goes
# on from a module file, --kl-steps does the same in one run, the oracle
# quadrature is exact, module files fitted elsewhere are refused, and the
# benchmark sizes quadrature modules by floor(rho n) pairs.
# usage: tests/test_train.sh [BINDIR]   (BINDIR holds infer, train and study)
set -u
bin=${1:-.}
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

ok()   { printf '  %-60s ok\n' "$1"; passed=$((passed + 1)); }
fail() { printf '  %-60s FAIL\n' "$1"; failed=$((failed + 1)); }
# value of "key" inside the "split" object of a one-line JSON file
json() { sed -E "s/.*\"$2\": \{([^}]*)\}.*/\1/; s/.*\"$3\": ([-0-9.e+]+).*/\1/" "$1"; }
# value of a top-level "key" (the first of that name) of a one-line JSON file
top() { sed -E "s/^[^}]*\"$2\": ([-0-9.e+]+).*/\1/" "$1"; }
# awk-evaluated condition, e.g. is "0.1 < 0.5 * 0.4"
is() { awk "BEGIN { exit !($1) }"; }
# expect_refusal NAME PATTERN CMD...: exit 1 with "error: ...PATTERN"
expect_refusal() {
    local name=$1 pattern=$2; shift 2
    "$@" > /dev/null 2> "$tmp/err"
    local rc=$?
    [ $rc -eq 1 ] && grep -q "^error: .*$pattern" "$tmp/err" && ok "$name" || { fail "$name (exit $rc)"; cat "$tmp/err"; }
}

echo "train and infer end to end ($bin)"
./tests/random_model "$tmp/model.bin" 64 160 3 8 2 300 256 1 0.15 2> /dev/null
./tests/random_model "$tmp/other.bin" 64 160 3 8 2 300 256 2 0.15 2> /dev/null
awk 'BEGIN { srand(3); for (i = 0; i < 200; i++) printf "%d ", 3 + int(rand() * 290) }' > "$tmp/doc.ids"
awk 'BEGIN { srand(4); for (i = 0; i < 200; i++) printf "%d ", 3 + int(rand() * 290) }' > "$tmp/doc2.ids"
echo "5 6 7" > "$tmp/prompt.ids"
# the fits below are by regression (fast) of doc.ids unless a test asks for
# another loss or document (an option may be given once)
train() {
    local loss=(--loss regression) doc=(-D "$tmp/doc.ids") arg
    for arg in "$@"; do
        [ "$arg" = --loss ] && loss=()
        [ "$arg" = -D ] && doc=()
    done
    "$bin/study" fit -m "$tmp/model.bin" "${doc[@]}" --n-prompts 80 --prompt-len 32 "${loss[@]}" "$@"
}

# train is study fit's run without the study options: the same module bytes
# for the same options (a document short enough for train's prompt length)
awk 'BEGIN { srand(5); for (i = 0; i < 100; i++) printf "%d ", 3 + int(rand() * 290) }' > "$tmp/short.ids"
for prog in "$bin/train" "$bin/study fit"; do
    $prog -m "$tmp/model.bin" -D "$tmp/short.ids" --n-prompts 20 --loss regression --steps 30 --kl-steps 5 \
        -o "$tmp/by_${prog##*/}.nectar" > /dev/null 2>&1
done
cmp -s "$tmp/by_train.nectar" "$tmp/by_study fit.nectar" && ok "train and study fit: the same module bytes" \
    || fail "train and study fit wrote other modules"

# greedy decoding through the program equals the reference (and llama2.c)
for name in ref_gqa ref_mha_unshared; do
    sed -n 1p tests/data/$name.expect | cut -d' ' -f3- > "$tmp/p.ids"
    want=$(sed -n 2p tests/data/$name.expect | cut -d' ' -f3-)
    got=$("$bin/infer" -m tests/data/$name.bin -I "$tmp/p.ids" -n 24 -t 0 --ids 2> /dev/null)
    [ "$got" = "$want" ] && ok "infer -t 0 on $name: reference greedy tokens" || fail "infer -t 0 on $name: got '$got'"
done

# --encode: BOS first, but not for a prompt that follows a document
alone=$("$bin/infer" -z tests/data/tok_test.bin -i "the cat" --encode)
after=$("$bin/infer" -z tests/data/tok_test.bin -D "$tmp/doc.ids" -i "the cat" --encode)
[ "$alone" = "1 $after" ] && ok "--encode: BOS first, none after a document" || fail "--encode: '$alone' and '$after'"

# fitting lowers held-out target MSE well below the untrained module's
train -o "$tmp/init.nectar" --steps 0 --json > "$tmp/init.json" 2> "$tmp/log" || cat "$tmp/log"
train -o "$tmp/fit.nectar" --steps 400 --json > "$tmp/fit.json" 2> "$tmp/log" || cat "$tmp/log"
before=$(json "$tmp/init.json" random target_mse) after=$(json "$tmp/fit.json" random target_mse)
echo "    held-out target MSE: untrained $before, after 400 steps $after"
is "$after < 0.5 * $before" && ok "fitting halves held-out target MSE at least" || fail "fitting lowers target MSE"

# --eval-train: the metrics of the training prompts too, as many as the split left to the fit
train -o "$tmp/x.nectar" --steps 0 --eval-train --json > "$tmp/evaltrain.json" 2> "$tmp/log" || cat "$tmp/log"
held=$(json "$tmp/evaltrain.json" random n_prompts) fitted=$(json "$tmp/evaltrain.json" train n_prompts)
is "$held + $fitted == 80 && $fitted == 64 && $(json "$tmp/evaltrain.json" train kl) > 0" &&
    ok "--eval-train: metrics of the 64 training prompts (80 - 16 held out)" || fail "--eval-train: $held + $fitted"
positions=$(sed -nE 's/^teacher pass: .* ([0-9]+) training positions.*/\1/p' "$tmp/log")
[ "$(top "$tmp/evaltrain.json" train_prompts)" = 64 ] && [ "$(top "$tmp/evaltrain.json" train_positions)" = "$positions" ] &&
    ok "--json: the 64 training prompts and the teacher pass's $positions positions" ||
    fail "--json train_prompts, train_positions (teacher pass: '$positions')"

# pure KL distillation lowers the held-out KL to the full-cache model
train -o "$tmp/kl.nectar" --steps 200 --loss kl --json > "$tmp/kl.json" 2> "$tmp/log" || cat "$tmp/log"
before=$(json "$tmp/init.json" random kl) after=$(json "$tmp/kl.json" random kl)
echo "    held-out KL(full || Nectar): untrained $before, after 200 pure-KL steps $after"
is "$after < 0.8 * $before" && ok "pure KL training lowers the held-out KL" || fail "pure KL training lowers the held-out KL"

# the same seed gives the same module bytes
train -o "$tmp/again.nectar" --steps 400 --json > /dev/null 2>&1
cmp -s "$tmp/fit.nectar" "$tmp/again.nectar" && ok "same seed, same module bytes" || fail "same seed, same module bytes"
train -o "$tmp/seed2.nectar" --steps 400 -s 99 > /dev/null 2>&1
cmp -s "$tmp/fit.nectar" "$tmp/seed2.nectar" && fail "another seed gives other bytes" || ok "another seed gives other bytes"

# stop, resume, and get what an uninterrupted run gets
train -o "$tmp/resumed.nectar" --steps 400 --checkpoint "$tmp/ck" --stop-after 150 > /dev/null 2>&1
[ ! -e "$tmp/resumed.nectar" ] && [ -s "$tmp/ck" ] && ok "--stop-after leaves a checkpoint, no module" || fail "--stop-after"
train -o "$tmp/resumed.nectar" --steps 400 --resume "$tmp/ck" > /dev/null 2> "$tmp/log"
cmp -s "$tmp/fit.nectar" "$tmp/resumed.nectar" && ok "resume equals the uninterrupted run, bit for bit" || fail "resume equals uninterrupted"
train -o "$tmp/x.nectar" --steps 400 --resume "$tmp/ck" --checkpoint "$tmp/ck2" \
    --stop-after 100 > /dev/null 2> "$tmp/log"
[ $? -eq 1 ] && grep -q "^error: .*not after the checkpoint's step 150" "$tmp/log" && ok "--stop-after before the checkpoint's step is refused" || fail "--stop-after before the checkpoint"
"$bin/study" fit -m "$tmp/model.bin" -D "$tmp/doc.ids" -o "$tmp/x.nectar" --prompt-len 32 --steps 500 --resume "$tmp/ck" > /dev/null 2> "$tmp/log"
[ $? -eq 1 ] && grep -q "^error: .*other data or options" "$tmp/log" && ok "a checkpoint of other options is refused" || fail "checkpoint mismatch refused"

# --init: the same modules evaluate the same; pure KL goes on from a regression fit; other fits are refused
train -o "$tmp/init0.nectar" --init "$tmp/fit.nectar" --steps 0 > /dev/null 2> "$tmp/log" || cat "$tmp/log"
cmp -s "$tmp/fit.nectar" "$tmp/init0.nectar" && ok "--init FILE --steps 0 writes FILE's bytes" || fail "--init --steps 0"
train -o "$tmp/regkl.nectar" --init "$tmp/fit.nectar" --steps 100 --loss kl --json > "$tmp/regkl.json" 2> "$tmp/log" || cat "$tmp/log"
before=$(json "$tmp/fit.json" random kl) after=$(json "$tmp/regkl.json" random kl)
scratch=$(json "$tmp/kl.json" random kl)
echo "    held-out KL(full || Nectar): regression fit $before, then 100 pure-KL steps from it $after" \
     "(200 from the usual init: $scratch)"
is "$after < $before && $after < $scratch" && ok "pure KL from --init a regression fit lowers the held-out KL" || fail "KL after --init"
for bad in "-s 99:held out other prompts" "--arch quad:another architecture" "--rho 0.2:another architecture" \
           "--resume $tmp/ck:--init and --resume"; do
    train -o "$tmp/x.nectar" --init "$tmp/fit.nectar" --steps 10 ${bad%%:*} \
        > /dev/null 2> "$tmp/log"
    [ $? -eq 1 ] && grep -q "^error: .*${bad#*:}" "$tmp/log" && ok "--init refused: ${bad%%:*}" || fail "--init with ${bad%%:*}: $(head -c 200 "$tmp/log")"
done
train -o "$tmp/x.nectar" --init "$tmp/kl.nectar" -D "$tmp/doc2.ids" > /dev/null 2> "$tmp/log"
[ $? -eq 1 ] && grep -q "^error: .*different document" "$tmp/log" && ok "--init refused: another document" || fail "--init with another document"

# --kl-steps: the regression fit, then pure KL from it, in one run: what the
# two runs (the fit, then --init its file --loss kl at the --kl-lr, not the
# --lr) give, bit for bit; an empty first stage is a pure-KL run; resumed at
# the stage boundary (the checkpoint holds the first stage's Adam moments,
# which the KL stage does not take) or inside the KL stage, the same bytes
train -o "$tmp/regkl2.nectar" --init "$tmp/fit.nectar" --steps 100 --loss kl --lr 1e-2 > /dev/null 2> "$tmp/log" ||
    cat "$tmp/log"
staged="--steps 400 --kl-steps 100 --kl-lr 1e-2"
train -o "$tmp/staged.nectar" $staged --json > "$tmp/staged.json" 2> "$tmp/log" || cat "$tmp/log"
cmp -s "$tmp/regkl2.nectar" "$tmp/staged.nectar" && ! cmp -s "$tmp/regkl.nectar" "$tmp/staged.nectar" &&
    ok "--kl-steps: one run equals the fit, then --init --loss kl" || fail "--kl-steps against --init --loss kl"
train -o "$tmp/kl100.nectar" --loss kl --steps 100 --lr 1e-2 > /dev/null 2>&1
train -o "$tmp/kl100s.nectar" --steps 0 --kl-steps 100 --kl-lr 1e-2 > /dev/null 2>&1
cmp -s "$tmp/kl100.nectar" "$tmp/kl100s.nectar" && ok "--steps 0 --kl-steps 100 equals --loss kl --steps 100" \
    || fail "--steps 0 --kl-steps against --loss kl"
for stop in 400 450; do
    rm -f "$tmp/ck_staged" "$tmp/resumed.nectar"
    train -o "$tmp/resumed.nectar" $staged --checkpoint "$tmp/ck_staged" --stop-after $stop > /dev/null 2> "$tmp/log1"
    train -o "$tmp/resumed.nectar" $staged --resume "$tmp/ck_staged" > /dev/null 2> "$tmp/log2"
    grep -q "^stopped after step $stop " "$tmp/log1" && grep -q "^resumed from .* at step $stop$" "$tmp/log2" &&
        cmp -s "$tmp/staged.nectar" "$tmp/resumed.nectar" &&
        ok "--kl-steps: stopped after step $stop, resumed, the same bytes" || fail "--kl-steps resumed after step $stop"
done
# the KL stage's teacher logits recomputed (the first stage, by regression, has no KL term)
train -o "$tmp/staged_redo.nectar" $staged --teacher-logits-mb 0 --json > "$tmp/staged_redo.json" 2> "$tmp/log"
a=$(json "$tmp/staged.json" random kl) b=$(json "$tmp/staged_redo.json" random kl)
grep -q "recomputed at each KL step" "$tmp/log" && is "($a - $b)^2 <= (1e-4 * $a)^2 && $a > 0" \
    && ok "--kl-steps, teacher logits recomputed: the same KL fit (1e-4)" || fail "--kl-steps recomputed: '$a' '$b'"

# quadrature with rho = 1 (p = n, W = K, Z = V) at initialisation is exact
train -o "$tmp/quad.nectar" --arch quad --rho 1 --steps 0 --json > "$tmp/quad.json" 2> /dev/null
mse=$(json "$tmp/quad.json" random target_mse) agree=$(json "$tmp/quad.json" random agree)
echo "    quadrature rho 1 untrained: target MSE $mse, agreement $agree"
rte=$(json "$tmp/quad.json" random rte) kl=$(json "$tmp/quad.json" random kl)
is "$mse < 1e-10 && $agree == 1 && $rte < 1e-6 && $kl < 1e-9" && ok "quadrature rho = 1 at init: zero error, RTE and KL" || fail "quadrature rho = 1 at init"

# the regression preset fits quadrature's log mass too (--lambda-alpha 0.1): left out, the merge weighs the document wrongly
train -o "$tmp/quad_fit.nectar" --arch quad --steps 200 --json > "$tmp/quad_fit.json" 2> /dev/null
train -o "$tmp/quad_A.nectar" --arch quad --steps 200 --lambda-alpha 0 --json > "$tmp/quad_A.json" 2> /dev/null
a=$(json "$tmp/quad_fit.json" random score_mse) b=$(json "$tmp/quad_A.json" random score_mse)
echo "    quadrature by regression, score MSE: $a with the preset, $b with --lambda-alpha 0"
is "$a < 0.5 * $b" && ok "the regression preset fits quadrature's score" || fail "quadrature's regression preset: '$a' '$b'"

# layer-group multipliers keep the total budget: layers 1-2 get twice layer 0's share
train -o "$tmp/groups.nectar" --steps 0 --groups 0-1:1,1-3:2 > "$tmp/groups.txt" 2> /dev/null
train -o "$tmp/uniform.nectar" --steps 0 > "$tmp/uniform.txt" 2> /dev/null
g_total=$(sed -nE 's/.*total ([0-9]+) params.*/\1/p' "$tmp/groups.txt") u_total=$(sed -nE 's/.*total ([0-9]+) params.*/\1/p' "$tmp/uniform.txt")
w0=$(awk '$1 == "0" && NF == 6 { print $3 }' "$tmp/groups.txt") w2=$(awk '$1 == "2" && NF == 6 { print $3 }' "$tmp/groups.txt")
echo "    --groups 0-1:1,1-3:2: widths $w0 (layer 0) and $w2 (layer 2), $g_total params against $u_total uniform"
is "$w2 > $w0 && $g_total <= 1.1 * $u_total && $g_total >= 0.9 * $u_total" && ok "--groups: more width where asked, same total budget" || fail "--groups"
train -o "$tmp/long.nectar" --steps 0 --groups "$(printf '0-1:1,%.0s' $(seq 50))1-3:2" > "$tmp/long.txt" 2> /dev/null
diff -q <(grep total "$tmp/groups.txt") <(grep total "$tmp/long.txt") > /dev/null && ok "--groups of 305 characters: read to the end" || fail "--groups of 305 characters"

# blank lines of a prompt-id file (spaces, a CR) are skipped, not read as empty prompts
printf '5 6 7\n \n8 9 10\n\r\n11 12 13\n' > "$tmp/blank.ids"
train -o "$tmp/blank.nectar" --steps 0 --prompt-ids "$tmp/blank.ids" > /dev/null 2> "$tmp/log"
grep -q "^read 3 prompts" "$tmp/log" && ok "blank lines of --prompt-ids are not prompts" || fail "blank lines of --prompt-ids: $(grep '^read' "$tmp/log")"

# the budget is floor(rho n) of the decimal rho: 0.53 x 200 = 106 pairs, though 0.53 is stored as 0.52999997
train -o "$tmp/q53.nectar" --arch quad --rho 0.53 --steps 0 > "$tmp/q53.txt" 2> /dev/null
pairs=$(awk '$1 == "0" && NF == 6 { print $3 }' "$tmp/q53.txt")
[ "$pairs" = 106 ] && ok "--arch quad --rho 0.53, 200 tokens: 106 pairs" || fail "--rho 0.53: got '$pairs' pairs, want 106"

# infer with the module
"$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/fit.nectar" -I "$tmp/prompt.ids" --compare -n 8 -t 0 > "$tmp/cmp" 2> "$tmp/log"
[ "$(grep -c '^--- ' "$tmp/cmp")" -eq 3 ] && grep -q "^storage: " "$tmp/log" && ok "--compare: three generations and a storage line" || fail "--compare"
"$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/fit.nectar" --eval --json > "$tmp/eval.json" 2> /dev/null
[ "$(json "$tmp/eval.json" random kl)" = "$(json "$tmp/fit.json" random kl)" ] && ok "infer --eval reproduces train's held-out KL" || fail "infer --eval"
"$bin/infer" -m "$tmp/model.bin" -k "$tmp/fit.nectar" -I "$tmp/prompt.ids" -n 8 -t 0 --ids > "$tmp/nectar.ids" 2> /dev/null
sed -n 4p "$tmp/cmp" | cmp -s - "$tmp/nectar.ids" && ok "-k alone (no document at all) generates what --compare's Nectar did" || fail "-k alone"

# compositions: two short documents, each prefilled on its own, the second after the first; oracle modules
# (quadrature, rho 1, at initialisation: W = K, Z = V) of each, the second fitted as a later document, stand in
# for them exactly: the same greedy tokens as the exact composition, KL 0 and agreement 1 on each one's held-out
# prompts; mixed (one exact, one by modules) too. The true concatenation (study --joined: the second
# document's prefill attends to the first) is another reference, and the measure sees the difference.
awk 'BEGIN { srand(6); for (i = 0; i < 60; i++) printf "%d ", 3 + int(rand() * 290) }' > "$tmp/first.ids"
awk 'BEGIN { srand(7); for (i = 0; i < 50; i++) printf "%d ", 3 + int(rand() * 290) }' > "$tmp/second.ids"
train -D "$tmp/first.ids" -o "$tmp/first.nectar" --arch quad --rho 1 --steps 0 > /dev/null 2>&1
train -D "$tmp/second.ids" --later-document -o "$tmp/second.nectar" --arch quad --rho 1 --steps 0 > /dev/null 2>&1
docs=(-D "$tmp/first.ids" -D "$tmp/second.ids")
"$bin/infer" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/first.nectar" -k "$tmp/second.nectar" -I "$tmp/prompt.ids" \
    --compare -n 12 -t 0 --ids > "$tmp/cmp2" 2> "$tmp/log" || cat "$tmp/log"
[ -n "$(sed -n 2p "$tmp/cmp2")" ] && [ "$(sed -n 2p "$tmp/cmp2")" = "$(sed -n 4p "$tmp/cmp2")" ] \
    && ok "two documents, oracle modules: --compare's Nectar tokens = exact" || fail "composition --compare: $(cat "$tmp/cmp2")"
"$bin/infer" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/second.nectar" -I "$tmp/prompt.ids" -n 12 -t 0 --ids \
    > "$tmp/mixed.ids" 2> /dev/null
sed -n 2p "$tmp/cmp2" | cmp -s - "$tmp/mixed.ids" && ok "mixed (first exact, second by modules): the exact tokens" \
    || fail "mixed composition: $(cat "$tmp/mixed.ids")"
"$bin/infer" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/second.nectar" -k "$tmp/first.nectar" --eval --json \
    > "$tmp/eval2.json" 2> "$tmp/log" || cat "$tmp/log"
kls=$(grep -o '"random": {[^}]*' "$tmp/eval2.json" | sed -E 's/.*"kl": ([-0-9.e+]+).*/\1/' | tr '\n' ' ')
agrees=$(grep -o '"random": {[^}]*' "$tmp/eval2.json" | sed -E 's/.*"agree": ([-0-9.e+]+).*/\1/' | tr '\n' ' ')
echo "    two documents, oracle modules: held-out KL $kls, agreement $agrees (each module file's prompts)"
set -- $kls; k1=${1:-1} k2=${2:-1}; set -- $agrees
grep -q '"modules": \[{"module": ' "$tmp/eval2.json" && grep -q '"score_mse": null' "$tmp/eval2.json" && \
    is "$k1 < 1e-9 && $k2 < 1e-9 && ${1:-0} == 1 && ${2:-0} == 1" \
    && ok "--eval of a composition: each module's prompts, KL 0, agreement 1" || fail "composition --eval"
"$bin/study" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/first.nectar" -k "$tmp/second.nectar" --joined --json \
    > "$tmp/joined.json" 2> "$tmp/log" || cat "$tmp/log"
kj=$(grep -o '"random": {[^}]*' "$tmp/joined.json" | head -n 1 | sed -E 's/.*"kl": ([-0-9.e+]+).*/\1/')
echo "    KL(joined prefill || documents apart) on the first module's prompts: $kj"
is "${kj:-0} > 1e-4" && ok "--joined: the true concatenation differs from documents prefilled apart" || fail "--joined: '$kj'"
expect_refusal "a later document's modules first are refused" "fitted as a later document" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/second.nectar" -I "$tmp/prompt.ids"
expect_refusal "a first document's modules second are refused" "fitted as a first document" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/first.nectar" -k "$tmp/first.nectar" -I "$tmp/prompt.ids"
expect_refusal "--eval of modules without their document's text is refused" "text is not given" \
    "$bin/infer" -m "$tmp/model.bin" -D "$tmp/first.ids" -k "$tmp/first.nectar" -k "$tmp/second.nectar" --eval
expect_refusal "study of modules without their document's text is refused" "text is not given" \
    "$bin/study" -m "$tmp/model.bin" -D "$tmp/first.ids" -k "$tmp/first.nectar" -k "$tmp/second.nectar" --stops
expect_refusal "--joined of one document is refused" "two or more" \
    "$bin/study" -m "$tmp/model.bin" -D "$tmp/first.ids" -k "$tmp/first.nectar" --joined
expect_refusal "--drift of two module files is refused" "one -k" \
    "$bin/study" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/first.nectar" -k "$tmp/second.nectar" --drift 8
expect_refusal "--joined where generation reads modules is refused (infer has none)" "unknown" \
    "$bin/infer" -m "$tmp/model.bin" "${docs[@]}" -k "$tmp/second.nectar" --joined -I "$tmp/prompt.ids"
expect_refusal "documents beyond the context together are refused" "leave no room" \
    "$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -D "$tmp/doc2.ids" -I "$tmp/prompt.ids"
expect_refusal "a composition of nine documents is refused" "more than 8 documents" \
    "$bin/infer" -m "$tmp/model.bin" $(for i in 1 2 3 4 5 6 7 8 9; do printf -- '-D %s ' "$tmp/prompt.ids"; done) \
    -I "$tmp/prompt.ids"

# --answer-len 0 (no answers): its self-study file and its module file read back
train -o "$tmp/cap0.nectar" --steps 0 --answer-len 0 --save-self-study "$tmp/cap0.ss" > /dev/null 2> "$tmp/log" &&
    "$bin/study" fit -m "$tmp/model.bin" -D "$tmp/doc.ids" --prompt-len 32 --loss regression --steps 0 --answer-len 0 \
        --self-study "$tmp/cap0.ss" -o "$tmp/cap0_again.nectar" > /dev/null 2>> "$tmp/log" &&
    "$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/cap0_again.nectar" --eval > /dev/null 2>> "$tmp/log" &&
    cmp -s "$tmp/cap0.nectar" "$tmp/cap0_again.nectar" && ok "--answer-len 0: its self-study and module files read back" \
    || { fail "--answer-len 0"; tail -n 3 "$tmp/log"; }

# answers: the --prompt-ids lines are questions; their held-out ones get greedy rollouts (no tokenizer, so no
# newline stop: each answer runs to --answer-len tokens) in train's JSON and table, infer --eval's JSON and list
awk 'BEGIN { srand(5); for (i = 0; i < 30; i++) { for (j = 0; j < 4; j++) printf "%d ", 3 + int(rand() * 290); print "" } }' \
    > "$tmp/questions.ids"
train -o "$tmp/answers.nectar" --steps 200 --prompt-ids "$tmp/questions.ids" --answer-len 6 --json > "$tmp/answers.json" 2> "$tmp/log" || cat "$tmp/log"
n=$(json "$tmp/answers.json" random n_answers) match=$(json "$tmp/answers.json" random answer_match)
nodoc=$(json "$tmp/answers.json" random answer_match_nodoc) prefix=$(json "$tmp/answers.json" random answer_prefix)
echo "    held-out answers: $n task prompts, answer match $match (no document $nodoc), prefix reproduced $prefix"
is "$n > 0 && $match >= 0 && $match <= 1 && $nodoc >= 0 && $nodoc <= 1 && $prefix >= $match && $prefix <= 1" \
    && ok "train --json: answer_match, answer_match_nodoc, answer_prefix" || fail "train --json answer metrics: '$n' '$match' '$nodoc' '$prefix'"
[ "$(json "$tmp/answers.json" challenge n_answers)" -le "$n" ] && ok "train --json: answer metrics of the challenge split" || fail "challenge answers"
train -o "$tmp/answers.nectar" --steps 200 --prompt-ids "$tmp/questions.ids" --answer-len 6 > "$tmp/answers.txt" 2> /dev/null
[ "$(grep -c "equal to the full cache's" "$tmp/answers.txt")" -eq 2 ] && grep -q "answers to the $n task prompts" "$tmp/answers.txt" \
    && ok "train's tables: the answer match of both splits" || fail "train's tables: answer match"
"$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/answers.nectar" --eval --json > "$tmp/eval.json" 2> /dev/null
[ "$(json "$tmp/eval.json" random answer_match)" = "$match" ] && [ "$(json "$tmp/eval.json" random answer_prefix)" = "$prefix" ] \
    && ok "infer --eval reproduces train's answer metrics" || fail "infer --eval answer metrics"
"$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/answers.nectar" --eval > "$tmp/answers.list" 2> /dev/null
[ "$(grep -c '^\[' "$tmp/answers.list")" -eq "$n" ] && [ "$(grep -c '^    Nectar: ' "$tmp/answers.list")" -eq "$n" ] \
    && grep -q "^random split: Nectar's answer equals the full cache's on" "$tmp/answers.list" \
    && ok "infer --eval: each held-out task prompt, then the match" || fail "infer --eval"
"$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/answers.nectar" --eval --json \
    > "$tmp/answers_ids.json" 2> /dev/null
python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
ok = all(len(d["answers"][k]) == d[k]["n_answers"] and
         sum(a["nectar"] == a["full"] for a in d["answers"][k]) == round(d[k]["answer_match"] * d[k]["n_answers"])
         for k in ("random", "challenge"))
sys.exit(not ok)' "$tmp/answers_ids.json" && ok "infer --eval --json: the answers, and the match they make" \
    || fail "infer --eval --json"
# the KL term's teacher logits recomputed at each step (--teacher-logits-mb 0) instead of kept: the same fit,
# but for the last bits of the batched teacher pass against a prompt alone
train -o "$tmp/kl_kept.nectar" --steps 30 --loss kl --json > "$tmp/kl_kept.json" 2> /dev/null
train -o "$tmp/kl_redo.nectar" --steps 30 --loss kl --teacher-logits-mb 0 --json > "$tmp/kl_redo.json" 2> "$tmp/log"
a=$(json "$tmp/kl_kept.json" random kl) b=$(json "$tmp/kl_redo.json" random kl)
echo "    KL after 30 steps: $a (logits kept), $b (recomputed)"
grep -q "recomputed at each KL step" "$tmp/log" && is "($a - $b)^2 <= (1e-4 * $a)^2 && $a > 0" \
    && ok "--teacher-logits-mb 0: the teacher's logits recomputed give the same KL fit (1e-4)" || fail "recomputed teacher logits: '$a' '$b'"
# the KL term's teacher as its top k: with k = V (300) the whole distribution, the same fit; k = 16 still fits
train -o "$tmp/kl_top.nectar" --steps 30 --loss kl --kl-top-k 300 --json > "$tmp/kl_top.json" 2> /dev/null
train -o "$tmp/kl_top16.nectar" --steps 30 --loss kl --kl-top-k 16 --json > "$tmp/kl_top16.json" 2> /dev/null
train -o "$tmp/kl_top0.nectar" --steps 0 --loss kl --json > "$tmp/kl_top0.json" 2> /dev/null
c=$(json "$tmp/kl_top.json" random kl) d=$(json "$tmp/kl_top16.json" random kl) e=$(json "$tmp/kl_top0.json" random kl)
echo "    KL after 30 steps: $a (whole vocabulary), $c (top 300 of 300), $d (top 16); untrained $e"
is "($a - $c)^2 <= (1e-4 * $a)^2 && $a > 0" && ok "--kl-top-k V: the KL fit of the whole vocabulary (1e-4)" \
    || fail "--kl-top-k 300: '$a' '$c'"
is "$d < 0.8 * $e" && ok "--kl-top-k 16 fits: held-out KL below 0.8x the untrained modules'" || fail "--kl-top-k 16: '$d' '$e'"
# self-study tasks: the default model writes its own tasks about its document and answers them to the newline
if [ -f data/model.bin ]; then
    "$bin/pretrain" --write-doc "$tmp/doc0" 2> /dev/null && cmp -s "$tmp/doc0/doc.txt" data/doc.txt && \
        cmp -s "$tmp/doc0/prompts.txt" data/prompts.txt && cmp -s "$tmp/doc0/doc.qa" data/doc.qa \
        && ok "pretrain --write-doc, index 0: data/doc.txt, prompts.txt, doc.qa" || fail "pretrain --write-doc, index 0"
    "$bin/pretrain" --write-doc "$tmp/doc7" --doc-index 7 2> /dev/null && ! cmp -s "$tmp/doc7/doc.txt" data/doc.txt \
        && ok "pretrain --write-doc --doc-index 7: another document" || fail "pretrain --write-doc --doc-index 7"
    # its questions: one on each fact, four options, the right one the document's
    facts=$(tr '.' '\n' < "$tmp/doc7/doc.txt" | grep -c '[a-z]')
    n_q=$(grep -c '^? ' "$tmp/doc7/doc.qa")
    rights=$(sed -n 's/^+ \(.*\)\.\\n$/\1/p' "$tmp/doc7/doc.qa")
    in_doc=$(for r in $rights; do grep -qw -- "$r" "$tmp/doc7/doc.txt" && echo y; done | wc -l)
    [ "$n_q" = "$facts" ] && [ "$in_doc" = "$n_q" ] && [ "$(grep -c '^[-+] ' "$tmp/doc7/doc.qa")" = $((4 * n_q)) ] \
        && ok "doc.qa: a question on each of the $facts facts, its answer the document's" || fail "doc.qa: $n_q questions, $facts facts, $in_doc answers in the document"
    # evaluation-only tasks: their own split, measured the same by infer --eval, and never trained on (the
    # self-study split's metrics are those of a run without them)
    et="-m data/model.bin -z data/tokenizer.bin -d data/doc.txt --n-prompts 10 --tasks 30 --steps 40 --json"
    "$bin/train" $et --eval-tasks 40 -o "$tmp/et.nectar" > "$tmp/et.json" 2> "$tmp/log" || cat "$tmp/log"
    "$bin/train" $et --eval-tasks 0 -o "$tmp/et0.nectar" > "$tmp/et0.json" 2> "$tmp/log" || cat "$tmp/log"
    "$bin/infer" -m data/model.bin -z data/tokenizer.bin -d data/doc.txt -k "$tmp/et.nectar" --eval --json \
        > "$tmp/et_infer.json" 2> "$tmp/log" || cat "$tmp/log"
    python3 -c 'import json, sys
t, t0, i = (json.load(open(p)) for p in sys.argv[1:])
ok = t["tasks"]["n_prompts"] > 0 and t["tasks"]["n_answers"] > 0 and "tasks" not in t0
ok = ok and t["tasks"] == i["tasks"] and t["random"] == t0["random"] == i["random"] and t["challenge"] == t0["challenge"]
print("    evaluation-only tasks:", t["tasks"]["n_prompts"], "answer match", t["tasks"]["answer_match"], t["tasks"]["answer_match_ci"])
sys.exit(not ok)' "$tmp/et.json" "$tmp/et0.json" "$tmp/et_infer.json" \
        && ok "--eval-tasks: their own split, as infer --eval has it; the fit unchanged" || fail "--eval-tasks"
    # --eval-tasks-from: another fit (rho 5%) measured on the same tasks; the run itself checks that no task's
    # question starts a self-study prompt (the same self-study as et.nectar's: none may)
    "$bin/study" fit $et --rho 0.05 --eval-tasks-from "$tmp/et.nectar" -o "$tmp/et_from.nectar" > "$tmp/et_from.json" \
        2> "$tmp/log" || cat "$tmp/log"
    python3 -c 'import json, sys
t, f = (json.load(open(p))["tasks"] for p in sys.argv[1:])
same = ("n_prompts", "n_answers", "n_positions", "kl_nodoc", "agree_nodoc", "answer_match_nodoc")
sys.exit(not all(t[k] == f[k] for k in same) or t["kl"] == f["kl"])' "$tmp/et.json" "$tmp/et_from.json" \
        && ok "--eval-tasks-from: the same tasks (no-document metrics equal), another fit" || fail "--eval-tasks-from"
    "$bin/study" fit $et --eval-tasks-from "$tmp/et0.nectar" -o "$tmp/x.nectar" > /dev/null 2> "$tmp/log"
    [ $? -eq 1 ] && grep -q "^error: .*holds no evaluation-only tasks" "$tmp/log" \
        && ok "--eval-tasks-from a file without tasks is refused" || fail "--eval-tasks-from et0: $(head -c 200 "$tmp/log")"
    # --save-self-study, then --self-study: the same prompts and tasks, so the same module bytes as et.nectar's
    # run; refused: a file for another document, a changed byte, other answer conventions, options that would
    # make prompts beside it, and the file as another output of the run
    ss="-m data/model.bin -z data/tokenizer.bin -d data/doc.txt --steps 40 --json"
    "$bin/study" fit $ss --n-prompts 10 --tasks 30 --eval-tasks 40 --save-self-study "$tmp/ss.bin" -o "$tmp/ss_made.nectar" \
        > /dev/null 2> "$tmp/log" || cat "$tmp/log"
    "$bin/study" fit $ss --self-study "$tmp/ss.bin" -o "$tmp/ss_read.nectar" > /dev/null 2> "$tmp/log" || cat "$tmp/log"
    cmp -s "$tmp/ss_made.nectar" "$tmp/et.nectar" && cmp -s "$tmp/ss_read.nectar" "$tmp/et.nectar" \
        && grep -q "^[0-9]* self-study prompts and [0-9]* evaluation-only tasks from " "$tmp/log" \
        && ok "--self-study of a --save-self-study: the same module bytes" || fail "--self-study: $(tail -n 3 "$tmp/log")"
    expect_refusal "--self-study for another document is refused" "different document" \
        "$bin/study" fit -m data/model.bin -z data/tokenizer.bin -d "$tmp/doc7/doc.txt" --self-study "$tmp/ss.bin" -o "$tmp/x.nectar"
    cp "$tmp/ss.bin" "$tmp/ss_flip.bin" && poke "$tmp/ss_flip.bin" 80 7
    expect_refusal "--self-study of a changed byte is refused by its checksum" "checksum does not match" \
        "$bin/study" fit $ss --self-study "$tmp/ss_flip.bin" -o "$tmp/x.nectar"
    expect_refusal "--self-study with another --answer-len is refused" "answers end and start otherwise" \
        "$bin/study" fit $ss --self-study "$tmp/ss.bin" --answer-len 20 -o "$tmp/x.nectar"
    expect_refusal "--self-study with --tasks is refused" "drop --n-prompts" \
        "$bin/study" fit $ss --self-study "$tmp/ss.bin" --tasks 5 -o "$tmp/x.nectar"
    expect_refusal "--save-self-study onto -o is refused" "another output" \
        "$bin/study" fit $ss --save-self-study "$tmp/x.nectar" -o "$tmp/x.nectar"
    # --far-prompts 3 --far-len 40, on the saved self-study: three more training prompts of at least 40 tokens
    # each (training task questions continued), the held-out prompts unchanged (no document's KL on them the same)
    "$bin/study" fit $ss --self-study "$tmp/ss.bin" --eval-train -o "$tmp/near.nectar" > "$tmp/near.json" 2> /dev/null
    "$bin/study" fit $ss --self-study "$tmp/ss.bin" --eval-train --far-prompts 3 --far-len 40 -o "$tmp/far.nectar" \
        > "$tmp/far.json" 2> "$tmp/log" || cat "$tmp/log"
    python3 -c 'import json, sys
near, far = (json.load(open(p)) for p in sys.argv[1:])
ok = far["train"]["n_prompts"] == near["train"]["n_prompts"] + 3
ok = ok and far["train"]["n_positions"] >= near["train"]["n_positions"] + 3 * 40
ok = ok and all(far[k]["n_prompts"] == near[k]["n_prompts"] and far[k]["kl_nodoc"] == near[k]["kl_nodoc"]
                for k in ("random", "tasks"))
sys.exit(not ok)' "$tmp/near.json" "$tmp/far.json" \
        && ok "--far-prompts 3 --far-len 40: three long training prompts, the held-out ones as they were" \
        || fail "--far-prompts"
    # train --qa reports the questions as infer --qa does with the same modules
    "$bin/train" -m data/model.bin -z data/tokenizer.bin -d data/doc.txt --n-prompts 20 --tasks 0 --steps 50 \
        -o "$tmp/qa.nectar" --qa data/doc.qa --json > "$tmp/qa_train.json" 2> "$tmp/log" || cat "$tmp/log"
    "$bin/infer" -m data/model.bin -z data/tokenizer.bin -d data/doc.txt -k "$tmp/qa.nectar" --qa data/doc.qa --json \
        > "$tmp/qa_infer.json" 2> "$tmp/log" || cat "$tmp/log"
    python3 -c 'import json, sys; t, i = (json.load(open(p)) for p in sys.argv[1:]); sys.exit(t["qa"] != i or i["n"] != 5)' \
        "$tmp/qa_train.json" "$tmp/qa_infer.json" && ok "train --qa: the \"qa\" object of infer --qa, 5 questions" \
        || fail "train --qa against infer --qa"
    "$bin/train" -m data/model.bin -z data/tokenizer.bin -d data/doc.txt --n-prompts 10 --tasks 12 --steps 0 \
        -o "$tmp/tasks.nectar" --json > "$tmp/tasks.json" 2> "$tmp/log"
    kept=$(tr '\r' '\n' < "$tmp/log" | sed -nE 's/^tasks: ([0-9]+) quote, ([0-9]+) continue, ([0-9]+) question kept.*/\1 \2 \3/p')
    echo "    tasks kept (quote, continue, question): $kept; held-out task prompts $(json "$tmp/tasks.json" random n_answers)"
    [ "$kept" = "4 4 4" ] && is "$(json "$tmp/tasks.json" random n_answers) > 0" \
        && ok "--tasks 12: 4 of each kind, held-out ones answered" || fail "--tasks 12: '$kept'"
    # a model that writes none of the tasks well formed (random weights): the progress line counts the
    # tries, and the end says what to do about it
    ./tests/random_model "$tmp/vocab259.bin" 64 160 3 8 2 259 512 5 0.15 2> /dev/null
    "$bin/train" -m "$tmp/vocab259.bin" -z data/tokenizer.bin -d data/doc.txt --n-prompts 8 --tasks 3 --eval-tasks 3 \
        --steps 0 -o "$tmp/none.nectar" > "$tmp/out" 2> "$tmp/log"
    tr '\r' '\n' < "$tmp/log" > "$tmp/lines"
    grep -q "^tasks 0/3 kept, 24/24 tries" "$tmp/lines" && grep -q "^tasks: none kept: .*(--tasks 0 skips" "$tmp/lines" \
        && grep -q "^evaluation-only tasks: none kept: .*(--eval-tasks 0 skips" "$tmp/lines" \
        && ok "no task kept: the tries counted, and --tasks 0 and --eval-tasks 0 named" \
        || { fail "no task kept"; grep -i task "$tmp/lines"; }
    # its challenge split is one prompt: the table says there is no interval, not [nan, nan]
    [ "$(grep -c "interval none (fewer than 2 prompts)" "$tmp/out")" = 2 ] && ! grep -qi nan "$tmp/out" \
        && ok "a one-prompt split: no interval, said in words" || { fail "a one-prompt split's interval"; cat "$tmp/out"; }
    # --drift over one held-out task: its bins have no interval either, in words and as null in JSON
    drift=("$bin/study" -m data/model.bin -z data/tokenizer.bin -d data/doc.txt -k "$tmp/tasks.nectar" --drift 16
           --drift-prompts 1)
    "${drift[@]}" > "$tmp/out" 2> "$tmp/log" && "${drift[@]}" --json > "$tmp/drift.json" 2>> "$tmp/log"
    grep -q "none (fewer than 2 prompts)" "$tmp/out" && ! grep -qi nan "$tmp/out" \
        && grep -q '"kl_ci": null' "$tmp/drift.json" && ! grep -qi nan "$tmp/drift.json" \
        && ok "--drift of one prompt: no interval, said in words and null" \
        || { fail "--drift of one prompt"; cat "$tmp/out" "$tmp/drift.json" "$tmp/log"; }
fi

# refusals: another document, another model, truncated or corrupt files
expect_refusal "module with another document is refused" "different document" \
    "$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc2.ids" -k "$tmp/fit.nectar" -I "$tmp/prompt.ids"
expect_refusal "module with another model is refused" "different model" \
    "$bin/infer" -m "$tmp/other.bin" -k "$tmp/fit.nectar" -I "$tmp/prompt.ids"
head -c 300 "$tmp/fit.nectar" > "$tmp/trunc.nectar"
expect_refusal "truncated module file is refused" "truncated" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/trunc.nectar" -I "$tmp/prompt.ids"
head -c 60 "$tmp/fit.nectar" > "$tmp/short.nectar"
expect_refusal "module file shorter than its header is refused" "shorter than" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/short.nectar" -I "$tmp/prompt.ids"
{ printf 'XXXX'; tail -c +5 "$tmp/fit.nectar"; } > "$tmp/magic.nectar"
expect_refusal "module file with a bad magic number is refused" "not a Nectar module" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/magic.nectar" -I "$tmp/prompt.ids"
# header fields (int32 at byte offsets): depths 24, 28, 32; n_doc 36; then 128 bytes of header and 3 x 2 table entries of 8
cp "$tmp/fit.nectar" "$tmp/depths.nectar" && poke "$tmp/depths.nectar" 24 2147483647 2147483647 2 && reseal "$tmp/depths.nectar"
expect_refusal "module file with depths whose sum overflows is refused" "inconsistent" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/depths.nectar" -I "$tmp/prompt.ids"
cp "$tmp/fit.nectar" "$tmp/ndoc.nectar" && poke "$tmp/ndoc.nectar" 36 1000 && reseal "$tmp/ndoc.nectar"
expect_refusal "module file whose n_doc is not the document's is refused" "document of 1000 tokens" \
    "$bin/infer" -m "$tmp/model.bin" -D "$tmp/doc.ids" -k "$tmp/ndoc.nectar" -I "$tmp/prompt.ids"
cp "$tmp/fit.nectar" "$tmp/nan.nectar" && poke "$tmp/nan.nectar" $((128 + 6 * 8)) 2143289344 && reseal "$tmp/nan.nectar"
expect_refusal "module file with a NaN parameter is refused" "is nan" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/nan.nectar" -I "$tmp/prompt.ids"
# any byte changed (a parameter: the bits of 1.0f) and not resealed: the checksum
cp "$tmp/fit.nectar" "$tmp/flip.nectar" && poke "$tmp/flip.nectar" $((128 + 6 * 8)) 1065353216
expect_refusal "module file with a changed byte is refused by its checksum" "checksum does not match" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/flip.nectar" -I "$tmp/prompt.ids"
# each header field against its range (resealed): rho (float at 40) NaN, -1, 1e30, and 1e-5 (a budget below
# the modules' sizes); the chat flag (int at 80); an input scale of 0 and of inf (the table's first entry: its
# size at 128, its scale at 132)
for bad in "40 2143289344:NaN rho:rho is not a number" "40 -1082130432:rho -1:rho is not a number" \
           "40 1900671690:rho 1e30:rho is not a number" \
           "40 925353388:rho 1e-5, below the modules' size:larger than its budget" "80 7:chat flag 7:chat flag" \
           "132 0:input scale 0:inconsistent" "132 2139095040:input scale inf:inconsistent"; do
    field=${bad%%:*} rest=${bad#*:}
    cp "$tmp/fit.nectar" "$tmp/field.nectar" && poke "$tmp/field.nectar" $field && reseal "$tmp/field.nectar"
    expect_refusal "module file with ${rest%%:*} is refused" "${rest#*:}" \
        "$bin/infer" -m "$tmp/model.bin" -k "$tmp/field.nectar" -I "$tmp/prompt.ids"
done
cp "$tmp/ck" "$tmp/ck_step" && poke "$tmp/ck_step" 8 -1
expect_refusal "checkpoint with a negative step is refused" "step count is corrupt" \
    train -o "$tmp/x.nectar" --steps 400 --resume "$tmp/ck_step"
seq 3 62 | tr '\n' ' ' > "$tmp/long_prompt.ids"
expect_refusal "module (200 tokens) plus a 60-token prompt beyond the context of 256" "exceed the model's context" \
    "$bin/infer" -m "$tmp/model.bin" -k "$tmp/fit.nectar" -I "$tmp/long_prompt.ids"
expect_refusal "train on a model file that is not one" "out of range" \
    "$bin/train" -m "$tmp/fit.nectar" -D "$tmp/doc.ids" -o "$tmp/y.nectar"
expect_refusal "train with a rho too small for one unit" "no room for even one" \
    train -o "$tmp/z.nectar" --rho 0.0001

# GGUF models: the same programs on the small Llama-shaped model of
# tests/data (its byte-level tokenizer from the file; no -z); modules fitted
# to it are refused for another model; a GGUF SentencePiece tokenizer gives
# the ids of the tokenizer.bin it was converted from
gguf=tests/data/gguf_llama.gguf
printf 'The cat is on the mat. That was it.\nAnd the dog ate the hat in the house.\n' > "$tmp/doc.txt"
"$bin/study" fit -m $gguf -d "$tmp/doc.txt" --no-chat -o "$tmp/gguf.nectar" --steps 100 --n-prompts 30 --prompt-len 12 \
    --json > "$tmp/gguf.json" 2> "$tmp/log" || cat "$tmp/log"
if [ -s "$tmp/gguf.nectar" ]; then ok "train on a GGUF model and a text document"; else fail "train on a GGUF model"; fi
got=$("$bin/infer" -m $gguf -d "$tmp/doc.txt" -k "$tmp/gguf.nectar" --eval --json 2> "$tmp/log")
[ -n "$got" ] && ok "infer --eval of its modules on the GGUF model" || { fail "infer --eval on a GGUF model"; cat "$tmp/log"; }
expect_refusal "modules fitted to a GGUF model refused for another" "different model" \
    "$bin/infer" -m tests/data/gguf_mistral.gguf -k "$tmp/gguf.nectar" -i "the"
expect_refusal "modules fitted without --chat are refused with --chat" "drop --chat" \
    "$bin/infer" -m $gguf -k "$tmp/gguf.nectar" --chat -i "the"
"$bin/study" fit -m $gguf -d "$tmp/doc.txt" --chat -o "$tmp/chat.nectar" --steps 20 --n-prompts 20 --prompt-len 12 \
    > /dev/null 2> "$tmp/log" || cat "$tmp/log"
chat_ids=$("$bin/infer" --encode -m $gguf --chat -i "Where is the cat?")
case "$chat_ids" in "$("$bin/infer" --encode -m $gguf -i "<|im_start|>system")"*) ok "--chat: the turn starts with the template's system message" ;;
    *) fail "--chat framing: '$chat_ids'" ;; esac
got=$("$bin/infer" -m $gguf -d "$tmp/doc.txt" -k "$tmp/chat.nectar" --chat -i "Where is the cat?" --compare -t 0 -n 4 2> "$tmp/log")
[ -n "$got" ] && ok "--chat: modules fitted to a chat turn generate (--compare)" || { fail "--chat --compare"; cat "$tmp/log"; }
expect_refusal "modules fitted with --chat are refused without it" "add --chat" \
    "$bin/infer" -m $gguf -k "$tmp/chat.nectar" -i "the"
# a model with a chat template and a text document: train frames it as a chat turn without being told
"$bin/study" fit -m $gguf -d "$tmp/doc.txt" -o "$tmp/auto.nectar" --steps 20 --n-prompts 20 --prompt-len 12 \
    --json > "$tmp/auto.json" 2> "$tmp/log" || cat "$tmp/log"
grep -q "^the model has a chat template" "$tmp/log" && "$bin/infer" -m $gguf -k "$tmp/auto.nectar" --chat -i "the" -n 2 \
    > /dev/null 2>&1 && ok "train picks --chat for a model with a chat template (--no-chat: plain text)" \
    || fail "train's chat default"
# and the chat recipe's defaults where the command line is silent (quadrature, 400 KL steps, the teacher's top 32),
# the plain one's without
# (the recipe's KL stage goes with its loss: a chat run with --loss kl has none)
"$bin/study" fit -m $gguf -d "$tmp/doc.txt" -o "$tmp/auto_kl.nectar" --steps 5 --n-prompts 20 --prompt-len 12 --loss kl \
    --json > "$tmp/auto_kl.json" 2> "$tmp/log" || cat "$tmp/log"
grep -q '"arch": "quad", .*"steps": 20, "kl_steps": 400, "kl_top_k": 32, "loss": "regression", "lr": 0.03, "kl_lr": 0.006,' \
    "$tmp/auto.json" \
    && grep -q '"arch": "quad", .*"steps": 5, "kl_steps": 0, "kl_top_k": 32, "loss": "kl",' "$tmp/auto_kl.json" \
    && grep -q '"arch": "mlp", .*"steps": 100, "kl_steps": 0, "kl_top_k": 0, "loss": "kl", "lr": 0.03, "kl_lr": 0.003,' \
    "$tmp/gguf.json" \
    && ok "a chat run takes the chat recipe's defaults, a plain run the plain one's" || fail "recipes: $(head -c 160 "$tmp/auto.json")"
# a model of 10M parameters or more read as plain text takes the large plain recipe: MLP, a regression fit then
# KL steps at 3e-3, the teacher's top 32, and a self-study of spans only (no task loop: no tasks, no evaluation-only ones)
./tests/random_model "$tmp/large.bin" 512 1024 5 8 2 259 256 3 0.05 2> /dev/null
"$bin/study" fit -m "$tmp/large.bin" -z data/tokenizer.bin -d "$tmp/doc.txt" -o "$tmp/large.nectar" --steps 3 --kl-steps 2 \
    --n-prompts 6 --prompt-len 12 --json > "$tmp/large.json" 2> "$tmp/log" || cat "$tmp/log"
grep -q '"arch": "mlp", .*"steps": 3, "kl_steps": 2, "kl_top_k": 32, "loss": "regression", "lr": 0.03, "kl_lr": 0.003,' \
    "$tmp/large.json" && ! grep -q 'tasks [0-9]' "$tmp/log" \
    && grep -q "^a model of 11M parameters read as plain text: the large plain recipe's" "$tmp/log" \
    && ok "a large model read as plain text takes the large plain recipe's defaults" \
    || fail "large plain recipe: $(head -c 240 "$tmp/large.json")"
# and its 2000 regression steps then 400 KL steps, where the command line gives none (stopped after one)
"$bin/study" fit -m "$tmp/large.bin" -z data/tokenizer.bin -d "$tmp/doc.txt" -o "$tmp/large.nectar" --n-prompts 6 \
    --prompt-len 12 --checkpoint "$tmp/large.ckpt" --stop-after 1 > /dev/null 2> "$tmp/log" || cat "$tmp/log"
tr '\r' '\n' < "$tmp/log" | grep -q '^step 1/2400 .* + the KL stage' && ok "the large plain recipe's two stages: 2000 + 400 steps" \
    || fail "the large plain recipe's steps: $(tr '\r' '\n' < "$tmp/log" | grep -m 1 '^step')"
same=1
for text in "the cat sat" "Hello, wörld! 123" "two
lines" "€ 😀"; do
    a=$("$bin/infer" --encode -m tests/data/gguf_spm.gguf -i "$text") b=$("$bin/infer" --encode -z tests/data/tok_test.bin -i "$text")
    [ -n "$a" ] && [ "$a" = "$b" ] || { same=0; echo "    '$text': GGUF '$a', tokenizer.bin '$b'"; }
done
[ $same -eq 1 ] && ok "a GGUF SentencePiece tokenizer encodes as its tokenizer.bin" || fail "GGUF SentencePiece ids"

# benchmark --arch quad times quadrature modules of floor(rho n) pairs: at 1024 tokens 20 (rho 2%) and 102 (10%)
# in each of 3 layers x 2 KV heads, 2 p d floats of head size 8
if [ -x "$bin/benchmark" ]; then
    "$bin/benchmark" -m "$tmp/model.bin" --min-doc 1024 --max-doc 1024 --arch quad --json > "$tmp/bench.json" \
        2> "$tmp/log" || cat "$tmp/log"
    tr -d '\n' < "$tmp/bench.json" | sed 's/, "composition.*//' > "$tmp/bench1.json"  # the serving table's
    n2=$(json "$tmp/bench1.json" nectar2 state_bytes) n10=$(json "$tmp/bench1.json" nectar10 state_bytes)
    grep -q '"arch": "quad"' "$tmp/bench1.json" && is "$n2 == 4 * 3 * 2 * 2 * 20 * 8 && $n10 == 4 * 3 * 2 * 2 * 102 * 8" \
        && ok "benchmark --arch quad: modules of floor(rho n) pairs" || fail "benchmark --arch quad: $n2, $n10 bytes"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
