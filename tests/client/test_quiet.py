"""``quiet()``: the tool's own tensor work runs unseen by torch-function modes and subclasses, without grad,
and leaves both states as it found them (nested, and inside a state the user set)."""

from __future__ import annotations

from typing import Any

import torch
from parity.client.stats import quiet
from torch.overrides import TorchFunctionMode

_state = torch._C._get_torch_function_state
_TF = torch._C._TorchFunctionState


class _Seen(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


def test_quiet_hides_the_tool_from_modes_and_turns_grad_off_then_restores_both() -> None:
    x = torch.ones(3, requires_grad=True)
    with _Seen() as seen:
        with quiet():
            y = x.clone()
            assert _state() == _TF.ALL_DISABLED
            assert not torch.is_grad_enabled()
            with quiet():  # nested: the inner exit must not switch anything back on
                pass
            assert _state() == _TF.ALL_DISABLED
            assert not torch.is_grad_enabled()
        assert torch.is_grad_enabled()
        assert _state() == _TF.ENABLED
        x.clone()
    assert len(seen.calls) == 1  # only the user's clone
    assert not y.requires_grad


def test_quiet_restores_a_state_the_user_set() -> None:
    with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
        with quiet():
            assert _state() == _TF.ALL_DISABLED
        assert _state() == _TF.SUBCLASSES_DISABLED
        assert not torch.is_grad_enabled()
    assert _state() == _TF.ENABLED
    assert torch.is_grad_enabled()


def test_quiet_restores_on_an_exception() -> None:
    try:
        with quiet():
            raise ValueError("boom")
    except ValueError:
        pass
    assert _state() == _TF.ENABLED
    assert torch.is_grad_enabled()
