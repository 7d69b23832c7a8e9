#!/usr/bin/env bash
# Builds the virtualenv that holds msprobe itself (mindstudio-probe 8.3.3), which the interoperability tests
# (tests/interop) run in subprocesses: msprobe dumps a model, msprobe compares Parity's dumps, and the tests
# check row for row that the two tools agree.
#
# Its own venv because msprobe pins what Parity's .venv cannot hold (numpy<2, pandas<2.1). torch is given as a
# pip constraint (-c), so pip keeps the CPU build 2.13.0 (the one .venv has, from the local wheel directory)
# instead of resolving a multi-GB CUDA build. The Makefile calls this once per stamp; every failure exits
# non-zero, so `make test` (and CI) stops rather than skipping the interop tests quietly.
#
# The wheels are kept in a wheelhouse beside the venv (WHEELHOUSE, ignored by git): this machine's pip keeps
# no HTTP cache, so without it every rebuild downloaded msprobe's ~40 dependencies again. A rebuild installs
# from the wheelhouse alone; pip download only fetches what it lacks.
#
# usage: scripts/msprobe_venv.sh VENV_DIR [WHEELHOUSE]
set -euo pipefail
venv="${1:?usage: scripts/msprobe_venv.sh VENV_DIR [WHEELHOUSE]}"
wheelhouse="${2:-$venv-wheels}"
py="${PY:-python3}"
msprobe="mindstudio-probe==8.3.3"
torch="torch==2.13.0"

started=$(date +%s)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "$torch" >"$constraints"

rm -rf "$venv"
"$py" -m venv "$venv"
# One resolve for everything: msprobe, its dependencies, and torch held to the CPU build by the constraint.
"$venv/bin/python" -m pip download -q -d "$wheelhouse" "$msprobe" "$torch" -c "$constraints"
"$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "$msprobe" "$torch" -c "$constraints"
# The check that the venv works: msprobe's compare and dump entry points import, and torch is the CPU build.
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
from msprobe.pytorch import PrecisionDebugger, compare  # noqa: F401

assert md.version("mindstudio-probe") == "8.3.3", md.version("mindstudio-probe")
assert torch.__version__.startswith("2.13.0") and not torch.cuda.is_available(), torch.__version__
EOF
echo "msprobe venv: $venv ready ($msprobe, $torch) in $(($(date +%s) - started)) s"
