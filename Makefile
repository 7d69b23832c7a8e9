# Parity's developer entry points. `make demo` and `make test` work on a fresh machine: they create or reuse
# .venv and install what they need (torch pinned to the CPU build that lies on disk).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml shared/metrics/_fused.c | sha1sum | cut -c1-12)
TORCH := torch==2.13.0
UV_LINKS := $(foreach link,$(PIP_FIND_LINKS),--find-links $(link))
# msprobe itself, for the interoperability tests (tests/interop): a venv of its own (it pins numpy<2, pandas<2.1)
MSPROBE_VENV := .venv-msprobe
MSPROBE_STAMP := $(MSPROBE_VENV)/.installed-$(shell cat scripts/msprobe_venv.sh | sha1sum | cut -c1-12)
# msprobe 26.2.0 (the 26.x line: `msprobe compare -tp -gp`, CSV, xor checksums), built by the same script
MSPROBE26_VENV := .venv-msprobe26
MSPROBE26_STAMP := $(MSPROBE26_VENV)/.installed-$(shell cat scripts/msprobe_venv.sh | sha1sum | cut -c1-12)

.PHONY: venv msprobe-venv msprobe26-venv demo demo-stop test test-accelerator test-fast lint typecheck bench clean services

venv: $(STAMP)

# uv (put into the venv by pip: one wheel) installs the rest: the versions pip resolves, in ~30 s where pip took
# ~85 s (it keeps no HTTP cache on these machines). Bytecode is compiled at install, as pip does: with
# PYTHONDONTWRITEBYTECODE set (as on these machines) each test's server, worker and msprobe process would
# otherwise compile its imports again (the suite took 14 min instead of 9). uv reads no pip config, so
# PIP_FIND_LINKS (where the CPU build of torch lies) is passed on; pip stays in the venv.
$(STAMP): pyproject.toml setup.py shared/metrics/_fused.c
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode $(UV_LINKS) -e '.[compare,server,celery,postgres,dev,hf]' $(TORCH)
	@rm -f $(VENV)/.installed-*
	@touch $@

msprobe-venv: $(MSPROBE_STAMP)

# Rebuilt only when the script changes; a failure stops make, so CI never skips the interop tests quietly.
$(MSPROBE_STAMP): scripts/msprobe_venv.sh
	PY=$(PY) bash scripts/msprobe_venv.sh $(MSPROBE_VENV)
	@touch $@

msprobe26-venv: $(MSPROBE26_STAMP)

$(MSPROBE26_STAMP): scripts/msprobe_venv.sh
	PY=$(PY) bash scripts/msprobe_venv.sh $(MSPROBE26_VENV) 26.2.0
	@touch $@

demo: venv
	$(BIN)/python -m parity.demo --keep-server --data-dir parity-data --port 8000

demo-stop:
	@if [ -f parity-data/server.pid ]; then kill "$$(cat parity-data/server.pid)" 2>/dev/null && echo "demo: server $$(cat parity-data/server.pid) stopped" || echo "demo: server $$(cat parity-data/server.pid) was not running"; rm -f parity-data/server.pid; else echo "demo: no server left running (parity-data/server.pid)"; fi

# The three venvs are independent (network and disk bound): built side by side, they cost the longest of them.
test:
	$(MAKE) --no-print-directory -j3 venv msprobe-venv msprobe26-venv
	bash scripts/test.sh

# The capture tests on each accelerator present (cuda, npu, xpu, mps), beside their CPU half; on a machine
# without one there is none to run (pytest's exit 5 is turned into a message).
test-accelerator: venv
	PARITY_TEST_ACCELERATOR=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m accelerator tests/client; \
	rc=$$?; if [ $$rc = 5 ]; then echo "test-accelerator: no accelerator on this machine"; rc=0; fi; exit $$rc

# The inner loop: everything but the slow end-to-end tests and the PostgreSQL/Celery ones (no services).
test-fast: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider -x -m "not slow and not postgres" tests/shared tests/cli tests/client

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy shared client server parity

bench: venv
	$(BIN)/python benchmarks/bench_compare.py
	$(BIN)/python benchmarks/bench_dump_overhead.py
	$(BIN)/python benchmarks/bench_server.py
	$(BIN)/python benchmarks/bench_localization.py

clean:
	rm -rf $(VENV) $(MSPROBE_VENV) $(MSPROBE26_VENV) demo-output parity-check parity-data .pytest_cache
