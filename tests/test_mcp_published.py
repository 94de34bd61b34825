"""The published tool schemas are read from tool_schemas.json, which equals what the models give."""

from __future__ import annotations

from mcp_server import published, schemas
from mcp_server.schemas import InboxOut, MarkedOut, PeersOut, PollOut, SentOut, ThreadOut


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


def test_lists_of_objects_are_shallow_and_name_their_fields() -> None:
    """An inbox's, a thread's and the peers' lists carry no items schema (a client checks the list's
    type, not every item) and name the items' fields in their description; top fields stay typed."""
    for model, field, some in ((InboxOut, "messages", "receiptId"), (PollOut, "messages", "sender_id"),
                               (PeersOut, "items", "reachable")):
        prop = schemas.output_schema(model)["properties"][field]
        assert prop["type"] == "array" and "items" not in prop
        assert "Objects, each with the fields" in prop["description"] and some in prop["description"]
    inbox = schemas.output_schema(InboxOut)["properties"]
    assert inbox["cursor"]["type"] == "integer" and inbox["nextSince"]["type"] == ["integer", "null"]



def test_lists_of_strings_are_shallow_and_say_so() -> None:
    """A send's recipients and known roles, a mark's unknown ids, a thread's participants: no items
    schema (a client would check each item, on every call), the description says they are strings."""
    for model, field in ((SentOut, "recipients"), (SentOut, "unknownRecipients"), (SentOut, "knownRoles"),
                         (MarkedOut, "unknown"), (ThreadOut, "participants")):
        prop = schemas.output_schema(model)["properties"][field]
        assert "items" not in prop and "array" in prop["type"] and prop["description"].endswith("Strings.")
    assert schemas.output_schema(SentOut)["properties"]["knownRoles"]["type"] == ["array", "null"]

def test_generate_refuses_two_models_of_one_name() -> None:
    """Schemas are stored by model name, so two different models of one name are an error."""
    other = type("InboxOut", (schemas.Camel,), {"__annotations__": {"x": int}})
    try:
        published.generate([(schemas.NoArgs, InboxOut), (schemas.NoArgs, other)])
    except ValueError as exc:
        assert "InboxOut" in str(exc)
    else:
        raise AssertionError("two models named InboxOut were accepted")
