#!/usr/bin/env bash
# The test suite: starts the services the tests need, runs pytest, stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
# The linters first: a submission that is not ruff and mypy clean fails here, not in review. mypy (half a
# minute of one core) runs while the services start and chromium installs (disk and network bound); its
# verdict is awaited before any test runs.
$BIN/ruff check .
mypy_log="$(mktemp)"
$BIN/mypy shared client server parity >"$mypy_log" 2>&1 &
mypy_pid=$!
# PostgreSQL and Redis for the server tests (PARITY_TEST_POSTGRES_URL, PARITY_TEST_REDIS_URL). In CI a
# failure to start either is fatal; locally the tests needing one are skipped (with a reason) when it cannot
# start. moto's S3 server is started by the tests themselves (ThreadedMotoServer).
source scripts/services.sh
trap 'services_stop; kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
if ! services_start; then
  if [ "${CI:-}" = "true" ]; then
    echo "test.sh: a service could not start; the server tests need PostgreSQL and Redis in CI" >&2
    exit 1
  fi
  echo "test.sh: a service could not start; the tests needing it will be skipped" >&2
fi
# Debian's chromium for the browser tests (tests/web), driven by Playwright; no browser is downloaded.
source scripts/chromium.sh
if ! chromium_ensure; then
  if [ "${CI:-}" = "true" ]; then
    echo "test.sh: chromium could not be installed; the browser tests need it in CI" >&2
    exit 1
  fi
  echo "test.sh: chromium could not be installed; the browser tests will be skipped" >&2
fi
if ! wait "$mypy_pid"; then
  cat "$mypy_log" >&2
  exit 1
fi
cat "$mypy_log"
set +e
# Two workers, a test file each at a time (module fixtures such as a started server stay on one worker), in
# collection order (tests/conftest.py: the heavy folders first) rather than xdist's default of the files
# with most tests first, which left a few long msprobe and server files for the end.
$BIN/python -m pytest -q -p no:cacheprovider -n "${PARITY_TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder "$@"
rc=$?
set -e
# pytest's 5 means no test was collected: that is a failure for CI, not a pass.
exit $rc
