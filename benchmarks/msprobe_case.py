"""One case of the localization suite dumped by msprobe 8.3.3 itself, in msprobe's own interpreter.

    .venv-msprobe/bin/python benchmarks/msprobe_case.py DUMP_DIR FAMILY TASK FAULT SIGMA SEED

``FAULT`` is a fault's label (``mlp:Functional.gelu.0.forward:noise-1e-3``) or ``-`` for none. Prints the
dump.json written. ``bench_localization.py --dumper msprobe`` runs it once per case (msprobe's debugger is a
process-wide singleton, so a fresh process per dump keeps each case's counters and hooks its own).
"""

from __future__ import annotations

import sys
from pathlib import Path

import localization_suite as suite


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    dump_dir, family, task, label, sigma, seed = argv
    faults = {f.label: f for f in suite.FAULTS}
    if label != "-" and label not in faults:
        print(f"msprobe_case.py: unknown fault {label!r}", file=sys.stderr)
        return 2
    fault = faults.get(label)
    path = suite.dump_run(Path(dump_dir), family, task=task, fault=fault, sigma=float(sigma), seed=int(seed),
                          dumper="msprobe")  # fmt: skip
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
