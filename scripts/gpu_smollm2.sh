#!/usr/bin/env bash
# scripts/gpu_smollm2.sh OUTDIR: SmolLM2-135M-Instruct on the GPU against the
# CPU (scripts/gpu_check.sh runs it where models/ holds the model), every
# run's output in OUTDIR:
#   1. make bench's tables on the GPU: documents of 1K..8K tokens, exact
#      against Nectar, MLP and quadrature modules (bench-mlp.txt, bench-quad.txt);
#   2. the chat recipe's KL step (a forward and backward of the 30 layers,
#      train --loss kl on a small self-study of 8 spans) on the two license
#      texts, GPU and CPU: seconds a step, the first step's loss and gradient
#      norm, the held-out KL after 20 steps (DOC.train-gpu.*, DOC.train-cpu.*);
#   3. infer --chat, 64 greedy tokens of an answer after each license text,
#      exact and with the modules of step 2, GPU and CPU: prefill, time to
#      first token, decode speed, and whether the tokens agree (DOC.*.ids).
# The CPU runs take OpenBLAS's fast kernels where it would pick its generic
# ones (scripts/fast_blas.sh). Texts from SMOLLM2_DOCS (default
# /usr/share/common-licenses). Ends with a summary of the numbers.
set -u
out=$(mkdir -p "${1:?usage: scripts/gpu_smollm2.sh OUTDIR}" && cd "$1" && pwd) || exit 1
cd "$(dirname "$0")/.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
docs=${SMOLLM2_DOCS:-/usr/share/common-licenses}
[ -f $model ] || { echo "error: $model is missing (make smollm2)" >&2; exit 1; }
fast=$(scripts/fast_blas.sh build-gpu/train)
question="What does the license say about patents? Answer in one sentence."

for arch in mlp quad; do
    env $fast build-gpu/benchmark -m $model --gpu --arch $arch --max-doc 8192 > "$out/bench-$arch.txt" 2>&1
done

fit="-m $model --rho 0.1 --loss kl --steps 20 --n-prompts 8 --tasks 0 --json"
for doc in Apache-2.0 GPL-3; do
    for dev in gpu cpu; do
        flag=""; [ $dev = gpu ] && flag=--gpu
        # the CPU's fit on the shorter text alone (make bench times the CPU)
        [ $dev = cpu ] && [ $doc = GPL-3 ] || env $fast build-gpu/train $fit -d "$docs/$doc" \
            -o "$out/$doc.$dev.nectar" $flag > "$out/$doc.train-$dev.json" 2> "$out/$doc.train-$dev.err"
        for mode in exact nectar; do  # both devices with the modules fitted on the GPU
            modules=""; [ $mode = nectar ] && modules="-k $out/$doc.gpu.nectar"
            env $fast build-gpu/infer -m $model -d "$docs/$doc" $modules --chat -i "$question" -n 64 -t 0 --ids \
                $flag > "$out/$doc.$mode-$dev.ids" 2> "$out/$doc.$mode-$dev.err"
        done
    done
done

# the summary: timings and the GPU against the CPU
python3 - "$out" <<'PY'
import json, re, sys, os
out = sys.argv[1]
def read(name):
    p = os.path.join(out, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""
for arch in ("mlp", "quad"):
    print(f"benchmark --gpu --arch {arch}:")
    for line in read(f"bench-{arch}.txt").splitlines():
        if line.startswith(("GPU:", "cuBLAS", "| ", "module fitting", "attention of")): print("  " + line)
for doc in ("Apache-2.0", "GPL-3"):
    print(f"{doc}:")
    for dev in ("gpu", "cpu"):
        err = read(f"{doc}.train-{dev}.err")
        steps = [(int(s), float(t)) for s, t in re.findall(r"step (\d+)/\d+ .*?(\d+\.\d)s", err)]
        first = re.search(r"step 1/\d+\s+loss (\S+)\s+lr \S+\s+\|g\| (\S+)", err)
        if not err: continue
        try: res = json.loads(read(f"{doc}.train-{dev}.json"))
        except ValueError: print(f"  train {dev}: no result; its stderr ends: {err[-300:]!r}"); continue
        per_step = (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0]) if len(steps) > 1 else float("nan")
        stage = {k: (re.findall(rf"{k} \d+/\d+\s+(\d+\.\d)s", err) or ["?"])[-1] for k in ("spans", "teacher")}
        r = res["random"]
        print(f"  train {dev}: KL step {per_step:.3f} s (steps 2..{steps[-1][0]}), fit {res['fit_seconds']:.1f} s, "
              f"whole run {res['total_seconds']:.1f} s, self-study {stage['spans']} s, teacher {stage['teacher']} s; "
              f"step 1 loss {first.group(1)} |g| {first.group(2)}; held-out KL {r['kl']:.5g} "
              f"(no doc {r['kl_nodoc']:.5g}), agreement {r['agree']:.4f}")
    for mode in ("exact", "nectar"):
        ids = {dev: read(f"{doc}.{mode}-{dev}.ids").split() for dev in ("gpu", "cpu")}
        for dev in ("gpu", "cpu"):
            line = [l for l in read(f"{doc}.{mode}-{dev}.err").splitlines() if "tok/s" in l]
            print(f"  infer {mode} {dev}: {line[-1] if line else 'no timing line'}")
        first = next((i for i, (a, b) in enumerate(zip(ids["gpu"], ids["cpu"])) if a != b),
                     min(len(ids["gpu"]), len(ids["cpu"])))
        print(f"  infer {mode}: GPU {len(ids['gpu'])} tokens, CPU {len(ids['cpu'])}: " +
              ("the same" if ids["gpu"] == ids["cpu"] and ids["gpu"] else f"the first {first} the same"))
PY
