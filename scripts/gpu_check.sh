#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR: every check that needs a GPU, in one go, each
# step's log in OUTDIR and a summary in OUTDIR/summary.txt:
#   the build with nvcc, tests/test_cuda on the device, the --gpu programs
#   against the CPU (tests/test_gpu_programs.sh), `make bench-gpu`, then
#   compute-sanitizer's memcheck and racecheck over tests/test_cuda.
# Where pkg-config cannot find OpenBLAS, give its flags in the environment:
#   BLAS_CFLAGS=-I... BLAS_LIBS="-L... -lopenblas" scripts/gpu_check.sh OUTDIR
set -u
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
make_vars=()
[ -n "${BLAS_LIBS:-}" ] && make_vars+=("BLAS_LIBS=$BLAS_LIBS" "BLAS_CFLAGS=${BLAS_CFLAGS:-}")

# step NAME CMD...: runs CMD into OUTDIR/NAME.log, notes its status, time and last lines
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$out/$name.log" 2>&1
    local rc=$?
    { echo "== $name (exit $rc, $((SECONDS - t0)) s): $*"; tail -n 4 "$out/$name.log" | sed 's/^/   /'; } | tee -a "$out/summary.txt"
    return $rc
}

nvidia-smi > "$out/nvidia-smi.log" 2>&1
step info make "${make_vars[@]}" info
step build make -j"$(nproc)" "${make_vars[@]}" all gpu tests/test_cuda || exit 1
step test-cuda ./tests/test_cuda
step gpu-programs bash tests/test_gpu_programs.sh build-gpu
step bench-gpu ./build-gpu/benchmark -m data/model.bin --gpu --max-doc 131072
# last, as they may not finish in time: CUDA's checkers of memory accesses
# and shared-memory races over the kernel tests (slow: 3 minutes each at most)
if command -v compute-sanitizer > /dev/null; then
    step memcheck timeout 180 compute-sanitizer --tool memcheck ./tests/test_cuda
    step racecheck timeout 180 compute-sanitizer --tool racecheck ./tests/test_cuda
fi
