"""The tools' published JSON schemas, computed once at build time and read from a file at start.

Building an input or output schema from its pydantic model costs milliseconds per tool, and
every ``peerd mcp`` paid it at start for some thirty models. ``tool_schemas.json`` (beside
this module) holds them all; it is written by ``python -m mcp_server.published``.

Invariants:
* The file equals what ``generate()`` computes from the models (a test checks it), so the
  published schemas are exactly ``schemas.input_schema`` / ``schemas.output_schema``.
* A model the file does not name (an embedder's own tool) gets its schema computed, as before.
* Schemas are looked up by model name; the dicts handed out are the file's own: callers must
  not change them (the SDK only serialises them).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mcp_server import schemas

SCHEMA_FILE = Path(__file__).with_name("tool_schemas.json")
Schemas = dict[str, dict[str, dict[str, Any]]]


def tool_models() -> list[tuple[type[BaseModel], type[BaseModel]]]:
    """(arguments, result) of every tool a server may list, the push-only one included."""
    from mcp_server.channel import ReplayArgs, ReplayOut  # noqa: PLC0415 - only generating needs them
    from mcp_server.tools import TOOLS  # noqa: PLC0415

    return [(spec.args, spec.out) for spec in TOOLS if spec.out is not None] + [(ReplayArgs, ReplayOut)]


def generate(models: Iterable[tuple[type[BaseModel], type[BaseModel]]]) -> Schemas:
    """Each model's published schema, by kind (``input`` / ``output``) and model name."""
    out: Schemas = {"input": {}, "output": {}}
    seen: dict[str, type[BaseModel]] = {}
    for kind, model in ((k, m) for pair in models for k, m in zip(("input", "output"), pair, strict=True)):
        if seen.setdefault(model.__name__, model) is not model:
            raise ValueError(f"two models are called {model.__name__}: schemas are stored by name")
        make = schemas.input_schema if kind == "input" else schemas.output_schema
        out[kind][model.__name__] = make(model)
    return out


@functools.cache
def stored() -> Schemas:
    """The schemas of ``SCHEMA_FILE`` (empty if it is missing)."""
    try:
        data: Schemas = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"input": {}, "output": {}}
    return data


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    found = stored()["input"].get(model.__name__)
    return found if found is not None else schemas.input_schema(model)


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    found = stored()["output"].get(model.__name__)
    return found if found is not None else schemas.output_schema(model)


def render(data: Schemas) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    SCHEMA_FILE.write_text(render(generate(tool_models())), encoding="utf-8")
    print(f"wrote {SCHEMA_FILE.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
