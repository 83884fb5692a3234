"""``record``: a frozen, slotted dataclass that is as quick to build as an unfrozen one.

``dataclass(frozen=True)`` makes ``__init__`` store each field through
``object.__setattr__``, a method call per field: a three-field record takes about 0.8 us to
build, three times an unfrozen slotted one. The consensus service builds a dozen records
per client write on every member (messages, log entries, transactions, stats, results),
so that cost shows in its throughput. ``record`` keeps everything ``dataclass(frozen=True,
slots=True)`` gives (assignment raises, equality and hash by type and fields) and swaps in
an ``__init__`` that stores straight through the slots' descriptors.

Fields may have a default or a ``default_factory``. A field with ``init=False`` or
``kw_only``, or an ``InitVar``, is refused when the class is defined.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")
_UNSET: Any = object()  # stands for an argument left out whose field has a default_factory


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    made: Any = dataclass(frozen=True, slots=True)(cls)
    names = [f.name for f in fields(made)]
    if list(inspect.signature(made.__init__).parameters)[1:] != names:
        raise TypeError(f"{cls.__name__}: record takes plain fields only")
    params, body, scope = [], [], {"_UNSET": _UNSET}
    for i, f in enumerate(fields(made)):
        if f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: record takes no keyword-only fields")
        scope[f"_set{i}"] = made.__dict__[f.name].__set__
        if f.default_factory is not MISSING:
            scope[f"_factory{i}"] = f.default_factory
            params.append(f"{f.name}=_UNSET")
            body.append(f"    if {f.name} is _UNSET: {f.name} = _factory{i}()")
        elif f.default is not MISSING:
            scope[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        else:
            params.append(f.name)
        body.append(f"    _set{i}(self, {f.name})")
    if hasattr(made, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    exec(source, scope)  # as dataclasses builds its own __init__
    init = scope["__init__"]
    init.__qualname__ = f"{made.__qualname__}.__init__"
    init.__module__ = made.__module__
    made.__init__ = init
    result: type[T] = made
    return result
