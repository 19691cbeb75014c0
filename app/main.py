"""The application factory and its lifespan."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from starlette.responses import Response

from app import migrations
from app.activation import ActivationService
from app.api import jobs as jobs_api
from app.api import operators as operators_api
from app.api import problems
from app.config import Settings
from app.jobs import JobService
from app.operators import ConfigService, StatsService
from app.store import Store
from app.sweepers import Background

log = logging.getLogger(__name__)


@dataclass
class Services:
    store: Store
    activation: ActivationService
    jobs: JobService
    config: ConfigService
    stats: StatsService
    background: Background


def _stop_process(exc: BaseException) -> None:
    # uvicorn turns SIGTERM into a graceful shutdown.
    os.kill(os.getpid(), signal.SIGTERM)


def create_app(settings: Settings, database_url: str, *, background: bool = True) -> FastAPI:
    """Build the app for one database.  ``background=False`` leaves the sweepers to the
    caller (tests drive them through ``run_once``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await Store.connect(database_url, size=settings.db_pool_size)
        activation = ActivationService(store, settings)
        stats = StatsService(store)
        bg = Background(store, settings, database_url, stats, _stop_process, enabled=background)
        app.state.services = Services(
            store=store,
            activation=activation,
            jobs=JobService(store, activation),
            config=ConfigService(store),
            stats=stats,
            background=bg,
        )
        await bg.start()
        try:
            yield
        finally:
            await bg.stop()
            await store.close()

    app = FastAPI(
        title="Jobfair", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None
    )
    app.state.settings = settings
    app.state.schema_head = migrations.head_revision()
    problems.install(app)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return problems.problem(
            500,
            "urn:jobfair:internal",
            "INTERNAL",
            "an unexpected error occurred; it has been logged",
            request.url.path,
        )

    app.include_router(jobs_api.router)
    app.include_router(operators_api.router)
    return app
