"""Tool sets: which tools a session is offered (``peerd mcp --tools``, or per HTTP session by the
``X-Peerd-Tools`` header or ``?tools=`` query parameter).

Invariants:
* A set is a name and the tool names it offers (``None``: every tool); ``TOOL_SETS`` is the one
  registry, so a new module's tools join a set, or make one, with one entry here.
* ``all`` (the default) offers every tool with its output schema. The lean sets (``vantage``,
  ``agentmsgs``) offer their tools without output schemas, as VantagePeers and AgentMsgs publish
  none: every agent session pays ``tools/list`` in context (the ``vantage`` list stays under
  ``VANTAGE_BUDGET`` bytes, a test checks it). Results are the same whatever the set.
* A tool outside the session's set is not listed and a call to it is refused
  (``invalid_argument``), so a lean session cannot reach what it was not shown.
* An unknown set name is ``InvalidArgument`` naming the sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, ListToolsResult, TextContent

from replica.errors import InvalidArgument

TOOLS_HEADER = "x-peerd-tools"
TOOLS_QUERY = "tools"
VANTAGE_BUDGET = 12 * 1024  # bytes of the vantage set's tools/list result


@dataclass(frozen=True)
class ToolSet:
    name: str
    tools: frozenset[str] | None  # None: every tool
    output_schemas: bool = True

    def offers(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


VANTAGE = frozenset({
    "send_message", "check_messages", "mark_as_read", "delete_message", "get_message", "list_messages",
    "list_broadcast_status", "search_messages_by_keyword", "set_summary", "list_peers", "get_profile",
    "update_profile", "whoami", "replay_unread",
})
AGENTMSGS = frozenset({
    "create_agent", "delete_account", "create_thread", "join_thread", "leave_thread", "thread_info",
    "thread_status", "append", "poll", "has_unread", "mark_read", "whoami",
})

TOOL_SETS: dict[str, ToolSet] = {s.name: s for s in (
    ToolSet("all", None),
    ToolSet("vantage", VANTAGE, output_schemas=False),
    ToolSet("agentmsgs", AGENTMSGS, output_schemas=False),
)}
ALL = TOOL_SETS["all"]


def tool_set(name: str) -> ToolSet:
    found = TOOL_SETS.get(name.strip().lower())
    if found is None:
        raise InvalidArgument(f"unknown tool set {name!r}; the sets are: {', '.join(TOOL_SETS)}")
    return found


def _pick(values: object, key: str) -> str | None:
    if not isinstance(values, Mapping):
        return None
    value = values.get(key)
    return value.strip() or None if isinstance(value, str) else None


def chosen(request: object, default: ToolSet) -> ToolSet:
    """The set one HTTP request asks for (header, then query), else ``default``."""
    name = _pick(getattr(request, "headers", None), TOOLS_HEADER) or _pick(
        getattr(request, "query_params", None), TOOLS_QUERY)
    return tool_set(name) if name else default


def listed(result: ListToolsResult, tools: ToolSet) -> ListToolsResult:
    """A tools/list result cut to ``tools`` (and, for a lean set, without output schemas)."""
    kept = [t for t in result.tools if tools.offers(t.name)]
    if not tools.output_schemas:
        kept = [t.model_copy(update={"output_schema": None}) for t in kept]
    return result.model_copy(update={"tools": kept})


class ToolSetFilter:
    """Middleware that serves each request the tool set it asks for."""

    def __init__(self, default: ToolSet) -> None:
        self.default = default

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            tools = chosen(ctx.request, self.default)
        except InvalidArgument as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"invalid_argument: {exc}") from None
        if ctx.method == "tools/call":
            name = str((ctx.params or {}).get("name", ""))
            if not tools.offers(name):
                text = (f"invalid_argument: tool {name!r} is not in this session's tool set {tools.name!r} "
                        f"(ask for another with --tools, the {TOOLS_HEADER} header or ?{TOOLS_QUERY}=)")
                return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        result = await call_next(ctx)
        if ctx.method == "tools/list" and tools is not ALL:
            if isinstance(result, dict):
                result = ListToolsResult.model_validate(result)
            if isinstance(result, ListToolsResult):
                return listed(result, tools)
        return result
