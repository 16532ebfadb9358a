#!/usr/bin/env bash
# The programs' --gpu paths against their CPU runs, on the default model and
# document in data/ (run by `make test-cuda` on build-gpu/ where a GPU is
# present, and on the emulator build, build-emu/, everywhere):
#   infer -t 0: the same greedy tokens, exact and Nectar;
#   train --gpu: modules whose held-out metrics match the CPU-fitted ones,
#   with the regression loss, with pure KL and with a KL stage after
#   regression (--kl-steps); infer --eval --gpu refused;
#   benchmark --gpu: runs to the end on short documents, with MLP and with
#   quadrature modules, and prints Nectar's operations per decoded token at
#   most the exact path's.
# usage: tests/test_gpu_programs.sh BINDIR   (BINDIR holds infer, study, benchmark)
set -u
bin=${1:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
m="-m data/model.bin -z data/tokenizer.bin"
prompt="Q: Where is the document from?\nA:"

check() {  # check NAME OK
    if [ "$2" = 1 ]; then printf '  %-60s ok\n' "$1"; passed=$((passed + 1))
    else printf '  %-60s FAIL\n' "$1"; failed=$((failed + 1)); fi
}

echo "--gpu programs against the CPU ($bin)"
# fitting: 400 steps each way, then the held-out metrics of both
# (by regression, on the spans and continuations the tolerances below were sized on)
fit_args="--loss regression --lr 1e-2 --tasks 0 --n-prompts 200 --prompt-len 48"
$bin/study fit $m -d data/doc.txt -o "$tmp/cpu.nectar" --steps 400 $fit_args --json > "$tmp/cpu.json" 2> "$tmp/cpu.err"
$bin/study fit $m -d data/doc.txt -o "$tmp/gpu.nectar" --steps 400 $fit_args --json --gpu > "$tmp/gpu.json" 2> "$tmp/gpu.err"
check "train and train --gpu both ran" $([ -s "$tmp/cpu.json" ] && [ -s "$tmp/gpu.json" ] && echo 1 || echo 0)
# fp32 rounding differs (cuBLAS sums in another order) and AdamW carries it
# through 400 steps: KL must agree to 2% of its gap to the no-document KL,
# the other metrics to 1% (of the value, at least 1). Sized on the CPU, not
# yet on a GPU: uniform noise of 1e-6 to 1e-3 of the gradients' RMS added at
# every AdamW step (Adam makes full-size steps of the noise on near-zero
# gradients) moved these metrics by at most 2.0e-3 (kl), 5.7e-3 (agree),
# 5.0e-3 (acc_nectar), 8.9e-3 (target_mse) and 1.9e-2 (score_mse), against
# tolerances of 7.6e-3, 1e-2, 1e-2, 8.6e-2 and 6.2e-2; at 1e-6 and 1e-5 of
# the RMS, by at most 3.7e-4, 0, 0, 1.0e-3 and 2.6e-3.
python3 - "$tmp/cpu.json" "$tmp/gpu.json" <<'PY' > "$tmp/cmp" 2>&1
import json, sys
cpu, gpu = (json.load(open(p))["random"] for p in sys.argv[1:3])
bad = []
for key in ("kl", "agree", "acc_nectar", "target_mse", "score_mse"):
    tol = 0.02 * max(abs(cpu["kl_nodoc"] - cpu["kl"]), 1e-3) if key == "kl" else 0.01 * max(1.0, abs(cpu[key]))
    print(f"    {key}: CPU {cpu[key]:.6g}, GPU {gpu[key]:.6g}, |diff| {abs(cpu[key] - gpu[key]):.2e} (tolerance {tol:.2e})")
    if abs(cpu[key] - gpu[key]) > tol: bad.append(key)
sys.exit(1 if bad else 0)
PY
ok=$?; cat "$tmp/cmp"
check "train --gpu: held-out metrics match the CPU fit" $([ $ok = 0 ] && echo 1 || echo 0)

# the KL term (the transformer's backward on the GPU): 10 steps each way, of
# pure KL, and of regression then --kl-steps (the KL stage's AdamW moments
# start from zero on the device). For pure KL, the same gradient noise (1e-6
# to 1e-3 of the RMS) moved this KL by at most 5.1e-4; the tolerance is 1.6e-3.
# For the two stages the emulator gives the CPU's KL to the last digit
# printed; without the device's moments reset it was 3.3e-2 off, against a
# tolerance of 2.8e-4.
fit_args="--lr 1e-2 --tasks 0 --n-prompts 200 --prompt-len 48"
for loss in "--steps 10 --loss kl" "--steps 5 --loss regression --kl-steps 5 --kl-lr 2e-2"; do
    $bin/study fit $m -d data/doc.txt -o "$tmp/cpu_kl.nectar" $loss $fit_args --json > "$tmp/cpu_kl.json" 2>/dev/null
    $bin/study fit $m -d data/doc.txt -o "$tmp/gpu_kl.nectar" $loss $fit_args --json --gpu > "$tmp/gpu_kl.json" 2> "$tmp/gpu_kl.err"
    python3 - "$tmp/cpu_kl.json" "$tmp/gpu_kl.json" <<'PY' > "$tmp/cmp_kl" 2>&1
import json, sys
cpu, gpu = (json.load(open(p))["random"] for p in sys.argv[1:3])
tol = 0.02 * max(abs(cpu["kl_nodoc"] - cpu["kl"]), 1e-3)
print(f"    kl: CPU {cpu['kl']:.6g}, GPU {gpu['kl']:.6g}, |diff| {abs(cpu['kl'] - gpu['kl']):.2e} (tolerance {tol:.2e})")
sys.exit(0 if abs(cpu["kl"] - gpu["kl"]) <= tol else 1)
PY
    ok=$?; cat "$tmp/cmp_kl"; [ -s "$tmp/gpu_kl.json" ] || cat "$tmp/gpu_kl.err"
    check "train --gpu $loss: held-out KL matches the CPU fit" $([ $ok = 0 ] && echo 1 || echo 0)
done

# generation: greedy tokens, the same module on both. On the CPU every
# greedy choice here wins by at least 0.014 logits (of up to 21.5), 14 times
# the GPU logits' tolerance in tests/test_cuda, so a flip means a bug.
for mode in exact nectar; do
    args="-d data/doc.txt"; [ $mode = nectar ] && args="-k $tmp/cpu.nectar"
    $bin/infer $m $args -i "$(printf '%b' "$prompt")" -n 48 -t 0 --ids > "$tmp/$mode.cpu" 2>/dev/null
    $bin/infer $m $args -i "$(printf '%b' "$prompt")" -n 48 -t 0 --ids --gpu > "$tmp/$mode.gpu" 2> "$tmp/$mode.err"
    same=$([ -s "$tmp/$mode.cpu" ] && cmp -s "$tmp/$mode.cpu" "$tmp/$mode.gpu" && echo 1 || echo 0)
    [ $same = 0 ] && { echo "    CPU: $(cat "$tmp/$mode.cpu")"; echo "    GPU: $(cat "$tmp/$mode.gpu")"; cat "$tmp/$mode.err"; }
    check "infer --gpu -t 0 ($mode): the CPU's 48 greedy tokens" $same
done

$bin/infer $m -d data/doc.txt -k "$tmp/cpu.nectar" --eval --gpu > /dev/null 2> "$tmp/eval.err"
ok=$?
check "infer --eval --gpu is refused: --eval runs on the CPU" $([ $ok = 1 ] && grep -q "^error: --eval and --qa run on the CPU" "$tmp/eval.err" && echo 1 || echo 0)

# (quadrature on the 1K document alone: on the emulator each size takes a minute)
for run in "mlp 2048" "quad 1024"; do
    set -- $run
    $bin/benchmark -m data/model.bin --gpu --arch $1 --min-doc 1024 --max-doc $2 > "$tmp/bench" 2>&1
    ok=$?
    check "benchmark --gpu --arch $1 runs (documents of 1K to $2 tokens)" \
        $([ $ok = 0 ] && grep -q "^| $2 |" "$tmp/bench" && echo 1 || echo 0)
    [ $ok = 0 ] || cat "$tmp/bench"
done

# the operations one decoded token queues, as benchmark prints them (a
# decode step is bound by their count, not by bytes): Nectar's, with either
# kind of module, at most the exact path's
set -- $(sed -n 's/^operations per decoded token.*: no document [0-9]*, exact \([0-9]*\), Nectar MLP \([0-9]*\), Nectar quadrature \([0-9]*\)$/\1 \2 \3/p' "$tmp/bench")
echo "    operations per decoded token: exact ${1:-?}, Nectar MLP ${2:-?}, Nectar quadrature ${3:-?}"
check "benchmark --gpu: Nectar's operations per token at most exact's" \
    $([ $# = 3 ] && [ $2 -le $1 ] && [ $3 -le $1 ] && echo 1 || echo 0)

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
