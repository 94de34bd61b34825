"""Arguments of the local JSON API, checked at the boundary: the body, its fields, query parameters.

Invariants:
* A body is UTF-8 JSON holding one object, with no NaN or Infinity, no string
  (key or value) that is not valid Unicode (a lone surrogate such as
  ``"\\ud800"``), no integer outside a signed 64-bit range, and at most
  ``MAX_DEPTH`` levels of nesting; anything else is ``InvalidArgument``.
* A field of the wrong type, or a missing required one, is ``InvalidArgument``
  naming the field as the client spells it; the replica then checks values.
* ``json_endpoint`` answers a ``PeerdError`` with the one table's HTTP status
  (``replica.errors.face``: a bad argument 400, ``NotFound`` 404 ...), as
  ``{"error": message, "code": code}``; any other exception is a bug and is not hidden.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from replica import InvalidArgument, PeerdError
from replica.errors import face

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 32
_INT = re.compile(r"-?[0-9]{1,19}", re.ASCII)


def valid_text(value: str) -> bool:
    """False when ``value`` holds a lone surrogate (it cannot be stored or sent as UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _finite(raw: str) -> float:
    value = float(raw)
    if value in (float("inf"), float("-inf")):
        raise InvalidArgument(f"number {raw[:40]} is too large")
    return value


def _no_constant(name: str) -> Any:
    raise InvalidArgument(f"{name} is not a JSON number")


def _check_tree(data: Any) -> None:
    """Every string valid Unicode, every integer in int64, nesting within MAX_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(data, "body", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidArgument(f"request body nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, str) and not valid_text(value):
            raise InvalidArgument(f"{where} is not valid Unicode (it holds a lone surrogate)")
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise InvalidArgument(f"{where} is out of range (integers are 64-bit)")
        if isinstance(value, dict):
            for key, item in value.items():
                name = key if where == "body" else f"{where}.{key}"
                if not valid_text(key):
                    raise InvalidArgument(f"a field name in {where} is not valid Unicode (it holds a lone surrogate)")
                stack.append((item, name, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (an empty body is ``{}``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("request body is not UTF-8") from None
    try:
        data = json.loads(text or "{}", parse_float=_finite, parse_constant=_no_constant)
    except InvalidArgument:
        raise
    except RecursionError:
        raise InvalidArgument(f"request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        raise InvalidArgument("request body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidArgument("request body must be a JSON object")
    _check_tree(data)
    return data


async def read_json(request: Request) -> dict[str, Any]:
    """The body of ``request`` as a checked JSON object (its size is bounded by the server)."""
    return parse_body(await request.body())


# -- fields of a body -------------------------------------------------------------------------


def req_str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if value is None:
        raise InvalidArgument(f"{key} is required")
    if not isinstance(value, str):
        raise InvalidArgument(f"{key} must be a string")
    return value


def opt_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{key} must be a string")
    return value


def opt_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidArgument(f"{key} must be an integer")
    return value


def opt_bool(data: dict[str, Any], key: str, default: bool = False) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{key} must be true or false")
    return value


def str_list(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{key} must be a list of strings")
    return value


# -- query parameters -------------------------------------------------------------------------


def parse_int(raw: str, name: str) -> int:
    """A query parameter as a 64-bit integer: ASCII digits with an optional minus sign, nothing else."""
    if not _INT.fullmatch(raw) or not INT64_MIN <= int(raw) <= INT64_MAX:
        raise InvalidArgument(f"{name} must be an integer between {INT64_MIN} and {INT64_MAX}, got {raw[:40]!r}")
    return int(raw)


def parse_text(raw: str, name: str) -> str:
    if not valid_text(raw):
        raise InvalidArgument(f"{name} is not valid Unicode (it holds a lone surrogate)")
    return raw


# -- endpoints ---------------------------------------------------------------------------------

Endpoint = Callable[[Request], Awaitable[Any]]


def json_endpoint(fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: its result as JSON; an error as ``{"error", "code"}`` with the one table's HTTP
    status (``replica.errors.FACES``: a bad call 400, an unknown id 404, a store failure 500 ...)."""

    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await fn(request))
        except PeerdError as exc:
            told = face(exc)
            return JSONResponse({"error": str(exc), "code": told.code}, status_code=told.status)

    return endpoint


def route(path: str, fn: Endpoint, methods: list[str]) -> Route:
    return Route(path, json_endpoint(fn), methods=methods)
