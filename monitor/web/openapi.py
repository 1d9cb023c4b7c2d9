"""The OpenAPI 3.1 document of the HTTP API, generated from :mod:`monitor.web.models`.

``ROUTES`` lists every route with the models of its body, query and answer; the schemas
come from msgspec's JSON Schema generation of the same Structs the API decodes with. The
document is served at ``GET /openapi.json`` and kept in ``docs/openapi.json``
(``python -m monitor.web.openapi > docs/openapi.json``; a test keeps the two equal).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from adapters.registry import Form, adoptable_names, entry
from monitor import __version__
from monitor.kernel.events import EventKind, summary_schema
from monitor.web import models as m

VERSION = __version__  # the document's, the page's and --version's: one place


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    answer: type[msgspec.Struct] | None  # None: not JSON (see ``media``)
    body: type[msgspec.Struct] | None = None
    query: type[msgspec.Struct] | None = None
    errors: tuple[int, ...] = (400, 401, 503)
    media: str = "application/json"
    open: bool = False  # no token needed
    extra: dict[int, tuple[str, type[msgspec.Struct]]] = field(default_factory=dict)


_KEY = "/v1/sessions/{key}"
_BODY_ERRORS = (400, 401, 413, 415, 503)

ROUTES = (
    Route("get", "/healthz", "Liveness; needs no token", m.Ok, errors=(), open=True),
    Route("get", "/openapi.json", "This document", None, errors=(), open=True),
    Route("get", "/metrics", "Prometheus metrics", None, errors=(401, 503), media="text/plain"),
    Route(
        "put",
        _KEY,
        "Create or update the gateway session record (creating records `created`)",
        m.SessionInfo,
        body=m.SessionUpsert,
        errors=_BODY_ERRORS,
    ),
    Route("post", f"{_KEY}/reset", "Drop the session's cursors and self-echo memory", m.Ok),
    Route(
        "delete",
        _KEY,
        "Delete the session: events, head, cursors on both sides, link",
        m.Ok,
        query=m.AgentQuery,
    ),
    Route(
        "post",
        f"{_KEY}/own-messages",
        "Remember a gateway-side user message (as a hash) for self-echo filtering",
        m.Ok,
        body=m.OwnMessage,
        errors=_BODY_ERRORS,
    ),
    Route(
        "post",
        "/v1/events",
        "Record one state event",
        m.EventRecorded,
        body=m.EventIn,
        errors=(400, 401, 413, 415),
        extra={503: ("The database is unavailable; nothing was recorded", m.NotRecorded)},
    ),
    Route(
        "post",
        "/v1/spawns",
        "Record `child_spawned`, seeding the parent's cursor",
        m.EventRecord,
        body=m.SpawnIn,
        errors=_BODY_ERRORS,
    ),
    Route(
        "post", "/v1/watches", "Register a watch", m.Watched, body=m.WatchIn, errors=_BODY_ERRORS
    ),
    Route(
        "get",
        f"{_KEY}/status",
        "`session_status`: the state version, and the delta since `changesSince`",
        m.Status,
        query=m.StatusQuery,
    ),
    Route("get", "/v1/sessions", "State versions", m.Sessions, query=m.SessionsQuery),
    Route(
        "get",
        "/v1/watchers/{key}/notices",
        "Peek at the watcher's pending notices",
        m.Notices,
        query=m.NoticesQuery,
    ),
    Route(
        "post",
        "/v1/watchers/{key}/notices/drain",
        "Take the watcher's pending notices (acknowledged)",
        m.Notices,
        query=m.NoticesQuery,
    ),
    Route(
        "get",
        "/v1/watchers/{key}/notices/stream",
        "Server-Sent Events: each notice as it opens (`event: notice`, data `{target, text}`),"
        " and keep-alive comments; peeks, never drains",
        None,
        query=m.NoticesQuery,
        media="text/event-stream",
    ),
    Route("get", "/v1/catalog", "The native sessions", m.Catalog, query=m.CatalogQuery),
    Route(
        "post",
        "/v1/links",
        "Adopt a native session (creates the session record when missing)",
        m.Adopted,
        body=m.LinkIn,
        errors=(400, 401, 403, 404, 413, 415, 503),
    ),
    Route("get", "/v1/links", "Every link, with its state", m.Links),
    Route(
        "delete",
        "/v1/links/{key}",
        "Remove a session's link",
        m.Ok,
        query=m.AgentQuery,
        errors=(400, 401, 404, 503),
    ),
    Route(
        "post",
        "/v1/ui/tickets",
        "A one-time link to the status page, good for a minute (`sessionwatch open`)",
        m.UiTicket,
        errors=(401,),
    ),
)

_ERROR_TEXT = {
    400: "A client's mistake (names the field); nothing was written",
    401: "No valid `Authorization: Bearer <token>`",
    403: "The path lies outside the configured roots (or is not the OpenCode database)",
    404: "Not found",
    413: "The body is larger than 1 MiB",
    415: "The body is not `application/json`",
    503: "The database is unavailable or locked; `Retry-After` says when to retry",
}

_REF = "#/components/schemas/{name}"


def _json(ref: type[msgspec.Struct]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": _REF.format(name=ref.__name__)}}}


def _parameters(route: Route, components: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if "{key}" in route.path:
        out.append(
            {
                "name": "key",
                "in": "path",
                "required": True,
                "description": "an agent-qualified session key, `agent:<agentId>:<rest>`",
                "schema": {"type": "string", "pattern": m.PATH_KEY_PATTERN, "maxLength": m.KEY_MAX},
            }
        )
    if route.query is not None:
        schema = components[route.query.__name__]
        required = set(schema.get("required", ()))
        for name, prop in schema["properties"].items():
            prop = dict(prop)
            prop.pop("default", None)
            if "anyOf" in prop:  # ``X | None``: absent is the None
                kept = [s for s in prop.pop("anyOf") if s.get("type") != "null"]
                prop.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
            out.append({"name": name, "in": "query", "required": name in required, "schema": prop})
    return out


def _operation(route: Route, components: dict[str, Any]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if route.answer is not None:
        ok["content"] = _json(route.answer)
    else:  # a document of its own (this one), or text (the metrics)
        kind = "object" if route.media == "application/json" else "string"
        ok["content"] = {route.media: {"schema": {"type": kind}}}
    responses: dict[str, Any] = {"200": ok}
    for status in route.errors:
        responses[str(status)] = {
            "description": _ERROR_TEXT[status],
            "content": _json(m.ErrorAnswer),
        }
    for status, (text, model) in route.extra.items():
        responses[str(status)] = {"description": text, "content": _json(model)}
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": f"{route.method}_{route.path}".replace("/", "_")
        .replace("{", "")
        .replace("}", ""),
        "responses": responses,
    }
    params = _parameters(route, components)
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": _json(route.body)}
    if route.open:
        op["security"] = []
    return op


_FORM_FIELDS = {"file": ("path",), "database": ("path", "thread"), "node": ("node", "thread")}


def _adoption_form(form: Form, text: dict[str, Any]) -> dict[str, Any]:
    """The body that adopts a source of one form, with the registered kinds of that form."""
    kinds = [name for name in adoptable_names() if entry(name).form == form]
    fields = _FORM_FIELDS[form]
    return {
        "required": ["kind", *fields],
        "properties": {"kind": {"enum": kinds}, **{f: text for f in fields}},
        "not": {"required": ["catalogId"]},
    }


def document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    structs: set[type[msgspec.Struct]] = {m.ErrorAnswer}
    for r in ROUTES:
        structs.update(x for x in (r.answer, r.body, r.query) if x is not None)
        structs.update(model for _, model in r.extra.values())
    ordered = sorted(structs, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(ordered, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, components)
    for route in ROUTES:  # queries are parameters, not schemas
        if route.query is not None:
            components.pop(route.query.__name__, None)
    components["EventIn"]["if"] = {  # a bare key needs its agent
        "properties": {"sessionKey": {"not": {"pattern": m.KEY_PATTERN}}}
    }
    components["EventIn"]["then"] = {"required": ["agentId"]}
    components["EventIn"]["allOf"] = [  # a summary is one of its kind's templates
        {
            "if": {"properties": {"kind": {"const": kind.value}}, "required": ["kind"]},
            "then": {"properties": {"summary": summary_schema(kind)}},
        }
        for kind in EventKind
    ]
    text = {"type": "string", "minLength": 1}
    components["LinkIn"]["oneOf"] = [  # which adoption: what the route checks
        {
            "required": ["catalogId"],
            "properties": {"catalogId": text},
            "not": {
                "anyOf": [
                    {"required": ["kind"]},
                    {"required": ["path"]},
                    {"required": ["node"]},
                    {"required": ["thread"]},
                ]
            },
        },
        *(_adoption_form(form, text) for form in ("file", "database", "node")),
    ]
    _typed_constants(components)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sessionwatch",
            "version": VERSION,
            "description": "The sidecar's HTTP API (docs/api.md). Errors are"
            ' `{"error": {"code", "message"}}`.',
        },
        "servers": [{"url": "http://127.0.0.1:8765"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _typed_constants(node: Any) -> None:
    """msgspec writes ``Literal[True]`` as ``{"enum": [true]}`` with no type, which client
    generators drop; every such schema becomes ``{"type": "boolean", "const": true}``."""
    if isinstance(node, dict):
        enum = node.get("enum")
        if isinstance(enum, list) and len(enum) == 1 and isinstance(enum[0], bool):
            del node["enum"]
            node.update({"type": "boolean", "const": enum[0]})
        for value in node.values():
            _typed_constants(value)
    elif isinstance(node, list):
        for value in node:
            _typed_constants(value)


@functools.cache
def document_bytes() -> bytes:
    return orjson.dumps(document(), option=orjson.OPT_INDENT_2) + b"\n"


if __name__ == "__main__":
    sys.stdout.buffer.write(document_bytes())


def declared_query_params() -> dict[tuple[str, str], frozenset[str]]:
    """Each route's query parameters, by (method, path), as the document declares them."""
    return {
        (method.upper(), path): frozenset(
            p["name"] for p in op.get("parameters", []) if p.get("in") == "query"
        )
        for path, ops in document()["paths"].items()
        for method, op in ops.items()
    }
