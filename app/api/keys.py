"""Key endpoints (API.md "Security"): the admin API over ``app.keys``, and the OAuth 2.0
client-credentials token endpoint Camunda's SDKs sign in with."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import Request
from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema
from starlette.responses import Response

from app.api import context, schemas, security
from app.api.parsing import body, form_body
from app.api.problems import JSON, PROBLEM
from app.errors import InvalidArgument, NotFound, UnsupportedMediaType
from app.keys import KEY_ID_RE, Role, key_id_of, key_record


def _future(v: str) -> str:
    if datetime.fromisoformat(v) <= datetime.now(UTC):
        raise ValueError("expiresAt must lie in the future")
    return v


Instant = Annotated[
    str,
    AfterValidator(schemas.instant("expiresAt")),
    AfterValidator(_future),
    WithJsonSchema(schemas.INSTANT_SCHEMA),
]
KeyName = Annotated[str, StringConstraints(strict=True, max_length=128, pattern=schemas.NO_NUL)]
Everyone = Literal["*"]


class CreateKey(schemas.Strict):
    role: Literal["admin", "producer", "worker"]
    tenants: Everyone | Annotated[list[schemas.TenantId], Field(min_length=1, max_length=1000)]
    types: Everyone | Annotated[list[schemas.JobType], Field(min_length=1, max_length=1000)]
    name: KeyName | None = None
    expiresAt: Instant | None = None


class TokenRequest(schemas.Strict):
    """The token request's form fields (for the document; ``token`` reads the form)."""

    grant_type: Literal["client_credentials"]
    client_id: str | None = Field(None, description="the key id (or send HTTP Basic)")
    client_secret: str | None = Field(None, description="the key's secret")
    audience: str | None = Field(None, description="accepted, ignored")
    scope: str | None = Field(None, description="accepted, ignored")


def admin_scope_check(role: str, tenants: Any, types: Any) -> None:
    """An admin key holds every tenant and type: a scoped one would configure tenants and
    make keys beyond its scope, so it is refused rather than half-enforced."""
    if role == Role.ADMIN and (tenants != "*" or types != "*"):
        raise InvalidArgument(
            "an admin key has every tenant and job type: give tenants and types *"
        )


def _scope(value: Any) -> list[str] | None:
    return None if value == "*" else value


async def create_key(request: Request) -> Response:
    spec = await body(request, CreateKey)
    admin_scope_check(spec.role, spec.tenants, spec.types)
    expires = None if spec.expiresAt is None else datetime.fromisoformat(spec.expiresAt)
    row, token = await context.services(request).keys.create(
        Role(spec.role),
        _scope(spec.tenants),
        _scope(spec.types),
        spec.name,
        expires,
        security.principal(request).key_id,
    )
    return JSON({**key_record(row), "secret": token}, status_code=201)


async def list_keys(request: Request) -> Response:
    rows = await context.services(request).keys.list()
    return JSON({"keys": [key_record(r) for r in rows]})


async def revoke_key(request: Request, key_id: str) -> Response:
    if not KEY_ID_RE.fullmatch(key_id):
        raise InvalidArgument(f"keyId {key_id!r} must match {KEY_ID_RE.pattern}")
    by = security.principal(request).key_id
    if await context.services(request).keys.revoke(key_id, by) is None:
        raise NotFound(f"key {key_id} does not exist")
    return Response(status_code=204)


# -- OAuth 2.0 client credentials (RFC 6749 4.4) ------------------------------------------


def oauth_error(status: int, error: str, description: str, instance: str) -> Response:
    """RFC 6749 5.2's error, as problem+json with its ``error`` members (RFC 9457 allows
    members of one's own): what OAuth clients read, and what every other 4xx here is."""
    title = "UNAUTHENTICATED" if status == 401 else "INVALID_ARGUMENT"
    problem = {
        "type": f"urn:jobfair:oauth:{error}",
        "title": title,
        "status": status,
        "detail": description,
        "instance": instance,
        "error": error,
        "error_description": description,
    }
    headers = {"Cache-Control": "no-store"}
    if status == 401:
        headers["WWW-Authenticate"] = 'Basic realm="jobfair"'
    return Response(orjson.dumps(problem), status, headers=headers, media_type=PROBLEM)


async def token(request: Request) -> Response:
    """Client id = key id, client secret = the key's token; in the form, or as HTTP
    Basic (both are OAuth's "client authentication").  ``audience`` and ``scope`` are
    accepted and change nothing: the token carries the key's own scopes."""
    path = request.url.path
    try:
        form = await form_body(request)
    except (InvalidArgument, UnsupportedMediaType) as exc:
        return oauth_error(exc.status, "invalid_request", exc.detail, path)
    if form.get("grant_type") != "client_credentials":
        return oauth_error(
            400, "unsupported_grant_type", "grant_type must be client_credentials", path
        )
    client_id, client_secret = form.get("client_id"), form.get("client_secret")
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "basic":
        if client_id is not None or client_secret is not None:
            # RFC 6749 2.3: one way of authenticating the client, not two.
            return oauth_error(
                400, "invalid_request", "send the client's credentials as Basic or in the "
                "form, not both", path,
            )  # fmt: skip
        user, password = security.basic_credentials(credentials.strip())
        if user is None:
            return oauth_error(401, "invalid_client", "malformed Basic credentials", path)
        client_id, client_secret = user, password
    if not client_id or not client_secret:
        return oauth_error(400, "invalid_request", "client_id and client_secret are required", path)
    if key_id_of(client_secret) is None:
        return oauth_error(401, "invalid_client", security.BAD_KEY, path)
    keys = context.services(request).keys
    access = await keys.issue_access_token(client_id, client_secret)
    if access is None:
        return oauth_error(401, "invalid_client", security.BAD_KEY, path)
    answer = {"access_token": access, "token_type": "Bearer", "expires_in": keys.access_token_ttl_s}
    return JSON(answer, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})


async def whoami(request: Request) -> Response:
    caller = security.principal(request)
    return JSON(
        {
            "keyId": caller.key_id,
            "role": caller.role.value,
            "tenants": "*" if caller.tenants is None else sorted(caller.tenants),
            "types": "*" if caller.types is None else sorted(caller.types),
            "auth": "off" if caller.key_id is None else "on",
        }
    )
