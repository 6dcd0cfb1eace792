#!/usr/bin/env bash
# Run every test: pytest (test/python) and lit (test/lit). Exit non-zero if
# either fails. pytest's exit 5 ("no tests collected") counts as a failure
# here too: a test suite that collects nothing is broken.
#
# pytest runs twice. First the tests not marked `exact`, with XLA:CPU's LLVM
# optimisations off (--xla_backend_optimization_level=0): compiling is most of
# the suite's time, the test programs are too small for the code's speed to
# matter, and what those tests compare does not move with it (XLA's fusion,
# scheduling and buffer assignment are HLO passes, run before LLVM: the same
# memory_analysis() bytes at both levels on the benchmark models). Then the
# tests marked `exact` (bits compared with jax.jit's programs, or a tolerance
# code generation moves) with XLA's default code generation, as users run it.
# REMAT_TEST_XLA_OPT=1 runs the first part with the default too.
#
# Tests compile the same programs again and again (the jax.vjp a test compares with, a
# model's plans under several policies, objective=peak's trial plans), in both pytest
# workers: JAX's persistent compilation cache, in a directory of this run's own (removed
# after), compiles each distinct program once per run, however small. What a test reads
# of an executable (memory_analysis(), cost_analysis(), its results) is the same compiled
# or read back (checked on jaxlib 0.10.2 and 0.12). Measured 2026-12-01 on 2 cores, one
# after the other, test_planner.py and test_property.py: 199 s -> 176 s (jax 0.12), 207 s
# -> 191 s (jax 0.10.2). The key has XLA_FLAGS in it: the two parts share none.
# REMAT_TEST_COMPILE_CACHE=0 compiles every time.
#
# REMAT_TEST_SLOW=0 leaves out the tests marked `slow` (two fifths of the suite's time in
# 33 tests): CI's legs on the oldest JAX and on 0.11 run so, the one on the newest runs
# everything.
set -u
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
if [ "${REMAT_TEST_COMPILE_CACHE:-1}" != "0" ]; then
  compile_cache=$(mktemp -d "${TMPDIR:-/tmp}/remat-test-xla.XXXXXX")
  trap 'rm -rf "$compile_cache"' EXIT
  export JAX_COMPILATION_CACHE_DIR="$compile_cache" \
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
fi
workers="${REMAT_TEST_WORKERS:-2}"   # pytest-xdist processes (the CI machine has 2 cores)
fast_flags="${XLA_FLAGS:-}"
if [ "${REMAT_TEST_XLA_OPT:-0}" != "1" ]; then
  fast_flags="$fast_flags --xla_backend_optimization_level=0"
fi
marks=""
if [ "${REMAT_TEST_SLOW:-1}" = "0" ]; then
  marks=" and not slow"
fi
XLA_FLAGS="$fast_flags" python -m pytest test/python -n "$workers" -m "not exact$marks" "$@"
rest_rc=$?
# (only the files that hold such tests: collecting the others again takes half a minute)
python -m pytest $(grep -l "pytest.mark.exact" test/python/test_*.py) -n "$workers" -m "exact$marks" "$@"
exact_rc=$?
# (a -k that selects tests of one part only leaves the other with none: exit 5)
if [ "$rest_rc" -eq 5 ] && [ "$exact_rc" -eq 0 ]; then rest_rc=0; fi
if [ "$exact_rc" -eq 5 ] && [ "$rest_rc" -eq 0 ]; then exact_rc=0; fi
pytest_rc=$(( rest_rc > exact_rc ? rest_rc : exact_rc ))
lit -v test/lit
lit_rc=$?
echo "pytest exit codes: $rest_rc (level 0), $exact_rc (exact); lit exit code: $lit_rc"
if [ "$pytest_rc" -ne 0 ] || [ "$lit_rc" -ne 0 ]; then
  exit 1
fi
