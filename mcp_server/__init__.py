"""MCP tools over a replica."""
