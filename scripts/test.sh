#!/usr/bin/env bash
# The test suite: starts the services the tests need, runs pytest, stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
set +e
$BIN/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
# pytest's 5 means no test was collected: that is a failure for CI, not a pass.
exit $rc
