"""A mock model server on loopback for the real gateway and the real harnesses.

It speaks, streaming or not, the three wire APIs they call: Anthropic Messages
(``POST /v1/messages``), OpenAI Chat Completions (``POST /v1/chat/completions``) and OpenAI
Responses (``POST /v1/responses``). Every request body is kept, in order, so a test can read
what a model was asked. Replies are scripted with ``POST /_script``
(``{"text": ..., "delay_s": ...}``) and read with ``GET /_requests``. A scripted tool call,
``{"tool": {"when": WORDS, "name": TOOL, "input": {...}}}``, is the reply to every request
whose last message is a person's and holds WORDS (not to the tool's result that follows).

Run it as ``python -m tests.mock_model --port-file FILE``: it binds a free loopback port and
writes it to FILE; or use :class:`MockModel` in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

DEFAULT_TEXT = "ok"


class MockModel:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.text = DEFAULT_TEXT
        self.delay_s = 0.0
        self.tool: dict[str, Any] | None = None
        self._ids = itertools.count(1)
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.add_routes(
            [
                web.post("/v1/messages", self.anthropic),
                web.post("/v1/messages/count_tokens", self.count_tokens),
                web.post("/v1/chat/completions", self.chat),
                web.post("/v1/responses", self.responses),
                web.get("/v1/models", self.models),
                web.post("/_script", self.script),
                web.get("/_requests", self.list_requests),
            ]
        )
        self.app.router.add_route("*", "/{tail:.*}", self.other)

    async def _record(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        self.requests.append({"path": request.path, "body": body})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return body if isinstance(body, dict) else {}

    async def script(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.text = str(body.get("text", self.text))
        self.delay_s = float(body.get("delay_s", self.delay_s))
        if "tool" in body:
            self.tool = body["tool"] if isinstance(body["tool"], dict) else None
        return web.json_response({"ok": True})

    def _tool_for(self, messages: Any) -> dict[str, Any] | None:
        """The scripted tool call, when the last message is a person's holding its words."""
        if self.tool is None or not isinstance(messages, list) or not messages:
            return None
        people = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
        if not people:  # Claude Code's TUI sends its environment after the prompt, as system
            return None
        last = people[-1]
        if not isinstance(last, dict) or last.get("role") != "user":
            return None
        content = last.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if any(isinstance(b, dict) and "result" in str(b.get("type")) for b in blocks):
            return None  # the tool's result: answer it with text
        text = " ".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))
        return self.tool if str(self.tool.get("when", "")) in text else None

    async def list_requests(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.requests), content_type="application/json")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "mock-model"}]})

    async def other(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"error": "not mocked"}, status=404)

    async def count_tokens(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"input_tokens": 1})

    async def _sse(self, request: web.Request, events: list[tuple[str | None, Any]]) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for name, data in events:
            head = f"event: {name}\n".encode() if name else b""
            payload = data if isinstance(data, bytes) else orjson.dumps(data)
            await resp.write(head + b"data: " + payload + b"\n\n")
        await resp.write_eof()
        return resp

    async def anthropic(self, request: web.Request) -> Any:
        body = await self._record(request)
        msg_id = f"msg_{next(self._ids)}"
        model = body.get("model", "mock-model")
        usage = {"input_tokens": 1, "output_tokens": 1}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": self.text}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": usage,
                }
            )
        start = {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        tool = self._tool_for(body.get("messages"))
        if tool is None:
            block: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": self.text}
        else:
            block = {"type": "tool_use", "id": f"toolu_{msg_id}", "name": tool["name"]}
            block["input"] = {}
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(tool["input"]).decode(),
            }
        return await self._sse(
            request,
            [
                ("message_start", {"type": "message_start", "message": start}),
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ),
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {
                            "stop_reason": "end_turn" if tool is None else "tool_use",
                            "stop_sequence": None,
                        },
                        "usage": {"output_tokens": 1},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ],
        )

    async def chat(self, request: web.Request) -> Any:
        body = await self._record(request)
        chat_id = f"chatcmpl-{next(self._ids)}"
        model = body.get("model", "mock-model")
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": chat_id,
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": self.text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            )

        def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> dict[str, Any]:
            return {
                "id": chat_id,
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }

        tool = self._tool_for(body.get("messages"))
        if tool is None:
            first, finish = chunk({"role": "assistant", "content": self.text}, None), "stop"
        else:
            call = {
                "index": 0,
                "id": f"call_{chat_id}",
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "arguments": orjson.dumps(tool["input"]).decode(),
                },
            }
            first, finish = chunk({"role": "assistant", "tool_calls": [call]}, None), "tool_calls"
        return await self._sse(
            request,
            [(None, first), (None, chunk({}, finish, usage=usage)), (None, b"[DONE]")],
        )

    async def responses(self, request: web.Request) -> Any:
        body = await self._record(request)
        n = next(self._ids)
        messages = body.get("input")
        if isinstance(messages, list):  # input items: a tool's output is no person's words
            messages = [m for m in messages if isinstance(m, dict)]
            if messages and messages[-1].get("type") != "message":
                messages = [{"role": "tool", "content": []}]
            messages = [
                {**m, "content": [{**b, "type": "text"} for b in m.get("content") or []]}
                for m in messages
            ]
        tool = self._tool_for(messages)
        item: dict[str, Any] = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": self.text, "annotations": []}],
        }
        if tool is not None:
            item = {
                "id": f"fc_{n}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{n}",
                "name": tool["name"],
                "arguments": orjson.dumps(tool["input"]).decode(),
                **({"namespace": tool["namespace"]} if "namespace" in tool else {}),
            }
        usage = {
            "input_tokens": 1,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 1,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 2,
        }
        done = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": body.get("model", "mock-model"),
            "output": [item],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(done)
        created = {**done, "status": "in_progress", "output": []}
        added = {**item, "status": "in_progress"}
        text_delta = {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": self.text,
        }
        if tool is None:
            added["content"] = []
        return await self._sse(
            request,
            [
                ("response.created", {"type": "response.created", "response": created}),
                (
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": 0, "item": added},
                ),
                *([("response.output_text.delta", text_delta)] if tool is None else []),
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": 0, "item": item},
                ),
                ("response.completed", {"type": "response.completed", "response": done}),
            ],
        )


async def _main(port_file: Path) -> None:
    model = MockModel()
    runner = web.AppRunner(model.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port_file.write_text(str(runner.addresses[0][1]))
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    asyncio.run(_main(parser.parse_args().port_file))
