"""DTensors (``torch.distributed.tensor``) in the dump: the local shard's values, and where the shard sits.

FSDP2 (``fully_shard``) parameters and their gradients, and tensor-parallel activations, are DTensors. Their
statistics are the local shard's and a tensor file holds the local shard as a plain tensor, as msprobe 8.3.3
writes them (``type: torch.distributed.tensor.DTensor``, ``shape`` the local shape, ``device_mesh`` and
``placements``): reducing a DTensor itself would be a distributed operator, and a mix of DTensor and plain
results in one stacked flush fails ("got mixed torch.Tensor and DTensor"); a file holding a DTensor needs
``torch.distributed.tensor`` imported to load and is refused by ``torch.load(weights_only=True)``.

Beside msprobe's two keys the leaf says what a compare across layouts needs to see the tensor whole (keys
msprobe's readers and Parity's ignore): ``global_shape`` and ``mesh`` (``shape``, ``dim_names``, this rank's
``coordinate``, and the global ``ranks`` of the mesh's flattened order as ``device_mesh`` lists them).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["DTENSOR_TYPE", "dtensor_class", "is_dtensor", "layout_keys", "local_tensor", "plain_tensor"]

#: msprobe's ``type`` for a DTensor leaf
DTENSOR_TYPE = "torch.distributed.tensor.DTensor"

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


@functools.cache
def dtensor_class() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None where this torch has no distributed package."""
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a build without distributed support
        return None
    return DTensor


def is_dtensor(t: Any) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: Any) -> torch.Tensor:
    """The local shard of a DTensor, without a graph node (``_local_tensor``; ``to_local()`` where a torch
    version lacks the attribute)."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, _Tensor):
        return local
    return t.to_local()  # type: ignore[no-any-return]


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t``, or its local shard where it is a DTensor: what a tensor file holds."""
    cls = type(t)
    if cls is _Tensor or cls is _Parameter or not is_dtensor(t):
        return t
    return local_tensor(t)


def _placement(p: Any) -> dict[str, Any]:
    """One placement as msprobe writes it: ``{"Shard": {"dim": d}}``, ``{"Replicate": {}}``,
    ``{"Partial": {"reduce_op": op}}`` (a strided or other shard keeps its class name and dim)."""
    if p.is_shard():
        name = "Shard" if type(p).__name__ == "Shard" else type(p).__name__
        return {name: {"dim": int(p.dim)}}
    if p.is_replicate():
        return {"Replicate": {}}
    if p.is_partial():
        op = getattr(p, "reduce_op", None)
        return {"Partial": {"reduce_op": op if isinstance(op, str) else str(op)}}
    return {type(p).__name__: {}}


# (id(mesh), placements) -> (the mesh, held so its id stays unique; the leaf keys but global_shape): a mesh's
# description is the same for every tensor on it, and ``mesh.tolist()`` costs more than the statistics
_LAYOUTS: dict[tuple[int, Any], tuple[Any, dict[str, Any]]] = {}
_MAX_LAYOUTS = 4096


def _mesh_keys(mesh: Any, placements: Any) -> dict[str, Any]:
    key = (id(mesh), placements)
    known = _LAYOUTS.get(key)
    if known is not None and known[0] is mesh:
        return known[1]
    coordinate = mesh.get_coordinate()
    names = getattr(mesh, "mesh_dim_names", None)
    keys = {
        "device_mesh": mesh.mesh.tolist(),
        "placements": [_placement(p) for p in placements],
        "mesh": {"shape": list(mesh.mesh.shape), "dim_names": list(names) if names else None,
                 "coordinate": list(coordinate) if coordinate is not None else None},
    }  # fmt: skip
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    _LAYOUTS[key] = (mesh, keys)
    return keys


def layout_keys(t: Any) -> dict[str, Any]:
    """The leaf keys that say where ``t``'s local shard sits: msprobe's ``device_mesh`` and ``placements``,
    then ``global_shape`` and ``mesh``. Never raises: a DTensor whose layout cannot be read gets none."""
    try:
        keys = _mesh_keys(t.device_mesh, tuple(t.placements))
        out = {"device_mesh": keys["device_mesh"], "placements": keys["placements"],
               "global_shape": list(t.shape), "mesh": keys["mesh"]}  # fmt: skip
    except Exception:  # an exotic mesh: the statistics still count
        return {}
    return out
