#!/usr/bin/env bash
# usage: scripts/fast_blas.sh PROGRAM
# Prints OPENBLAS_CORETYPE=NAME where OpenBLAS, as linked into PROGRAM (one of
# ours, built), runs its generic SSE3 kernels ("Prescott") on a CPU that can
# run its AVX-512 (SkylakeX) or AVX2 (Haswell) ones: as Debian 12's OpenBLAS
# 0.3.21 does on CPUs newer than it (src/parallel.c says why). Prints nothing
# where OPENBLAS_CORETYPE is set already or OpenBLAS knows the CPU. The
# Makefile's long jobs and scripts/results.sh run with it; the tests do not.
set -eu
[ -z "${OPENBLAS_CORETYPE:-}" ] || exit 0
OPENBLAS_VERBOSE=2 "$1" --help 2>&1 | grep -qx 'Core: Prescott' || exit 0
if grep -qw avx512f /proc/cpuinfo; then echo OPENBLAS_CORETYPE=SkylakeX
elif grep -qw avx2 /proc/cpuinfo; then echo OPENBLAS_CORETYPE=Haswell; fi
