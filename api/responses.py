"""The error answers routes declare in `responses=`, so /openapi.json documents them as they are."""

from __future__ import annotations

from typing import Any

from api.models import ErrorBody

Responses = dict[int | str, dict[str, Any]]


def _error(why: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": why}


BAD_REQUEST: Responses = {
    400: _error("malformed JSON or a request the supervisor refuses, with the reason"),
    413: _error("the request body is over the size cap"),
    422: _error("wrong field names or types"),
    503: _error("the supervisor could not carry it out, or an internal error (logged)"),
}
INVALID: Responses = {422: BAD_REQUEST[422]}
CONFLICT: Responses = {
    409: _error("conflicts with what is under way; `state` says what"),
    429: _error("the supervisor is busy with the same work; retry later"),
}
SIMPLE_POST: Responses = {
    415: _error("a POST without a JSON body or an Authorization / X-Requested-By header (a web page could send it)")
}
NOT_FOUND: Responses = {404: _error("no such bundle or file")}
NO_RUNG: Responses = {404: _error("no such rung; `rungs` lists the ladder")}
# By reference, not `model`: FastAPI would file a model under the route's own media type (text/html
# for /ui), while this 401 is always the middleware's JSON. The commands' errors put ErrorBody in
# the schema's components.
UNAUTHORIZED: Responses = {
    401: {
        "description": "missing or invalid bearer token",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
}
# An operation open to anyone says so, whatever a global security default would say.
OPEN_OPERATION: dict[str, Any] = {"security": []}
