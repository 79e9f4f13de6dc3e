"""Errors of the ingress in OpenAI's shape, and the bounded body reader (docs/design.md "Serve
runtime").

Every error answers ``{"error": {"message", "type", "param", "code"}}`` with ``param`` naming the
offending field (``"bid"``, ``"messages[0].content"``, ``"x-bid"``, ``"authorization"``), so the
official clients raise their usual exception classes (401 AuthenticationError, 400
BadRequestError, 404 NotFoundError, 402/413 APIStatusError, 503 InternalServerError).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from auction import MAX_BID
from cluster.serve.path_types import PathError

__all__ = [
    "ApiError",
    "as_api_error",
    "error_body",
    "header_bid",
    "install_handlers",
    "param_of",
    "parse_json_object",
    "read_body",
    "unauthorized",
    "validation_error",
]

log = logging.getLogger(__name__)

# OpenAI's ``type`` per status; 402 and 413 have no OpenAI counterpart, so they say what happened.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "payment_required",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "request_timeout",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An HTTP error to answer in OpenAI's shape; raised anywhere in a handler."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})  # e.g. a 429's Retry-After

    def body(self) -> dict[str, object]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(
            self.body(), status_code=self.status, headers={**self.headers, **(headers or {})}
        )


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """OpenAI's error object. ``type`` follows the status; ``code`` is a short machine name."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def param_of(loc: tuple[int | str, ...], data: object) -> str:
    """The field path of a pydantic error location, as ``messages[0].content``.

    Locations of union members carry the member's name (``("prompt", "list[int]", 1)``); such
    segments are recognised by walking the input alongside: a string is a key only where the
    input is a mapping, an integer an index only where it is a list."""
    out = ""
    node: object = data
    for seg in loc:
        if isinstance(seg, int) and isinstance(node, list):
            out += f"[{seg}]"
            node = node[seg] if 0 <= seg < len(node) else None
        elif isinstance(seg, str) and (isinstance(node, Mapping) or node is None):
            out += f".{seg}" if out else seg
            node = node.get(seg) if isinstance(node, Mapping) else None
        # else: a union member's name (or a body/query prefix): not part of the field path
    return out


def validation_error(exc: ValidationError | RequestValidationError, data: object) -> ApiError:
    """One 400 for a failed validation: ``param`` names the first bad field (FastAPI's own 422s
    come here too); the message lists every failure (``field: reason``), each once."""
    lines: list[str] = []
    params: list[str] = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if isinstance(exc, RequestValidationError) and loc and loc[0] in ("body", "query"):
            loc = loc[1:]  # FastAPI prefixes where the value came from
        param = param_of(loc, data)
        params.append(param)
        line = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
        if line not in lines:
            lines.append(line)
    # A union reports one error per member; the deepest one under the first bad field is the
    # member the input meant (["a", 1] for str | list[int] fails at prompt[0], not at prompt).
    top = _field(params[0]) if params else ""
    same = [p for p in params if _field(p) == top]
    deepest = max(same, key=lambda p: p.count(".") + p.count("[")) if top else None
    return ApiError(400, "; ".join(lines) or "invalid request", param=deepest, code="invalid_value")


def _field(param: str) -> str:
    return param.split(".")[0].split("[")[0]


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The request body, refusing (413) more than ``max_bytes`` before reading it when
    Content-Length says so, and while reading it otherwise (chunked bodies, or a lying
    Content-Length): at most ``max_bytes`` plus one network chunk are ever held. A body not
    in within ``timeout_s`` is a 408 (a client that trickles it holds nothing for longer)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(request, max_bytes)
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {timeout_s:g} s", code="body_timeout"
        ) from None


async def _read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "Content-Length is not a number", param="content-length")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        parts.append(chunk)
    return b"".join(parts)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"request body is larger than {max_bytes} bytes", code="body_too_large")


def parse_json_object(body: bytes) -> dict[str, object]:
    """The body as a JSON object (400 otherwise). ``NaN``/``Infinity`` literals parse as floats
    here and are refused by the models' finiteness check, naming the field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", code="invalid_json")
    return data


def header_bid(raw: str | None) -> float:
    """The ``x-bid`` header as a bid (0 when absent): a finite number in [0, MAX_BID]."""
    if raw is None:
        return 0.0
    try:
        bid = float(raw.strip())
    except ValueError:
        raise ApiError(
            400, f"x-bid must be a number, got {raw[:40]!r}", param="x-bid", code="invalid_value"
        ) from None
    if not (math.isfinite(bid) and 0.0 <= bid <= MAX_BID):
        raise ApiError(
            400,
            f"x-bid must be finite and in [0, {MAX_BID:g}], got {raw[:40]!r}",
            param="x-bid",
            code="invalid_value",
        )
    return bid


def unauthorized(message: str, code: str) -> ApiError:
    return ApiError(401, message, param="authorization", code=code)


def rate_limited(identity: str, reason: str, retry_after_s: int) -> ApiError:
    """OpenAI's 429 (``rate_limit_exceeded``), with the seconds to wait in ``Retry-After``."""
    return ApiError(429, f"rate limit for {identity!r}: {reason}", code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry_after_s)})  # fmt: skip


def as_api_error(e: Exception) -> ApiError:
    """What to answer for a failure: ours as is, the path's with its status, anything else
    (a bug in the path or here) as a 500 without details, logged."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, PathError):
        status = e.status if 400 <= e.status <= 599 else 500
        code = e.code or {401: "invalid_api_key", 402: "budget_exceeded",
                          503: "unavailable"}.get(status)  # fmt: skip
        param = {401: "authorization", 402: "bid"}.get(status)
        return ApiError(status, e.message, param=param, code=code)
    log.error("request failed", exc_info=e)
    return ApiError(500, "internal error", code="internal_error")


def install_handlers(app: FastAPI) -> None:
    """Answer every error in OpenAI's shape: ours, FastAPI's 422 (as 400), Starlette's 404/405,
    and anything unexpected (500, without internals)."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error(exc, None).response()

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = ApiError(exc.status_code, str(exc.detail), code=None)
        return err.response(exc.headers)

    async def on_other(_: Request, exc: Exception) -> JSONResponse:
        return ApiError(500, "internal error", code="internal_error").response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_other)
