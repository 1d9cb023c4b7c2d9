"""``typing.NamedTuple``, made without importing ``typing``.

A one-shot command (``status``, ``record``, ``notices --drain``) lives for a few tens of
milliseconds, and the modules it loads declare about twenty-five NamedTuples. ``import
typing`` costs it about 3 ms, and ``typing.NamedTuple`` another 0.15 ms a class to turn
each field's annotation into a checked type that nothing here reads. So the modules a
one-shot command loads take :data:`NamedTuple` from here: a type checker sees typing's own
class, and at run time a class written the same way (fields with their annotations and
defaults, a docstring, methods and properties) becomes the same ``collections.namedtuple``.

They import ``typing``'s other names for type checkers only (``TYPE_CHECKING = False``, then
``if TYPE_CHECKING:``), so their annotations stay text; :func:`hints` evaluates a record's
when a caller needs the types themselves (the configuration's decoder, the API's models).
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    import collections

    # what typing.NamedTuple refuses to let a class body replace, and what it does not copy
    _PROHIBITED = frozenset(
        {"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults"}
        | {"_make", "_replace", "_asdict", "_source"}
    )
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})

    class _Maker(type):
        def __new__(mcls, name, bases, namespace):
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, namespace)
            if bases != (NamedTuple,):
                raise TypeError("a NamedTuple's only base is NamedTuple")
            if "__annotations__" not in namespace and "__annotate__" in namespace:
                # Python 3.14 evaluates annotations lazily, unless the future import asks
                raise TypeError(f"{name}: declare it under from __future__ import annotations")
            annotations = namespace.get("__annotations__", {})
            fields = list(annotations)
            defaults, named = [], []
            for field in fields:
                if field in namespace:
                    defaults.append(namespace[field])
                    named.append(field)
                elif named:
                    raise TypeError(
                        f"Non-default namedtuple field {field} cannot follow default"
                        f" field{'s' if len(named) > 1 else ''} {', '.join(named)}"
                    )
            made = collections.namedtuple(
                name, fields, defaults=defaults, module=namespace["__module__"]
            )
            made.__annotations__ = dict(annotations)
            for key, value in namespace.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"Cannot overwrite NamedTuple attribute {key}")
                if key not in _SPECIAL and key not in annotations:
                    setattr(made, key, value)
            return made

    class NamedTuple(metaclass=_Maker):
        """Subclass it as ``typing.NamedTuple``: ``class Point(NamedTuple): x: int``."""


# typing's names that annotations written for type checkers use
_TYPING_NAMES = ("Annotated", "Any", "Literal")


def hints(record: type[Any], *, extras: bool = True) -> dict[str, Any]:
    """A record's field types, evaluated (with their ``Annotated`` extras unless not
    ``extras``), through its module's names and the typing names it imports for type
    checkers only."""
    import typing  # only where the types themselves are read

    names = {name: getattr(typing, name) for name in _TYPING_NAMES}
    return typing.get_type_hints(record, localns=names, include_extras=extras)


__all__ = ["NamedTuple", "hints"]
