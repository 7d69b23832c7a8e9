"""The environment a run records: versions, packages, driver, and the numerics-relevant environment
variables, never one that looks like a secret."""

from __future__ import annotations

from pathlib import Path

from parity.client.run_metadata import capture_metadata, installed_packages, selected_environment


def test_environment_variables_are_selected_and_secrets_left_out() -> None:
    env = {"NCCL_ALGO": "ring", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HOME": "/root", "PATH": "/bin",
           "TORCH_HUB_TOKEN": "s3cr3t", "ASCEND_API_KEY": "k", "OMP_NUM_THREADS": "4"}  # fmt: skip
    assert selected_environment(env) == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "ring", "OMP_NUM_THREADS": "4"}  # fmt: skip


def test_metadata_records_versions_and_packages(tmp_path: Path) -> None:
    meta = capture_metadata("cpu", cwd=tmp_path)
    assert meta["torch_version"] and meta["python"] and meta["hostname"]
    assert meta["packages"]["torch"].split("+")[0] == meta["torch_version"].split("+")[0]
    assert "numpy" in installed_packages()
    assert meta["driver_version"] is None  # no accelerator here
    assert meta["git_commit"] is None  # tmp_path is no repository
    assert isinstance(meta["env"], dict)
