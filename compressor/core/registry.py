"""Registries of named components: pruners, importances, mergers, steps and model families.

Each kind has an entry-point group and the base class (or, for steps, the type) its members
must be. A name resolves, in order, to something registered in this process (the
`register_*` decorators; the core's own steps and families use them), to an entry point of
the kind's group (how this project's own pruners, importances and mergers are registered, and
how third-party packages add theirs), or, written `package.module:Name`, to an import path. An
import path is imported and checked to be the kind asked for before anything is called or
instantiated.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from compressor.core.errors import PluginError

T = TypeVar("T")


@dataclass(frozen=True)
class Kind:
    """One kind of component: its entry-point group and what every member must be."""

    group: str
    base: str  # "module:Name" of the base class (classes) or type (instances, for steps)
    instances: bool = False  # members are instances of `base` (steps), not subclasses of it

    def base_type(self) -> type:
        module, _, name = self.base.partition(":")
        return getattr(importlib.import_module(module), name)


KINDS: dict[str, Kind] = {
    "pruner": Kind("compressor.pruners", "compressor.plugins:Pruner"),
    "importance": Kind("compressor.importances", "compressor.plugins:Importance"),
    "merger": Kind("compressor.mergers", "compressor.plugins:Merger"),
    "step": Kind("compressor.steps", "compressor.run.steps.base:Step", instances=True),
    "family": Kind("compressor.families", "compressor.families.base:Family"),
}
_LOCAL: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
# core modules whose import registers the core's own members of a kind (steps, families)
_CORE = {"step": "compressor.run.steps", "family": "compressor.families"}


def register(kind: str, name: str) -> Callable[[T], T]:
    """Decorator: make a component available under `name` in this process."""

    def deco(obj: T) -> T:
        _check_kind(kind, obj, name)
        _LOCAL[kind][name] = obj
        return obj

    return deco


def register_pruner(name: str) -> Callable[[T], T]:
    """Class decorator: make a Pruner available to recipes under `name` (in this process)."""
    return register("pruner", name)


def register_merger(name: str) -> Callable[[T], T]:
    """Class decorator: make a Merger available to recipes under `name` (in this process)."""
    return register("merger", name)


def register_importance(name: str) -> Callable[[T], T]:
    """Class decorator: make an Importance available by name (in this process)."""
    return register("importance", name)


def _check_kind(kind: str, obj: Any, name: str) -> None:
    spec = KINDS[kind]
    base = spec.base_type()
    ok = isinstance(obj, base) if spec.instances else isinstance(obj, type) and issubclass(obj, base)
    if not ok:
        what = f"an instance of {base.__name__}" if spec.instances else f"a subclass of {base.__name__}"
        raise PluginError(f"{kind} '{name}': expected {what}, got {_describe(obj)}")


def _describe(obj: Any) -> str:
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if inspect.isroutine(obj):
        return f"function {getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', obj)}"
    return f"a {type(obj).__name__}"


def _load_core(kind: str) -> None:
    if kind in _CORE:
        importlib.import_module(_CORE[kind])


@functools.cache
def _entry_points(kind: str) -> dict:
    return {ep.name: ep for ep in entry_points(group=KINDS[kind].group)}


def _from_import_path(kind: str, name: str) -> Any:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, and a plugin module that fails while importing
        raise PluginError(f"cannot import module '{module_name}' for {kind} '{name}': {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        raise PluginError(f"module '{module_name}' has no attribute '{attr}' ({kind} '{name}')")
    return getattr(module, attr)


def resolve(kind: str, name: str) -> Any:
    """The component named `name`: registered here, an entry point, or `module:Name` (checked)."""
    if kind not in KINDS:
        raise PluginError(f"unknown kind '{kind}'; expected one of {', '.join(KINDS)}")
    if ":" in name:
        obj = _from_import_path(kind, name)
        _check_kind(kind, obj, name)
        return obj
    _load_core(kind)
    if name in _LOCAL[kind]:
        return _LOCAL[kind][name]
    eps = _entry_points(kind)
    if name in eps:
        try:
            obj = eps[name].load()
        except Exception as e:
            raise PluginError(f"{kind} '{name}': entry point {eps[name].value} failed to load: {e}") from e
        _check_kind(kind, obj, name)
        return obj
    raise PluginError(
        f"unknown {kind} '{name}'; choices: {', '.join(names(kind))} (or an import path 'package.module:Name')"
    )


def names(kind: str) -> list[str]:
    """Every name registered for `kind`: this process's in registration order, then entry points'."""
    _load_core(kind)
    return list(_LOCAL[kind]) + sorted(set(_entry_points(kind)) - set(_LOCAL[kind]))


def available(kind: str) -> dict[str, str]:
    """Every registered component of `kind` with a one-line summary (broken plugins say why)."""
    out = {}
    for name in names(kind):
        try:
            out[name] = summary(resolve(kind, name))
        except PluginError as e:  # a broken third-party plugin must not hide the others
            out[name] = f"(failed to load: {e})"
    return out


def summary(obj: Any) -> str:
    """The first line of a component's docstring."""
    doc = (getattr(obj, "doc", None) or obj.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""
