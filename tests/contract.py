"""Every real answer checked against the published OpenAPI document."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import jsonschema_rs

from monitor.web.openapi import document

DOC = document()
_TEMPLATES = [
    (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path) for path in DOC["paths"]
]


def template_of(path: str) -> str | None:
    bare = path.split("?", 1)[0]
    matches = [t for rx, t in _TEMPLATES if rx.match(bare)]
    # A literal segment wins over a parameter (``/notices/drain`` is not a ``{key}``).
    return min(matches, key=lambda t: t.count("{"), default=None)


@cache
def _validator(template: str, method: str, status: str) -> Any:
    operation = DOC["paths"][template][method]
    response = operation["responses"].get(status)
    assert response is not None, f"{method.upper()} {template} answered {status}: undocumented"
    schema = response["content"].get("application/json", {}).get("schema")
    if schema is None:
        return None
    return jsonschema_rs.validator_for({**schema, "components": DOC["components"]})


def check_answer(method: str, path: str, status: int, body: Any) -> None:
    """Fail when the answer is not what the document says this route answers."""
    template = template_of(path)
    if template is None or method.lower() not in DOC["paths"][template]:
        return  # an unknown route: the 404/405 is aiohttp's, in the error shape
    validator = _validator(template, method.lower(), str(status))
    if validator is not None:
        errors = [e.message for e in validator.iter_errors(body)]
        assert not errors, f"{method} {path} {status}: {errors[:3]} in {body!r}"
