"""An MCP SDK client of a local port, authenticated as peerd's own clients are: the bearer token of
the home (or server) it talks to, plus any session headers (``X-Peerd-Role`` and the like).

Usage::

    async with mcp_client(d.info["mcp_url"], d.token, headers={"X-Peerd-Role": "beta"}) as c:
        await c.call_tool("whoami", {})

Tests and benchmarks use it for every MCP session over HTTP (``Client(url)`` alone would get 401).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def bearer(token: str | None) -> dict[str, str]:
    """The Authorization header for ``token`` ({} for None: a caller that proves nothing)."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def mcp_client(url: str, token: str | None, *, headers: Mapping[str, str] | None = None,
                     http_timeout: httpx2.Timeout | None = None, **options: Any) -> AsyncIterator[Client]:
    """A connected ``mcp.Client`` on the streamable HTTP endpoint ``url``: the SDK's own HTTP client
    (its timeouts unless ``http_timeout``) with the token and ``headers``; ``options`` go to ``Client``."""
    async with (create_mcp_http_client({**bearer(token), **(headers or {})}, http_timeout) as http,
                Client(streamable_http_client(url, http_client=http), **options) as client):
        yield client


__all__ = ["bearer", "mcp_client"]
