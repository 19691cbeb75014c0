"""The cheapest possible apps with Jobfair's complete route: no database, no work.

``python -m bench.run ceiling`` serves them with the same uvicorn as Jobfair to measure
what this machine can answer at all, so the drain figures can be read against that
ceiling: ``app`` is an empty FastAPI route, ``bare`` the same answer as plain ASGI.
"""

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

app = FastAPI()


@app.post("/v2/jobs/{key}/complete", status_code=204)
async def complete(request: Request, key: str) -> Response:
    await request.body()
    return Response(status_code=204)


async def bare(scope: Scope, receive: Receive, send: Send) -> None:
    """204 to every POST after reading its body; 200 to a GET (the harness's ready check)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    status = 200 if scope["method"] == "GET" else 204
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})
