#!/usr/bin/env bash
# The numerics-sensitive tiers under every OpenBLAS kernel this CPU can run, each with
# torch at 1 and at 2 threads: results must not depend on the machine's SIMD width
# (a flash gradient once passed on AVX2 and failed on AVX-512) or on thread counts.
# The tiers: tests/core, tests/torch, tests/models, tests/conformance (the tests that
# tests/conftest.py marks `numerics`).
#
#   scripts/test-numerics.sh [--skip-covered] [PYTHON] [-- PYTEST ARGS...]
#
# Kernels: Haswell (AVX2) on x86-64, SkylakeX (AVX-512) where /proc/cpuinfo shows
# avx512f; forcing a kernel the CPU lacks crashes OpenBLAS, so each is checked first.
# Elsewhere (or without AVX2) the default kernel runs. Each run first checks, with
# threadpoolctl, that NumPy's OpenBLAS really uses the kernel asked for.
#
# --skip-covered: skip the run with the kernel and torch thread count the whole suite
# has just run with (`make test` runs it first, with OpenBLAS's own pick of kernel).
set -uo pipefail
cd "$(dirname "$0")/.."

skip_covered=0
if [[ ${1:-} == --skip-covered ]]; then skip_covered=1; shift; fi
python=.venv/bin/python
if [[ $# -gt 0 && $1 != -* ]]; then python=$1; shift; fi
if [[ ${1:-} == -- ]]; then shift; fi
tiers=(tests/core tests/torch tests/models tests/conformance)
# tests/core never imports torch (make test proves it in a virtualenv without torch),
# so torch's thread count cannot change its results: the 2-thread runs leave it out.
torch_tiers=(tests/torch tests/models tests/conformance)

has_flag() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }

kernels=()
case "$(uname -m)" in
    x86_64 | amd64)
        if has_flag avx2; then kernels+=(Haswell); else echo "numerics: no AVX2, Haswell skipped"; fi
        if has_flag avx512f; then kernels+=(SkylakeX); else echo "numerics: no AVX-512, SkylakeX skipped"; fi
        ;;
esac
if [[ ${#kernels[@]} -eq 0 ]]; then kernels=(default); fi

# The kernel NumPy's OpenBLAS uses with the given environment changes (env's syntax).
blas_kernel() {
    env "$@" "$python" -c 'import numpy, threadpoolctl
print(" ".join(i.get("architecture") or "?" for i in threadpoolctl.threadpool_info()
               if i["internal_api"] == "openblas"))'
}

suite_kernel=$(blas_kernel)  # what the whole suite ran with, in this environment
suite_threads=${ATTNLAB_TEST_TORCH_THREADS:-1}
failed=()
for kernel in "${kernels[@]}"; do
    for threads in 1 2; do
        label="kernel ${kernel}, torch at ${threads} thread(s)"
        coretype=()
        if [[ $kernel != default ]]; then coretype=(OPENBLAS_CORETYPE="$kernel"); fi
        got=$(blas_kernel "${coretype[@]}")
        if [[ $kernel != default && ${got,,} != "${kernel,,}" ]]; then
            echo "numerics: ${label}: OPENBLAS_CORETYPE=${kernel} but OpenBLAS reports '${got}'"
            failed+=("${label} (kernel not applied)")
            continue
        fi
        if [[ $skip_covered -eq 1 && $threads == "$suite_threads" && $got == "$suite_kernel" ]]; then
            echo "numerics: ${label}: skipped, the whole suite has just run with it"
            continue
        fi
        run_tiers=("${tiers[@]}")
        if [[ $threads != 1 ]]; then run_tiers=("${torch_tiers[@]}"); fi
        echo "numerics: ${label}: ${run_tiers[*]} (OpenBLAS reports ${got})"
        start=$SECONDS
        if env "${coretype[@]}" ATTNLAB_TEST_TORCH_THREADS="$threads" \
            "$python" -m pytest "${run_tiers[@]}" "$@"; then
            echo "numerics: ${label}: passed in $((SECONDS - start)) s"
        else
            echo "numerics: ${label}: FAILED after $((SECONDS - start)) s"
            failed+=("$label")
        fi
    done
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "numerics: failed under: $(IFS=';'; echo "${failed[*]}")"
    exit 1
fi
echo "numerics: every combination passed"
