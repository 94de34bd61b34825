"""A bare MCP server: the floor of ``bench_mcp.py``.

The same SDK (``MCPServer``) and transports as peerd (over HTTP, JSON answers as peerd's
``/mcp`` gives), and tools with peerd's names whose
results are fixed payloads read from a JSON file (``{tool: structuredContent}``), returned as
peerd returns them (JSON text and structured content). Nothing is looked up, validated
beyond the SDK's own argument model, or written: what is left is the SDK's and the
transport's cost of one call carrying that payload.

With a third file (``{tool: outputSchema}``, as peerd lists them) the tools declare those
output schemas, so the client validates each result as it does peerd's: the floor of a server
that publishes peerd's result schemas (``bench_mcp.py`` reports it beside the bare floor).

``stdio-pipes`` serves stdio the way ``peerd mcp`` does (``mcp_server.pipes``: stdin and stdout
read and written on the event loop, not through the SDK's worker threads), so ``bench_mcp.py``
can show what peerd adds over a bare server on the same transport.

    python bench/mcp_floor.py PAYLOADS.json stdio|stdio-pipes [SCHEMAS.json]
    python bench/mcp_floor.py PAYLOADS.json http [SCHEMAS.json]  # prints the port it listens on, then serves
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any, cast

from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent


def result(data: dict[str, Any]) -> CallToolResult:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def build(payloads: dict[str, dict[str, Any]]) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("floor", log_level="WARNING")

    @server.tool(name="send_message")
    def send_message(channel: str, content: str) -> CallToolResult:
        return result(payloads["send_message"])

    @server.tool(name="check_messages")
    def check_messages(recipient: str, limit: int = 20) -> CallToolResult:
        return result(payloads["check_messages"])

    @server.tool(name="poll")
    def poll(thread_id: str, after_seq: int = 0, limit: int = 50) -> CallToolResult:
        return result(payloads["poll"])

    @server.tool(name="list_peers")
    def list_peers(limit: int = 20) -> CallToolResult:
        return result(payloads["list_peers"])

    # peerd's argument names, VantagePeers' camelCase among them
    @server.tool(name="mark_as_read")
    def mark_as_read(receiptIds: list[str], callerOrchestrator: str | None = None) -> CallToolResult:  # noqa: N803
        return result(payloads["mark_as_read"])

    @server.tool(name="message_status")
    def message_status(messageId: str) -> CallToolResult:  # noqa: N803
        return result(payloads["message_status"])

    @server.tool(name="get_message")
    def get_message(messageId: str) -> CallToolResult:  # noqa: N803
        return result(payloads["get_message"])

    @server.tool(name="get_profile")
    def get_profile(orchestratorId: str, instanceId: str | None = None) -> CallToolResult:  # noqa: N803
        return result(payloads["get_profile"])

    @server.tool(name="set_summary")
    def set_summary(summary: str, orchestratorId: str | None = None,  # noqa: N803
                    instanceId: str | None = None) -> CallToolResult:  # noqa: N803
        return result(payloads["set_summary"])

    @server.tool(name="whoami")
    def whoami() -> CallToolResult:
        return result(payloads["whoami"])

    @server.tool(name="append")
    def append(thread_id: str, sender_name: str, content: str) -> CallToolResult:
        return result(payloads["append"])

    @server.tool(name="has_unread")
    def has_unread(thread_id: str, agent_name: str) -> CallToolResult:
        return result(payloads["has_unread"])

    @server.tool(name="thread_status")
    def thread_status(thread_id: str, agent_name: str) -> CallToolResult:
        return result(payloads["thread_status"])

    @server.tool(name="mark_read")
    def mark_read(thread_id: str, agent_name: str, seq: int) -> CallToolResult:
        return result(payloads["mark_read"])

    return server


def declare_output_schemas(server: MCPServer[Any], schemas: dict[str, dict[str, Any]]) -> None:
    """Publish ``schemas`` as the tools' output schemas (the SDK reads them live, at each listing)."""
    for name, schema in schemas.items():
        tool = server._tool_manager.get_tool(name)  # the SDK has no public setter
        assert tool is not None, name
        tool.fn_metadata.output_schema = schema


def serve_http(server: MCPServer[Any]) -> None:
    import anyio  # noqa: PLC0415
    import uvicorn  # noqa: PLC0415
    from mcp.server.transport_security import TransportSecuritySettings  # noqa: PLC0415

    app = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False), json_response=True)
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it, as peerd sets it
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made once the port is printed wait in the backlog until uvicorn accepts
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve, [sock])


def serve_pipes(server: MCPServer[Any]) -> None:
    import anyio  # noqa: PLC0415
    from mcp.server.stdio import stdio_server  # noqa: PLC0415

    from mcp_server.pipes import loop_stdio  # noqa: PLC0415 - peerd's stdio transport

    async def serve() -> None:
        lowlevel = server._lowlevel_server
        async with loop_stdio() as pipes:
            assert pipes is not None, "stdin and stdout must be pipes"
            async with stdio_server(*cast(Any, pipes)) as (read, write):
                await lowlevel.run(read, write, lowlevel.create_initialization_options())

    anyio.run(serve)


def main() -> None:
    payloads = json.loads(Path(sys.argv[1]).read_text())
    server = build(payloads)
    if len(sys.argv) > 3:
        declare_output_schemas(server, json.loads(Path(sys.argv[3]).read_text()))
    if sys.argv[2] == "http":
        serve_http(server)
    elif sys.argv[2] == "stdio-pipes":
        serve_pipes(server)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
