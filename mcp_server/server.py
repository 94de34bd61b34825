"""Assembling the tools into an ``MCPServer``; errors and bindings at the boundary.

Invariants:
* Every tool publishes an input schema (exact wire names), a one-line
  description and an output schema; success returns the result both as
  ``structuredContent`` and as JSON text.
* A bad call returns ``isError`` with ``"<code>: <message>"`` text and no
  structured content (the code is the one table's, ``replica.errors.FACES``:
  ``invalid_argument``, ``not_found``, ``store_error`` ...); it has changed nothing.
  ``run_tool`` never raises: any other exception is a bug of ours and becomes ``internal_error: <type>: <message>``,
  logged with its traceback the first time per tool and type (one line after
  that), never the SDK's generic text.
* A call's binding comes from, in order: HTTP headers ``X-Peerd-Role`` /
  ``X-Peerd-Instance``, query ``?role=&instance=``, the server's own binding
  (command line). Arguments then win over the binding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import CallToolResult, ContentBlock, SubscriptionsListenRequestParams, TextContent
from pydantic import BaseModel, ConfigDict, ValidationError

from mcp_server import published, resources
from mcp_server.channel import PushHub, replay_tool
from mcp_server.listen import LISTEN
from mcp_server.tools import (
    TOOLS,
    Call,
    Env,
    FleetIdProvider,
    SessionBinding,
    ToolSpec,
    Wire,
)
from mcp_server.toolsets import ToolSetFilter, tool_set
from replica import PeerdError, Replica
from replica.errors import face
from replica.feed import Waiter

ROLE_HEADER = "x-peerd-role"
INSTANCE_HEADER = "x-peerd-instance"
ROLE_QUERY = "role"
INSTANCE_QUERY = "instance"

INSTRUCTIONS = (
    "peerd: messages between AI agents across machines (VantagePeers' tools, offline-first). Call whoami "
    "to see which role this session speaks for; send_message to write; check_messages (optionally with "
    "wait) to read, then mark_as_read with the receipt ids; message_status or list_broadcast_status to see "
    "delivery; set_summary and list_peers for who does what. Threads: create_agent, create_thread, append, poll. "
    "Before editing shared files, file_reservation_paths (mcp_agent_mail's tools); paths in its conflicts are "
    "another role's."
)

ReplicaSource = Replica | Callable[[], Replica]

log = logging.getLogger("mcp_server")


class _RawArguments(ArgModelBase):
    """Hands the tool the raw argument object; our own models check it (clean errors, aliases)."""

    model_config = ConfigDict(extra="allow")

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def error_code(exc: PeerdError) -> str:
    """The MCP code of ``exc``: the one table's (``replica.errors.FACES``)."""
    return face(exc).code


