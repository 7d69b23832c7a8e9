#!/usr/bin/env bash
# The test suite: starts the services the tests need, runs pytest, stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
# PostgreSQL for the server tests (PARITY_TEST_POSTGRES_URL). In CI a failure to start it is fatal; locally
# the PostgreSQL tests are skipped (with a reason) when it cannot start. moto's S3 server is started by the
# tests themselves (ThreadedMotoServer).
source scripts/services.sh
trap services_stop EXIT
if ! services_start; then
  if [ "${CI:-}" = "true" ]; then
    echo "test.sh: PostgreSQL could not start; the server tests need it in CI" >&2
    exit 1
  fi
  echo "test.sh: PostgreSQL could not start; its tests will be skipped" >&2
fi
set +e
$BIN/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest's 5 means no test was collected: that is a failure for CI, not a pass.
exit $rc
