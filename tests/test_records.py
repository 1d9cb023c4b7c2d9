"""monitor.records.NamedTuple makes what typing.NamedTuple makes of the same class body."""

from __future__ import annotations

import pickle
import typing
from typing import Any

import pytest

from monitor import records
from monitor.kernel.drafts import NewEvent
from monitor.kernel.events import ActorType, EventKind

BODY = '''
from __future__ import annotations

class Point(Base):
    """A point."""

    x: int
    y: str = "a"
    z: tuple[str, ...] = ()

    @property
    def both(self) -> tuple[int, str]:
        return (self.x, self.y)

    def moved(self, by: int) -> Point:
        return self._replace(x=self.x + by)
'''


def _made(base: Any) -> Any:
    namespace: dict[str, Any] = {"Base": base, "__name__": "tests.test_records"}
    exec(BODY, namespace)
    return namespace["Point"]


def test_the_same_class_as_typings() -> None:
    """Fields, defaults, docstring, methods, properties and the namedtuple API alike."""
    ours, theirs = _made(records.NamedTuple), _made(typing.NamedTuple)
    for cls in (ours, theirs):
        p = cls(1)
        assert (1, "a", ()) == tuple(p)
        assert (1, "a") == p.both
        assert cls(3, "a") == p.moved(2)
        assert {"x": 1, "y": "b", "z": ()} == cls(1, y="b")._asdict()
        assert "Point(x=1, y='a', z=())" == repr(p)
        assert isinstance(p, tuple)
    assert theirs._fields == ours._fields
    assert theirs._field_defaults == ours._field_defaults
    assert theirs.__doc__ == ours.__doc__
    # the annotations stay text (typing makes each a ForwardRef: the cost avoided), and
    # evaluate to the same types
    assert {"x": "int", "y": "str", "z": "tuple[str, ...]"} == ours.__annotations__
    assert typing.get_type_hints(theirs) == records.hints(ours)
    assert ("tests.test_records", "Point") == (ours.__module__, ours.__qualname__)


def test_what_typing_refuses_is_refused() -> None:
    """A field without a default after one with, or a namedtuple method replaced."""
    with pytest.raises(TypeError, match="cannot follow default field y"):

        class Wrong(records.NamedTuple):
            y: int = 1
            x: int

    with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):

        class Replacing(records.NamedTuple):
            x: int

            def _replace(self) -> None: ...


def test_a_record_pickles_and_its_hints_evaluate() -> None:
    """A kernel record round-trips through pickle, and :func:`records.hints` evaluates the
    annotations it declares for type checkers only (``Annotated``, ``Any``)."""
    event = NewEvent("agent:main:main", EventKind.HUMAN_DIRECT_MESSAGE, ActorType.HUMAN)
    assert event == pickle.loads(pickle.dumps(event))
    found = records.hints(NewEvent)
    assert typing.get_origin(found["session_key"]) is typing.Annotated
    assert typing.Any == records.hints(NewEvent, extras=False)["payload"]
