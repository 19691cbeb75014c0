"""What a route reads from its app, typed: the services the lifespan builds.

The lifespan (``app.main``) stores a ``Services`` on ``app.state``; a route asks for it
with ``services(request)`` rather than reading the untyped ``request.app.state``.  The
service classes are named for the type checker only, so this module imports none of them
(nor anything of the app) at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

if TYPE_CHECKING:
    from app.activation import Activation
    from app.api.limits import KeyLimits
    from app.browser import BrowserService
    from app.db import Database
    from app.db.listen import Notifier
    from app.explain import ExplainService
    from app.jobs import JobService
    from app.keys import KeyService
    from app.metrics.events import Metrics
    from app.metrics.scrape import Scrape
    from app.operators import ConfigService, HealthService, SearchService
    from app.stats import StatsService
    from app.sweepers import Background
    from app.workers import WorkerSightings


@dataclass
class Services:
    db: Database
    activation: Activation
    jobs: JobService
    config: ConfigService
    stats: StatsService
    search: SearchService
    browser: BrowserService
    explain: ExplainService
    workers: WorkerSightings
    health: HealthService
    background: Background
    notifier: Notifier
    keys: KeyService
    limits: KeyLimits
    metrics: Metrics
    scrape: Scrape


def services(request: Request) -> Services:
    """The services of the app serving ``request`` (set while its lifespan runs)."""
    found: Services = request.app.state.services
    return found
