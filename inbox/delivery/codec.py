"""Bodies on the wire: how an edge decodes a delivery (the outbox and the publisher encode
them, ``inbox.outbox._arguments``).

Only JSON and text are ever decoded. Any other content type (pickle and YAML included) is
handed to handlers as the raw bytes, so a producer can never make the worker run a
deserializer that executes code.
"""

from __future__ import annotations

import json
from typing import Final

from inbox.errors import UndecodableBody

__all__ = ["BINARY", "JSON", "UndecodableBody", "decode_body"]

JSON: Final = "application/json"
"""The content type of a JSON body."""
BINARY: Final = "application/octet-stream"
"""The content type of a body sent as the raw bytes it is."""


def decode_body(
    data: bytes,
    content_type: str | None,
    content_encoding: str | None,
    default_content_type: str | None,
) -> object:
    """Decode a delivery's body: JSON (``application/json``, ``*+json``) to Python values,
    ``text/*`` to ``str``, anything else to the raw ``bytes``.

    A delivery without a content type is read as ``default_content_type`` (None: raw bytes).
    Raises :class:`UndecodableBody` with the reason when the body does not decode.
    """
    declared = content_type or default_content_type
    if not declared:
        return data
    media_type, _, params = declared.partition(";")
    media_type = media_type.strip().lower()
    charset = _charset(params, content_encoding)
    is_json = media_type == JSON or media_type.endswith("+json")
    if not is_json and not media_type.startswith("text/"):
        return data
    try:
        text = data.decode(charset)
    except (LookupError, UnicodeError, ValueError, TypeError) as exc:
        raise UndecodableBody(f"body is not valid {charset} text: {exc}") from exc
    if not is_json:
        return text
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise UndecodableBody("JSON body is nested too deeply to decode") from exc
    except ValueError as exc:
        assumed = "" if content_type else " (no content type; JSON assumed)"
        raise UndecodableBody(f"body is not valid JSON{assumed}: {exc}") from exc


def _charset(params: str, content_encoding: str | None) -> str:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    if content_encoding and content_encoding.lower() not in ("binary", "8bit", "7bit"):
        return content_encoding
    return "utf-8"