def error_result(code: str, message: str) -> CallToolResult:
    text = f"{code}: {message}".encode("utf-8", "replace").decode("utf-8")  # never a lone surrogate on the wire
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def describe_invalid(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem, naming arguments as they are spelt on the wire."""
    allowed = ", ".join(f.alias or n for n, f in model.model_fields.items())
    parts: list[str] = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "missing":
            parts.append(f"missing required argument '{where}'")
        elif err["type"] == "extra_forbidden":
            parts.append(f"unknown argument '{where}' (arguments: {allowed or 'none'})")
        else:
            parts.append(f"'{where}': {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def success_result(out: BaseModel | Wire | None) -> CallToolResult:
    """``out`` as structured content and JSON text; a ``Wire`` dict is already in wire form. A
    result's ``warning`` sentence is also a text of its own, after the JSON, so an agent that
    reads the text meets it. ``None`` (VantagePeers' ``null``) is the text ``null`` alone."""
    if out is None:
        return CallToolResult(content=[TextContent(type="text", text="null")])
    data = out if isinstance(out, dict) else out.model_dump(mode="json", by_alias=True)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    warning = data.get("warning")
    if isinstance(warning, str):
        content.append(TextContent(type="text", text=f"warning: {warning}"))
    return CallToolResult(content=content, structured_content=data)


def _pick(values: object, key: str) -> str | None:
    if not isinstance(values, Mapping):
        return None
    value = values.get(key)
    return value.strip() or None if isinstance(value, str) else None


def request_binding(request: object, default: SessionBinding) -> SessionBinding:
    """The binding for one request: headers, then query parameters, then ``default``."""
    headers = getattr(request, "headers", None)
    query = getattr(request, "query_params", None)
    role = _pick(headers, ROLE_HEADER) or _pick(query, ROLE_QUERY) or default.role
    instance = _pick(headers, INSTANCE_HEADER) or _pick(query, INSTANCE_QUERY) or default.instance
    return SessionBinding(role, instance)


def _request_of(ctx: Context[Any, Any]) -> object:
    try:
        return ctx.request_context.request
    except ValueError:  # called outside a request (direct call_tool): no transport data
        return None


async def run_tool(spec: ToolSpec[Any, Any], env: Env, ctx: Context[Any, Any],
                   arguments: Mapping[str, Any]) -> CallToolResult:
    """One call: its result, or an error result; never an exception (see the module's invariants)."""
    try:
        return await _run(spec, env, ctx, arguments)
    except Exception as exc:
        return internal_error(spec.name, exc, env.bugs_told)


async def _run(spec: ToolSpec[Any, Any], env: Env, ctx: Context[Any, Any],
               arguments: Mapping[str, Any]) -> CallToolResult:
    try:
        args = spec.args.model_validate(dict(arguments))
    except ValidationError as exc:
        return error_result("invalid_argument", describe_invalid(exc, spec.args))
    call = Call(env, request_binding(_request_of(ctx), env.bind), spec.quick)
    try:
        out = await spec.handler(call, args)
    except PeerdError as exc:
        return error_result(error_code(exc), str(exc))
    return success_result(out)


def internal_error(tool: str, exc: Exception, told: set[tuple[str, str]]) -> CallToolResult:
    """A bug of ours met in ``tool``: told to the caller as ``internal_error``, logged for us
    (with the traceback when ``told`` shows it is the first of its kind)."""
    key = (tool, type(exc).__name__)
    if key in told:
        log.error("tool %s failed again: %s: %s", tool, type(exc).__name__, exc)
    else:
        told.add(key)
        log.error("tool %s failed (a bug): %s: %s", tool, type(exc).__name__, exc, exc_info=exc)
    return error_result("internal_error", f"{type(exc).__name__}: {exc}")


def make_tool(spec: ToolSpec[Any, Any], env: Env) -> Tool:
    async def runner(ctx: Context[Any, Any], arguments: dict[str, Any]) -> CallToolResult:
        return await run_tool(spec, env, ctx, arguments)

    return Tool(
        fn=runner,
        name=spec.name,
        title=None,
        description=spec.description,
        parameters=published.input_schema(spec.args),
        # No output_model: the SDK would validate every result against it again, and a result is
        # its model's dump already (or, for the hot tools, its wire form: tests check both).
        fn_metadata=FuncMetadata(arg_model=_RawArguments,
                                 output_schema=None if spec.out is None else published.output_schema(spec.out)),
        is_async=True,
        context_kwarg="ctx",
        annotations=spec.annotations,
    )


def _version() -> str:
    try:
        return metadata.version("peerd")
    except metadata.PackageNotFoundError:
        return "0"


def replica_source(replica: ReplicaSource) -> Callable[[], Replica]:
    return (lambda: replica) if isinstance(replica, Replica) else replica


def build_server(replica: ReplicaSource, *, waiter: Waiter, bind: SessionBinding | None = None,
                 fleet_id: FleetIdProvider | None = None, push: PushHub | None = None,
                 tools: str = "all") -> MCPServer[Any]:
    """An MCP server with every peerd tool and resource over ``replica`` (a Replica or a
    zero-argument provider).

    ``waiter`` blocks ``wait`` calls until the replica changes; ``bind`` is the session binding
    when the transport cannot carry one (stdio); ``fleet_id`` is an optional daemon hook
    (called on the event loop: it must not block); ``push`` pushes mail and resource updates
    to sessions and serves ``subscriptions/listen`` (``mcp_server.channel``, ``mcp_server.listen``;
    without it there are none of these); ``tools`` names the tool set offered
    (``mcp_server.toolsets``; an HTTP request may ask for another).
    """
    source = replica_source(replica)
    env = Env(source, waiter, bind or SessionBinding(), fleet_id)
    specs = (*TOOLS, replay_tool(push)) if push is not None else TOOLS
    ours = [push.middleware, push.listens.middleware] if push is not None else []
    server: MCPServer[Any] = MCPServer(
        "peerd",
        version=_version(),
        instructions=INSTRUCTIONS,
        tools=[make_tool(spec, env) for spec in specs],
        log_level="WARNING",
        subscriptions=False,  # subscriptions/listen is served below, by the hub's own handler (or not at all)
        middleware=[*ours, ToolSetFilter(tool_set(tools)).middleware],
    )
    if push is not None:
        # MCPServer keeps the ListenHandler it would build to itself, and peerd must end the streams
        # at shutdown: so the hub builds it, on its own bus, and it is registered as a low-level
        # server's would be (``on_subscriptions_listen``).
        server._lowlevel_server.add_request_handler(LISTEN, SubscriptionsListenRequestParams, push.listens.handler)
    resources.register(server, source)
    return server
