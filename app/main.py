"""The application factory and its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import __version__, migrations, telemetry
from app.activation import Activation
from app.admission import Admission
from app.api import openapi, problems
from app.api.context import Services
from app.api.direct import App, DirectRoutes, literal_paths
from app.api.limits import KeyLimits
from app.api.operation import include
from app.api.routes import OPERATIONS
from app.api.security import Gate
from app.browser import BrowserService
from app.config import Settings
from app.db import Database, StoreUnavailable
from app.db.listen import Notifier
from app.domain import utcnow
from app.explain import ExplainService
from app.jobs import JobService
from app.keys import KeyService
from app.metrics import otlp
from app.metrics.events import Metrics, ProcessState
from app.metrics.scrape import Scrape
from app.operators import ConfigService, HealthService, SearchService
from app.stats import StatsService
from app.sweepers import Background
from app.workers import WorkerSightings

log = logging.getLogger(__name__)


def _chain_exit_signals(on_exit: Callable[[], None]) -> None:
    """Run ``on_exit`` when SIGTERM/SIGINT arrive, then whatever handler was installed
    (uvicorn's, which starts its graceful shutdown).  Only the main thread may do this;
    elsewhere (an app served from a thread) shutdown still happens through lifespan."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            on_exit()
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, handler)


def _stop_process(exc: BaseException) -> None:
    # uvicorn turns SIGTERM into a graceful shutdown.
    os.kill(os.getpid(), signal.SIGTERM)


def _process_state(db: Database, activation: Activation, notifier: Notifier) -> ProcessState:
    """What /metrics copies of this process (``Metrics.sync``)."""
    counters = activation.rounds.counters
    waiters, streams = activation.waiters, activation.streams
    return ProcessState(
        activation_queries=counters.queries,
        lead_claims=counters.lead_claims,
        hand_offs=counters.hand_offs,
        wake_queries=waiters.wake_queries,
        wakeups=waiters.wakeups,
        backup_polls=waiters.backup_polls,
        listen_connections=notifier.connections,
        waiters=waiters.waiting,
        streams=len(streams.streams),
        pool_size=db.get_size(),
        pool_idle=db.get_idle_size(),
        pool_max=db.get_max_size(),
        pool_waiting=db.waiting,
        degraded=int(db.claim_hints is not None and db.claim_hints.degraded),
    )


def create_app(settings: Settings, database_url: str, *, background: bool = True) -> FastAPI:
    """Build the app for one database.  ``background=False`` leaves the sweepers to the
    caller (tests drive them through ``run_once``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = await Database.connect(
            database_url,
            size=settings.db_pool_size,
            min_size=settings.db_pool_min_size,
            acquire_timeout_s=settings.db_acquire_timeout_ms / 1000,
            statement_timeout_s=settings.db_statement_timeout_ms / 1000,
            wait_s=settings.db_startup_wait_s,
            history=settings.job_history,
        )
        metrics = Metrics(settings.metrics_top_tenants)
        activation = Activation(db, settings, metrics)
        stats = StatsService(db, top_keys=settings.metrics_top_keys)
        waiters, streams = activation.waiters, activation.streams

        def on_reconnect() -> None:
            waiters.notify_all()

        # LISTEN and the leader lock hold a session each (docs/scaling.md: PgBouncer).
        session_url = settings.database_session_url or database_url
        notifier = Notifier(session_url, waiters.notify, streams.credit, on_reconnect)
        metrics.process_state = functools.partial(_process_state, db, activation, notifier)
        sightings = WorkerSightings(db)
        bg = Background(
            db,
            settings,
            session_url,
            stats,
            _stop_process,
            enabled=background,
            metrics=metrics,
            workers=sightings,
        )
        keys = KeyService(
            db,
            refresh_s=settings.key_refresh_ms / 1000,
            access_token_ttl_s=settings.access_token_ttl_s,
        )
        limits = KeyLimits(
            settings.key_rate_limit, settings.key_rate_burst, settings.max_waiters_per_key
        )
        app.state.services = Services(
            db=db,
            activation=activation,
            jobs=JobService(db, activation),
            config=ConfigService(db, activation.resolve_aging),
            stats=stats,
            search=SearchService(db),
            browser=BrowserService(db, activation.resolve_aging),
            explain=ExplainService(
                db, stats, activation.resolve_aging, waiters.has_waiters, sightings.flush
            ),
            workers=sightings,
            health=HealthService(db),
            background=bg,
            notifier=notifier,
            keys=keys,
            limits=limits,
            metrics=metrics,
            scrape=Scrape(metrics, db, stats, activation.resolve_aging),
        )
        # Metrics over OTLP as well, if asked for: a background task of every process.
        pushing = None
        if background and otlp.wanted(settings.otel_metrics_enabled):
            scrape = app.state.services.scrape
            pushing = otlp.MetricsPush(scrape, bg.is_leader.is_set, settings.otel_service_name)
            bg.process_tasks.append(pushing)
        app.gate = Gate(  # type: ignore[attr-defined]
            off=settings.auth_mode == "off",
            docs_open=settings.docs_open,
            metrics_open=settings.metrics_open,
            keys=keys,
            limits=limits,
        )
        loop = asyncio.get_running_loop()
        shutting_down = asyncio.Event()

        async def begin_shutdown() -> None:
            # Answer waiting long polls now and end streams (releasing what they have not
            # delivered); uvicorn meanwhile lets in-flight finish calls complete.
            if not shutting_down.is_set():
                shutting_down.set()
                await activation.close()

        def on_exit_signal() -> None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(begin_shutdown()))

        _chain_exit_signals(on_exit_signal)
        await notifier.start()
        if bg.labels is not None:
            # Label tenants as the database says from the first request on (the loop
            # reads them again every few seconds, and tries again if this fails).
            with contextlib.suppress(StoreUnavailable):
                await bg.labels.run_once(utcnow())
        await bg.start()
        # Traces, if asked for (and not already on: a test's in-memory exporter).
        traced = not telemetry.enabled() and telemetry.wanted(settings.otel_enabled)
        if traced:
            telemetry.configure(settings.otel_service_name)
        try:
            yield
        finally:
            await begin_shutdown()
            await activation.settle()
            await bg.stop()
            if pushing is not None:  # what this process counted since the last push
                # Not waited for long: a collector that is away must not hold the exit.
                with contextlib.suppress(StoreUnavailable, TimeoutError):
                    await asyncio.wait_for(pushing.run_once(utcnow()), 5)
                await asyncio.to_thread(pushing.shutdown)
            await notifier.stop()
            metrics.labels.close()
            await db.close()
            if traced:  # sends what is left: off the event loop
                await asyncio.to_thread(telemetry.shutdown)

    # FastAPI's own pages (the document, Swagger UI) are operations of the route table too.
    app = App(
        title="Jobfair",
        version=__version__,
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.openapi = openapi.build  # type: ignore[method-assign]
    app.state.settings = settings
    app.state.schema_head = migrations.head_revision()
    problems.install(app)
    app.access_log = settings.access_log
    include(app, OPERATIONS)
    app.direct = DirectRoutes(OPERATIONS)
    app.admission = Admission(settings.max_in_flight)
    app.literal = literal_paths(OPERATIONS)
    return app
