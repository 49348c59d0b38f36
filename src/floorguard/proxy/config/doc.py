"""docs/config.md, generated from the configuration models: every key of a `serve` config
with its type, default and meaning (the attribute docstrings in `proxy/config/guard.py`). A test
fails when the page and the models disagree; `python scripts/config_reference.py` rewrites
it."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from floorguard.proxy.config.guard import GuardServerConfig

__all__ = ["config_reference"]

_HEAD = """# Configuration reference

Every key of a `floorguard serve` configuration (YAML), generated from the configuration
models in `src/floorguard/proxy/config/guard.py` by `python scripts/config_reference.py`; a test
fails when this page and the models disagree. `a.b` is key `b` inside mapping `a`; `a[].b`
is key `b` of each item of list `a`. A value may name an environment variable
(`${NAME}`, `${NAME:-default}`). A file means what PyYAML's safe loader (YAML 1.1) reads
in it. A file that is JSON (YAML's subset) is read by `json`, and any other by `yaml_rs`
where it reads what PyYAML reads (no `yes`, `0755`, `1:30`, tag, anchor or block scalar
anywhere: otherwise PyYAML reads it); a file over 1 MiB is read in a child process. At
100,000 tenants `serve` starts in under 10 s from either format, with the same memory
(docs/benchmarks.md; `src/floorguard/proxy/config/yamlfile.py` says how). See
docs/http.md for how the guard uses them.

| key | type | default | meaning |
|---|---|---|---|
"""


def config_reference() -> str:
    """The page's markdown."""
    rows = list(_rows(GuardServerConfig, ""))
    return _HEAD + "".join(f"| `{k}` | {t} | {d} | {m} |\n" for k, t, d, m in rows)


def _rows(model: type[BaseModel], prefix: str) -> typing.Iterator[tuple[str, str, str, str]]:
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        annotation = field.annotation
        nested = list(_models_in(annotation))
        text = field.description or (nested[0][0].__doc__ if nested else None) or ""
        meaning = " ".join(text.split()).replace("|", "\\|")
        yield key, _type_name(annotation), _default(field), meaning
        for inner, suffix in nested:
            yield from _rows(inner, f"{key}{suffix}.")


def _models_in(annotation: Any) -> typing.Iterator[tuple[type[BaseModel], str]]:
    """The models nested in a field's type: directly, optional, or as list items."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, ""
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)
    elif origin is list:
        for inner, suffix in _models_in(typing.get_args(annotation)[0]):
            yield inner, "[]" + suffix


def _type_name(annotation: Any) -> str:  # noqa: PLR0911 (one return per kind of type)
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"mapping {_type_name(key)} → {_type_name(value)}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if isinstance(value, BaseModel):
        return "(mapping below)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`"
