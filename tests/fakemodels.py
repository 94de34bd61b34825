"""A stand-in for the model APIs the agent CLIs call, so that a real Claude Code, Codex, Gemini CLI
or Qwen Code can run a whole turn in a test with no account: every request is recorded (what the
model was given: the prompt, the hooks' context, a woken session's new input) and answered with
one short assistant message in the API's own streaming format.

One aiohttp server on 127.0.0.1, port 0, in the test's event loop, speaks all four dialects:

* Anthropic Messages (``POST /v1/messages``): Claude Code, with ``ANTHROPIC_BASE_URL``;
* OpenAI Responses (``POST /v1/responses``): Codex, through a ``model_providers`` entry;
* OpenAI Chat Completions (``POST /v1/chat/completions``): Qwen Code, with ``OPENAI_BASE_URL``;
* Gemini (``POST /v1beta/models/M:streamGenerateContent`` and friends): Gemini CLI, with
  ``GOOGLE_GEMINI_BASE_URL``.

``hold()`` keeps answers back until ``release()`` (a turn that stays busy); ``wait_for`` waits
for a request that holds some text, as an event (a condition the server signals), not a poll.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.waiting import patience

ANSWER = "noted"


@dataclass
class Request:
    path: str
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


def _sse(events: list[dict[str, Any]], *, named: bool = False, done: bool = False) -> bytes:
    out = b"".join((f"event: {e['type']}\n".encode() if named else b"") + f"data: {json.dumps(e)}\n\n".encode()
                   for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _anthropic(body: dict[str, Any]) -> web.Response:
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "m"), "content": [],
           "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
    if not body.get("stream"):
        return web.json_response({**msg, "content": [{"type": "text", "text": ANSWER}], "stop_reason": "end_turn"})
    events: list[dict[str, Any]] = [{"type": "message_start", "message": msg},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ANSWER}},
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
               "usage": {"output_tokens": 1}},
              {"type": "message_stop"}]
    return web.Response(body=_sse(events, named=True), content_type="text/event-stream")


def _responses(_body: dict[str, Any]) -> web.Response:
    usage = {"input_tokens": 1, "input_tokens_details": None, "output_tokens": 1, "output_tokens_details": None,
             "total_tokens": 2}
    events = [{"type": "response.created", "response": {"id": "resp-1"}},
              {"type": "response.output_item.done", "item": {"type": "message", "role": "assistant", "id": "msg-1",
                                                              "content": [{"type": "output_text", "text": ANSWER}]}},
              {"type": "response.completed", "response": {"id": "resp-1", "usage": usage}}]
    return web.Response(body=_sse(events, named=True), content_type="text/event-stream")


def _chat(body: dict[str, Any]) -> web.Response:
    base = {"id": "c1", "created": 1, "model": body.get("model", "m")}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    if not body.get("stream"):
        return web.json_response({**base, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}]})
    chunk = {**base, "object": "chat.completion.chunk"}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER},
                                     "finish_reason": None}]},
              {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}]
    return web.Response(body=_sse(events, done=True), content_type="text/event-stream")


def _gemini(path: str) -> web.Response:
    if path.endswith(":countTokens"):
        return web.json_response({"totalTokens": 1})
    answer = {"candidates": [{"content": {"parts": [{"text": ANSWER}], "role": "model"}, "finishReason": "STOP",
                              "index": 0}],
              "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}}
    if path.endswith(":streamGenerateContent"):
        return web.Response(body=_sse([answer]), content_type="text/event-stream")
    return web.json_response(answer)


@dataclass
class FakeModel:
    """The recorded requests of one server, and its base URL (``http://127.0.0.1:PORT``)."""

    url: str = ""
    requests: list[Request] = field(default_factory=list)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _open: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._open.set()

    def hold(self) -> None:
        """Answer nothing until ``release`` (requests are still recorded at once)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def holding(self, text: str) -> list[Request]:
        return [r for r in self.requests if text in r.body]

    async def wait_for(self, text: str, within: float = 60, count: int = 1) -> list[Request]:
        """The requests holding ``text``, once there are ``count`` of them."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.holding(text)) >= count),
                                   patience(within))
        return self.holding(text)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        async with self._arrived:
            self.requests.append(Request(request.path, body))
            self._arrived.notify_all()
        await self._open.wait()
        path = request.path
        data = json.loads(body) if body and request.method == "POST" else {}
        handlers: dict[str, Callable[[dict[str, Any]], web.Response]] = {
            "/v1/messages": _anthropic, "/v1/responses": _responses, "/v1/chat/completions": _chat}
        if path in handlers:
            return handlers[path](data)
        if "/models/" in path and ":" in path:
            return _gemini(path)
        return web.json_response({})


@asynccontextmanager
async def fake_model() -> AsyncIterator[FakeModel]:
    """A fake model API server for the length of a block."""
    model = FakeModel()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", model.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    model.url = f"http://127.0.0.1:{port}"
    try:
        yield model
    finally:
        model.release()
        await runner.cleanup()
