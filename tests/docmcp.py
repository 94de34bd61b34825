"""An MCP client over HTTP for the doc-example runner, run inside a machine's namespace (where the
doc's server listens on 127.0.0.1): ``python tests/docmcp.py URL [HEADER-NAME HEADER-VALUE]...``.

Connects as a client configured with that URL and those headers would, lists the tools, asks
``whoami``, and prints one JSON line: ``{"tools": [...], "whoami": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def probe(url: str, headers: dict[str, str]) -> dict[str, Any]:
    async with (httpx2.AsyncClient(headers=headers, timeout=60) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        tools = [tool.name for tool in (await client.list_tools()).tools]
        me = await client.call_tool("whoami", {})
        return {"tools": tools, "whoami": me.structured_content, "error": me.is_error}


def main() -> None:
    url, rest = sys.argv[1], sys.argv[2:]
    headers = dict(zip(rest[::2], rest[1::2], strict=True))
    print(json.dumps(asyncio.run(probe(url, headers))), flush=True)


if __name__ == "__main__":
    main()
