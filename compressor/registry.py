"""Registries of named Pruner and Merger plugins.

In-tree plugins register with `@register_pruner("name")` / `@register_merger("name")`.
Third-party packages register through entry points (groups `compressor.pruners` and
`compressor.mergers`), and a recipe may also name any class by import path `package.module:Class`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TypeVar

T = TypeVar("T", bound=type)

_GROUPS = {"pruner": "compressor.pruners", "merger": "compressor.mergers"}
_IN_TREE = {"pruner": "pruners", "merger": "mergers"}
_REGISTRY: dict[str, dict[str, type]] = {"pruner": {}, "merger": {}}


class PluginError(LookupError):
    """A plugin name that cannot be resolved."""


def _register(kind: str, name: str) -> Callable[[T], T]:
    def deco(cls: T) -> T:
        _REGISTRY[kind][name] = cls
        cls.plugin_name = name
        return cls

    return deco


def register_pruner(name: str) -> Callable[[T], T]:
    """Class decorator: make a Pruner available to recipes under `name`."""
    return _register("pruner", name)


def register_merger(name: str) -> Callable[[T], T]:
    """Class decorator: make a Merger available to recipes under `name`."""
    return _register("merger", name)


def _load_in_tree(kind: str) -> None:
    importlib.import_module(_IN_TREE[kind])


def _entry_points(kind: str) -> dict:
    return {ep.name: ep for ep in entry_points(group=_GROUPS[kind])}


def available(kind: str) -> dict[str, str]:
    """Names of every registered plugin of `kind` with a one-line summary."""
    _load_in_tree(kind)
    out = {name: _summary(cls) for name, cls in _REGISTRY[kind].items()}
    for name, ep in _entry_points(kind).items():
        if name not in out:
            try:
                out[name] = _summary(ep.load())
            except Exception as e:  # a broken third-party plugin must not hide the others
                out[name] = f"(failed to load from {ep.value}: {e})"
    return dict(sorted(out.items()))


def _summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def resolve(kind: str, name: str) -> type:
    """Return the plugin class named `name`: registry name, entry point, or `module:Class`."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise PluginError(f"cannot import module '{module_name}' for {kind} '{name}': {e}") from e
        try:
            return getattr(module, attr)
        except AttributeError as e:
            raise PluginError(f"module '{module_name}' has no attribute '{attr}' ({kind} '{name}')") from e
    _load_in_tree(kind)
    if name in _REGISTRY[kind]:
        return _REGISTRY[kind][name]
    eps = _entry_points(kind)
    if name in eps:
        return eps[name].load()
    choices = sorted(set(_REGISTRY[kind]) | set(eps))
    raise PluginError(
        f"unknown {kind} '{name}'; choices: {', '.join(choices)} (or an import path 'package.module:Class')"
    )
