"""The closure an optimizer's step calls (`LBFGS.step(closure)` runs the forward and the backward itself), marked by a
step pre-hook so that what it runs is not counted as the update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def around_closure(args: Any, kwargs: Any, enter: Callable[[], None], leave: Callable[[], None],
                   ) -> tuple[Any, Any] | None:
    """An optimizer step pre-hook's answer: the step's arguments (the optimizer first) with its closure, if it takes
    one (`LBFGS.step(closure)`), calling `enter` before and `leave` after each of its calls; None without one."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
    if not callable(closure):
        return None

    def wrapped() -> Any:
        enter()
        try:
            return closure()
        finally:
            leave()

    return (args, {**kwargs, "closure": wrapped}) if "closure" in kwargs else ((args[0], wrapped, *args[2:]), kwargs)
