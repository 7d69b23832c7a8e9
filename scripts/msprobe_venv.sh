#!/usr/bin/env bash
# Builds a virtualenv that holds msprobe itself (mindstudio-probe 8.3.3 by default, or the release given, such
# as 26.2.0), which the interoperability tests (tests/interop) run in subprocesses: msprobe dumps a model,
# msprobe compares Parity's dumps, and the tests check row for row that the two tools agree. One venv per
# release (.venv-msprobe for 8.3.3, .venv-msprobe26 for 26.2.0): the two lines' CLIs and layouts differ.
#
# Its own venv because msprobe pins what Parity's .venv cannot hold (numpy<2, pandas<2.1). torch is given as a
# constraint (-c), so the resolver keeps the CPU build 2.13.0 (the one .venv has, from the local wheel
# directory) instead of resolving a multi-GB CUDA build. The Makefile calls this once per stamp; every failure
# exits non-zero, so `make test` (and CI) stops rather than skipping the interop tests quietly.
#
# uv, put into the venv by pip, resolves and installs: the versions pip resolves, in ~30 s where pip took
# ~80 s (this machine's pip keeps no HTTP cache; uv's cache serves a rebuild). Bytecode is compiled at
# install, as pip does: with PYTHONDONTWRITEBYTECODE set (as on these machines) every msprobe process would
# otherwise compile torch's modules again. uv reads no pip config, so PIP_FIND_LINKS (where the CPU build of
# torch lies) is passed on.
#
# usage: scripts/msprobe_venv.sh VENV_DIR [VERSION]
set -euo pipefail
venv="${1:?usage: scripts/msprobe_venv.sh VENV_DIR [VERSION]}"
version="${2:-8.3.3}"
py="${PY:-python3}"
links=()
for link in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$link"); done
msprobe="mindstudio-probe==$version"
torch="torch==2.13.0"

started=$(date +%s)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "$torch" >"$constraints"

rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q uv
# One resolve for everything: msprobe, its dependencies, and torch held to the CPU build by the constraint.
"$venv/bin/uv" pip install --python "$venv/bin/python" -q --compile-bytecode "${links[@]}" "$msprobe" "$torch" -c "$constraints"
# The check that the venv works: msprobe's compare and dump entry points import, and torch is the CPU build.
MSPROBE_VERSION="$version" "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import os

import torch
from msprobe.pytorch import PrecisionDebugger  # noqa: F401

version = os.environ["MSPROBE_VERSION"]
if version.startswith("8."):
    from msprobe.pytorch import compare  # noqa: F401
else:  # 26.x: `msprobe compare -tp -gp` (auto mode), no -f/-i form
    from msprobe.core.compare.auto_compare import compare_auto_mode  # noqa: F401
assert md.version("mindstudio-probe") == version, md.version("mindstudio-probe")
assert torch.__version__.startswith("2.13.0") and not torch.cuda.is_available(), torch.__version__
EOF
echo "msprobe venv: $venv ready ($msprobe, $torch) in $(($(date +%s) - started)) s"
