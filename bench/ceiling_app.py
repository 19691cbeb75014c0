"""The cheapest possible FastAPI app with Jobfair's complete route: no database, no work.

``python -m bench.run ceiling`` serves it with the same uvicorn as Jobfair to measure what
this machine can answer at all, so the drain figures can be read against that ceiling.
"""

from fastapi import FastAPI, Request
from starlette.responses import Response

app = FastAPI()


@app.post("/v2/jobs/{key}/complete", status_code=204)
async def complete(request: Request, key: str) -> Response:
    await request.body()
    return Response(status_code=204)
