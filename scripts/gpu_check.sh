#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: every check that needs a GPU, in one go, each
# step's log in OUTDIR and a summary in OUTDIR/summary.txt:
#   the build with nvcc, tests/test_cuda on the device, the --gpu programs
#   against the CPU (tests/test_gpu_programs.sh), `make bench-gpu`,
#   SmolLM2 on the GPU against the CPU where models/ holds it
#   (scripts/gpu_smollm2.sh), then compute-sanitizer's memcheck and
#   racecheck over tests/test_cuda.
# Where pkg-config cannot find OpenBLAS, give its flags in the environment:
#   BLAS_CFLAGS=-I... BLAS_LIBS="-L... -lopenblas" scripts/gpu_check.sh OUTDIR
# or, on a machine with no package registry, a folder of Debian's packages
# (apt-get download libopenblas-dev libopenblas0 libopenblas-pthread-dev
# libopenblas0-pthread libgfortran5 libquadmath0), unpacked here into OUTDIR/blas:
#   GPU_CHECK_DEBS=DIR scripts/gpu_check.sh OUTDIR
# GPU_CHECK_SECONDS (default 540) bounds the whole run: a step that hangs is
# stopped at the deadline (exit 124) and the steps after it are skipped.
set -u
out=$(mkdir -p "${1:?usage: scripts/gpu_check.sh OUTDIR}" && cd "$1" && pwd) || exit 1
cd "$(dirname "$0")/.."
if [ -n "${GPU_CHECK_DEBS:-}" ]; then
    for deb in "$GPU_CHECK_DEBS"/*.deb; do dpkg -x "$deb" "$out/blas" || exit 1; done
    lib=$out/blas/usr/lib/x86_64-linux-gnu
    export BLAS_CFLAGS="-I$out/blas/usr/include/x86_64-linux-gnu/openblas-pthread"
    export BLAS_LIBS="-L$lib/openblas-pthread -lopenblas"
    export LD_LIBRARY_PATH="$lib/openblas-pthread:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
make_vars=()
[ -n "${BLAS_LIBS:-}" ] && make_vars+=("BLAS_LIBS=$BLAS_LIBS" "BLAS_CFLAGS=${BLAS_CFLAGS:-}")
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-540}))

# step NAME LIMIT CMD...: runs CMD into OUTDIR/NAME.log for at most LIMIT
# seconds (and not past the deadline), notes its status, time and last lines
step() {
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS)) t0=$SECONDS
    [ $limit -gt $left ] && limit=$left
    if [ $limit -lt 10 ]; then echo "== $name: skipped, no time left" | tee -a "$out/summary.txt"; return 1; fi
    timeout $limit "$@" > "$out/$name.log" 2>&1
    local rc=$?
    { echo "== $name (exit $rc, $((SECONDS - t0)) s): $*"; tail -n 4 "$out/$name.log" | sed 's/^/   /'; } | tee -a "$out/summary.txt"
    return $rc
}

nvidia-smi > "$out/nvidia-smi.log" 2>&1
step info 30 make "${make_vars[@]}" info
step build 300 make -j"$(nproc)" "${make_vars[@]}" all gpu tests/test_cuda || exit 1
step test-cuda 300 env NECTAR_REQUIRE_GPU=1 ./tests/test_cuda  # no device is a failure here
step gpu-programs 300 bash tests/test_gpu_programs.sh build-gpu
# (its CPU fitting figure with OpenBLAS's fast kernels, as `make bench-gpu` runs it)
step bench-gpu 300 env $(scripts/fast_blas.sh build-gpu/benchmark) ./build-gpu/benchmark -m data/model.bin --gpu --max-doc 131072
if [ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then  # its summary whole
    step smollm2 300 bash scripts/gpu_smollm2.sh "$out/smollm2"
    sed 's/^/   /' "$out/smollm2.log" >> "$out/summary.txt"
fi
# last, as they may not finish in time: CUDA's checkers of memory accesses
# and shared-memory races over the kernel tests, memcheck in half of the
# time left and racecheck in the rest, 3 minutes each at most; a finding
# exits 99
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
    step memcheck $(((deadline - SECONDS) / 2 < 180 ? (deadline - SECONDS) / 2 : 180)) \
        "$sanitizer" --tool memcheck --error-exitcode 99 ./tests/test_cuda
    step racecheck 180 "$sanitizer" --tool racecheck --error-exitcode 99 ./tests/test_cuda
else
    echo "== memcheck, racecheck: skipped, compute-sanitizer not found" | tee -a "$out/summary.txt"
fi
