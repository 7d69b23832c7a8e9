"""Package discovery for Parity's layout; everything else is in pyproject.toml.

The folders ``client``, ``server``, ``shared`` and ``migrations`` install as ``parity.client``, ...
(``package_dir``). pyproject.toml's ``packages.find`` cannot put such a prefix on what it finds, so the
packages are found here, folder by folder, as namespace packages: every folder is one (``versions``,
``templates``, ``static`` included), so none is listed by hand and setuptools warns of none it would
otherwise install as data. The optional C kernel is declared here too: pyproject.toml's ``ext-modules`` is
experimental and says so at every install.
"""

import warnings

from setuptools import Extension, find_namespace_packages, setup

# An editable install (make venv) tells, as "information only", to beware of folders named as the package in
# the working directory: here ``parity/`` is that package's own folder, so the screen of text says nothing.
warnings.filterwarnings("ignore", message="Editable installation")

#: Each top-level package of the distribution and the folder it is installed from.
ROOTS = {
    "parity": "parity",
    "parity.client": "client",
    "parity.server": "server",
    "parity.shared": "shared",
    "parity.migrations": "migrations",
}


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        subpackages = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
        found += [name, *(f"{name}.{sub}" for sub in subpackages)]
    return found


setup(
    package_dir=ROOTS,
    packages=packages(),
    # The fused tensor pass in C (shared/metrics/kernel.py): optional, so an install without a C compiler
    # still succeeds and takes numba's kernel. -ffp-contract=off: a fused multiply-add would round
    # differently from numba's and the numpy pass's sums.
    ext_modules=[
        Extension(
            "parity.shared.metrics._fused",
            sources=["shared/metrics/_fused.c"],
            extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"],
            optional=True,
        )
    ],
)
