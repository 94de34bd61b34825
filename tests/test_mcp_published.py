"""The published tool schemas are read from tool_schemas.json, which equals what the models give."""

from __future__ import annotations

from typing import Any

from mcp_server import published, schemas
from mcp_server.schemas import InboxOut, PeersOut, PollOut


def test_schema_file_equals_what_the_models_give() -> None:
    """tool_schemas.json is up to date (regenerate: python -m mcp_server.published), key order included."""
    fresh = published.render(published.generate(published.tool_models()))
    assert published.SCHEMA_FILE.read_text(encoding="utf-8") == fresh


def test_every_tool_is_in_the_file() -> None:
    """No tool's schema is computed at start: each model has its entry."""
    stored = published.stored()
    for args, out in published.tool_models():
        assert args.__name__ in stored["input"] and out.__name__ in stored["output"]
        assert published.input_schema(args) == schemas.input_schema(args)
        assert published.output_schema(out) == schemas.output_schema(out)


def _items(schema: dict[str, Any], field: str) -> dict[str, Any]:
    prop = schema["properties"][field]
    assert prop["type"] == "array"
    items: dict[str, Any] = prop["items"]
    return items


def test_lists_of_objects_are_shallow_and_name_their_fields() -> None:
    """An inbox's, a thread's and the peers' items are {type: object} with their fields named; top fields stay typed."""
    for model, field, some in ((InboxOut, "messages", "receiptId"), (PollOut, "messages", "sender_id"),
                               (PeersOut, "items", "reachable")):
        schema = schemas.output_schema(model)
        items = _items(schema, field)
        assert set(items) == {"type", "description"} and items["type"] == "object"
        assert some in items["description"]
    inbox = schemas.output_schema(InboxOut)["properties"]
    assert inbox["cursor"]["type"] == "integer" and inbox["nextSince"]["type"] == ["integer", "null"]


def test_generate_refuses_two_models_of_one_name() -> None:
    """Schemas are stored by model name, so two different models of one name are an error."""
    other = type("InboxOut", (schemas.Camel,), {"__annotations__": {"x": int}})
    try:
        published.generate([(schemas.NoArgs, InboxOut), (schemas.NoArgs, other)])
    except ValueError as exc:
        assert "InboxOut" in str(exc)
    else:
        raise AssertionError("two models named InboxOut were accepted")
