"""Typed config schemas: one `Field` per key (types, default, choices, a check, a one-line doc).

Recipes and every step's config are validated against them before any work starts; an error
names the file, the key path and what was expected, e.g.
    recipes/vit_hydra.yaml: steps[0].prune.keep_ratio: expected a number in [0, 1], got 'half'
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compressor.core.errors import CompressorError, RecipeError

NUM = (int, float)


@dataclass
class Field:
    """One config key: its type(s), default, allowed values and a one-line description."""

    types: tuple[type, ...]
    default: Any = None
    required: bool = False
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns what was expected, or None
    doc: str = ""
    schema: dict[str, Field] | None = None  # nested mapping


def _at(where: str) -> str:
    """The message prefix naming the file (none for a plugin's own options: its caller adds the place)."""
    return f"{where}: " if where else ""


MAX_BATCH = 65536  # the largest batch size any option accepts (recipes, `predict --batch-size`)


def positive(v: Any) -> str | None:
    return None if v is None or 0 < v < float("inf") else "a finite number > 0"


def type_name(types: tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true/false",
        dict: "a mapping",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)


def check_value(where: str, key_path: str, value: Any, f: Field, error: type[CompressorError] = RecipeError) -> Any:
    """`value` checked against `f` (nested mappings validated too); a copy is returned. A failure
    raises `error` (a recipe's RecipeError by default; an export's ExportError, a plugin's OptionError)."""
    types = f.types
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok and float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise error(f"{_at(where)}{key_path}: expected {type_name(types)}, got {value!r}")
    if f.choices is not None and value not in f.choices:
        raise error(f"{_at(where)}{key_path}: expected one of {', '.join(map(str, f.choices))}, got {value!r}")
    if f.check is not None:
        err = f.check(value)
        if err:
            raise error(f"{_at(where)}{key_path}: expected {err}, got {value!r}")
    if f.schema is not None and isinstance(value, dict):
        return validate_mapping(where, key_path, value, f.schema, error=error)
    return copy.deepcopy(value)


def validate_mapping(
    where: str,
    prefix: str,
    data: Any,
    schema: dict[str, Field],
    extra_ok: bool = False,
    error: type[CompressorError] = RecipeError,
) -> dict:
    """Check keys and types of `data` against `schema`; fill defaults. `extra_ok` keeps unknown
    keys (a plugin's options, checked against its signature elsewhere); failures raise `error`."""
    if not isinstance(data, dict):
        raise error(f"{_at(where)}{prefix or 'top level'}: expected a mapping, got {data!r}")
    dot = f"{prefix}." if prefix else ""
    for key in data:
        if key not in schema and not extra_ok:
            raise error(f"{_at(where)}{dot}{key}: unknown key; expected one of {', '.join(schema)}")
    out: dict = {}
    for key, f in schema.items():
        if key in data:
            out[key] = check_value(where, dot + key, data[key], f, error)
        elif f.required:
            raise error(f"{_at(where)}{dot}{key}: missing; expected {type_name(f.types)} ({f.doc})")
        else:
            default = copy.deepcopy(f.default)
            nested = f.schema and isinstance(default, dict)
            out[key] = validate_mapping(where, dot + key, default, f.schema, error=error) if nested else default
    for key in data:
        if key not in schema:
            out[key] = copy.deepcopy(data[key])
    return out


def plugin_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """Keyword parameters a plugin's constructor accepts (following **kwargs up the MRO)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        more = False
        for name, p in list(inspect.signature(init).parameters.items())[1:]:
            if p.kind == p.VAR_KEYWORD:
                more = True
            elif p.kind != p.VAR_POSITIONAL:
                params.setdefault(name, p)
        if not more:
            break
    return params
