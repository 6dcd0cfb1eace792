#!/usr/bin/env bash
# Run every test: pytest (test/python) and lit (test/lit). Exit non-zero if
# either fails. pytest's exit 5 ("no tests collected") counts as a failure
# here too: a test suite that collects nothing is broken.
set -u
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
# pytest on REMAT_TEST_WORKERS processes (pytest-xdist; default 2, as the CI machine has)
python -m pytest test/python -n "${REMAT_TEST_WORKERS:-2}" "$@"
pytest_rc=$?
lit -v test/lit
lit_rc=$?
echo "pytest exit code: $pytest_rc, lit exit code: $lit_rc"
if [ "$pytest_rc" -ne 0 ] || [ "$lit_rc" -ne 0 ]; then
  exit 1
fi
