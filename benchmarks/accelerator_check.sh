#!/usr/bin/env bash
# The GPU check of issue 20 in one script, for one accelerator machine with no network (< 8 minutes):
#
#   1. installs this checkout into a fresh venv from the wheels it is given (pip --no-index); the venv sees
#      the system's site-packages, so a torch already installed there (the CUDA/NPU build) is used as is;
#   2. runs the capture tests on the accelerator (`make test-accelerator`'s selection, tests/client);
#   3. runs benchmarks/bench_dump_overhead.py --device DEVICE on the issue's GPT step (d 1024, 16 heads,
#      seq 1024, batch 8, 12 blocks, bf16 autocast, AdamW inside start/stop);
#   4. prints one table: the machine, the tests' result, and the overhead of each mode against its target.
#
# usage: benchmarks/accelerator_check.sh WHEEL_DIR [DEVICE]      (DEVICE: cuda by default; npu, xpu...;
#        cpu: a dry run of the same steps on a machine without an accelerator, the GPT step at its tiny size)
#   WHEEL_DIR holds wheels for what the system lacks: this project's dependencies (numpy, pydantic, httpx and
#   theirs), pytest, pytest-timeout, setuptools and wheel (to build the checkout), and torch if the system
#   has none. Fill it on a machine with network: pip download -d WHEEL_DIR . pytest pytest-timeout setuptools wheel
# Environment: PARITY_CHECK_VENV (default: a temporary directory), PARITY_CHECK_STEPS (default 5).
set -euo pipefail

wheels="${1:?usage: benchmarks/accelerator_check.sh WHEEL_DIR [DEVICE]}"
device="${2:-cuda}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${PARITY_CHECK_STEPS:-5}"
py="${PY:-python3}"
started=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="${PARITY_CHECK_VENV:-$work/venv}"

if [ ! -d "$wheels" ]; then
  echo "accelerator_check: $wheels is not a directory of wheels" >&2
  exit 2
fi

phase() { echo "[$(($(date +%s) - started)) s] $*" >&2; }

# ---- 1. install (no network) ---------------------------------------------------------------------------
phase "installing $root into $venv from $wheels"
"$py" -m venv --system-site-packages "$venv"
bin="$venv/bin"
timeout 300 "$bin/python" -m pip install -q --no-index --find-links "$wheels" "$root" pytest pytest-timeout

# ---- 2. the machine ------------------------------------------------------------------------------------
machine="$(cd "$work" && "$bin/python" - "$device" <<'EOF'
import sys

import torch
from parity.client import devices

want = sys.argv[1]
acc = devices.accelerator()
if want == "cpu":  # a dry run of this script on a machine without an accelerator
    print(f"CPU only (dry run), torch {torch.__version__}")
    sys.exit(0)
if acc is None or acc.type != want:
    print(f"no {want} accelerator found (torch {torch.__version__}, found: {acc})")
    sys.exit(3)
mod = getattr(torch, want)
name = mod.get_device_name(0) if hasattr(mod, "get_device_name") else want
print(f"{name}, torch {torch.__version__}")
EOF
)" || { echo "accelerator_check: $machine" >&2; exit 3; }
phase "machine: $machine"

# ---- 3. the accelerator tests --------------------------------------------------------------------------
phase "accelerator tests"
marker="accelerator"
if [ "$device" = "cpu" ]; then
  marker="not accelerator"  # the dry run: the same tests on the CPU
fi
set +e
(cd "$root" && PARITY_TEST_ACCELERATOR=1 timeout 180 "$bin/python" -m pytest -q -p no:cacheprovider \
  -m "$marker" tests/client/test_devices.py) >"$work/tests.log" 2>&1
tests_rc=$?
set -e
tests_line="$(tail -n 1 "$work/tests.log")"
if [ "$tests_rc" -ne 0 ]; then
  tail -n 40 "$work/tests.log" >&2
fi

# ---- 4. the overhead -----------------------------------------------------------------------------------
phase "bench_dump_overhead --device $device (steps $steps)"
set +e
(cd "$work" && timeout 330 "$bin/python" "$root/benchmarks/bench_dump_overhead.py" --device "$device" \
  --steps "$steps" --warmup 2 --no-msprobe) >"$work/bench.log" 2>"$work/bench.err"
bench_rc=$?
set -e
if [ "$bench_rc" -ne 0 ]; then
  tail -n 20 "$work/bench.err" >&2
fi

# ---- the table -----------------------------------------------------------------------------------------
echo
echo "| check | result |"
echo "|---|---|"
echo "| machine | $machine |"
echo "| accelerator tests | $tests_line (exit $tests_rc) |"
echo "| benchmark | exit $bench_rc, $(($(date +%s) - started)) s in all |"
echo
grep -v '^$' "$work/bench.log" || true
if [ "$tests_rc" -ne 0 ] || [ "$bench_rc" -ne 0 ]; then
  exit 1
fi
