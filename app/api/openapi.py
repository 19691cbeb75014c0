"""The OpenAPI description of API.md, built from the route table and the request models
the routes validate with.

The routes read their bodies themselves (``parsing.body``) so that every error is
problem+json, which leaves FastAPI's generated description without bodies or errors.
Each operation of ``app.api.routes.OPERATIONS`` states what it takes and answers; this
module turns that into the document.  ``tests/unit/test_openapi.py`` fails when
``clients/openapi.json`` is stale.  Regenerate with ``make openapi``
(``python -m app.api.openapi > clients/openapi.json``).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter

from app import __version__
from app.api import answers, schemas
from app.api.operation import TypedDictBody
from app.api.routes import OPERATIONS
from app.api.security import Permission
from app.keys import KEY_ID_RE

PATH_PARAMS = {
    "jobKey": {
        "type": "string",
        "pattern": schemas.JOB_KEY_PATTERN,
        "description": "int64, decimal",
    },
    "tenantId": {"type": "string", "pattern": schemas.TENANT_ID_PATTERN},
    "fairnessKey": {"type": "string", "pattern": schemas.FAIRNESS_KEY_PATTERN},
    "type": {"type": "string", "pattern": schemas.JOB_TYPE_PATTERN},
    "keyId": {"type": "string", "pattern": KEY_ID_RE.pattern},
}
ERROR_TEXT = {
    400: "Invalid input, naming the field (nothing was changed)",
    401: "No API key, or one that is unknown, revoked or expired (WWW-Authenticate)",
    403: "The key's role may not do this, or it names a tenant or job type outside the key's scope",
    404: "No such job, tenant or job type",
    409: "Stale activationCount or lease token, or the wrong state; on a create, an "
    "idempotencyKey taken by a job the key may not see",
    413: "The body is larger than the server's limit (16 MiB by default)",
    415: "The body is not application/json",
    429: "The key is over its request rate, or holds its most long polls and streams (Retry-After)",
    503: "urn:jobfair:resource-exhausted (back pressure, or the database unavailable): "
    "nothing was changed, retry after Retry-After seconds.  urn:jobfair:outcome-unknown "
    "(no Retry-After): the database went away while the call's changes were being "
    "committed, which may or may not have happened; send it again only if doing it twice "
    "is harmless (an idempotencyKey, an activationCount), else read first",
}
# What a free-form value (variables, customHeaders, result) may hold: what PostgreSQL's
# jsonb and the server's JSON writer keep as sent.  The server refuses an integer written
# as one (no fraction, no exponent) beyond 64 bits, and takes any finite double (1e300,
# which is integral too): a schema sees values, not spellings, so it cannot say which
# integral numbers beyond 64 bits are refused, and says "number" for all of them.
JSON_VALUE: dict[str, Any] = {
    "description": "Any JSON value, except: a string or key containing NUL (U+0000), an "
    "integer written as one beyond 64 bits (-2^63 to 2^64-1), NaN or Infinity.",
    "anyOf": [
        {"type": "string", "pattern": schemas.NO_NUL},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": schemas.JSON_VALUE_REF},
        {
            "type": "object",
            "propertyNames": {"pattern": schemas.NO_NUL},
            "additionalProperties": schemas.JSON_VALUE_REF,
        },
    ],
}


# Operations that need no key (with auth off, none does: API.md "Security").
OPEN = (Permission.PUBLIC,)
KEYED: list[dict[str, list[str]]] = [{"bearer": []}, {"basic": []}, {"oauth": []}]


@functools.cache
def build() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document: built on first request (not at start-up), once."""
    components: dict[str, Any] = {}

    def ref(model: type[BaseModel] | type[TypedDictBody]) -> dict[str, Any]:
        # A TypeAdapter describes models and the TypedDict bodies alike.
        schema = TypeAdapter(model).json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, _json_values(sub))
        components[model.__name__] = _json_values(schema)
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    problem = ref(answers.Problem)
    components["JsonValue"] = _json_values(JSON_VALUE)
    paths: dict[str, Any] = {}
    for op in (o for o in OPERATIONS if o.documented):
        params = [
            {"name": name, "in": "path", "required": True, "schema": PATH_PARAMS[name]}
            for name in PATH_PARAMS
            if "{" + name + "}" in op.path
        ] + [
            {"name": name, "in": "query", "required": required, "schema": schema}
            for name, schema, required in op.query
        ]
        responses: dict[str, Any] = {}
        if op.answer is None:
            responses[str(op.status)] = {"description": "Done"}
        else:
            schema = op.answer if isinstance(op.answer, dict) else ref(op.answer)
            responses[str(op.status)] = {
                "description": "OK",
                "content": {op.media: {"schema": schema}},
            }
        if op.links:
            responses[str(op.status)]["links"] = {
                name: {
                    "operationId": target,
                    "parameters": parameters,
                    **({"requestBody": body} if body is not None else {}),
                }
                for name, (target, parameters, body) in op.links.items()
            }
        for status, text in op.also.items():
            responses[str(status)] = {**responses[str(op.status)], "description": text}
        # Every body is read by parsing.body: over the limit, or not JSON, it is refused.
        body_errors = (413, 415) if op.body is not None else ()
        # Every operation that needs a key: none (or a bad one), not its right, its rate.
        key_errors = () if op.permission in OPEN else (401, 403, 429)
        # Every call that reaches the database answers 503 while it is unavailable.
        unavailable = (503,) if op.path != "/healthz" else ()
        for status in dict.fromkeys((*op.errors, *key_errors, *body_errors, *unavailable)):
            error: dict[str, Any] = {
                "description": ERROR_TEXT[status],
                "content": {"application/problem+json": {"schema": problem}},
            }
            if status in (429, 503):
                error["headers"] = {
                    "Retry-After": {
                        "description": "seconds; absent for urn:jobfair:outcome-unknown",
                        "schema": {"type": "integer"},
                    }
                }
            responses[str(status)] = error
        operation: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
            "responses": responses,
        }
        if op.notes:
            operation["description"] = op.notes
        if params:
            operation["parameters"] = params
        if op.body is not None:
            operation["requestBody"] = {
                "required": not op.body_optional,
                "content": {op.body_media: {"schema": ref(op.body)}},
            }
        operation["security"] = [{}] if op.permission in OPEN else KEYED
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Jobfair",
            "version": __version__,
            "description": "Fair job activation for multi-tenant back ends. The wire "
            "contract is API.md; every error is application/problem+json. While the "
            "database is unavailable every call answers 503 urn:jobfair:resource-exhausted "
            "with Retry-After (safe to retry); a call whose commit went unanswered answers "
            "503 urn:jobfair:outcome-unknown without Retry-After (retry only if idempotent).",
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key's secret (jf_<keyId>_...), or an access "
                    "token of /oauth/token",
                },
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "user: the key id; password: the key's secret",
                },
                "oauth": {
                    "type": "oauth2",
                    "flows": {"clientCredentials": {"tokenUrl": "/oauth/token", "scopes": {}}},
                },
            },
        },
    }


def _json_values(schema: Any) -> Any:
    """``schema`` with every ``schemas.JSON_VALUE_REF`` made a reference to JsonValue."""
    if schema == schemas.JSON_VALUE_REF:
        return {"$ref": "#/components/schemas/JsonValue"}
    if isinstance(schema, dict):
        return {k: _json_values(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_json_values(v) for v in schema]
    return schema


def render() -> bytes:
    return orjson.dumps(build(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


if __name__ == "__main__":
    sys.stdout.buffer.write(render())
