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
    from app.activation import ActivationService
    from app.jobs import JobService
    from app.notifier import Notifier
    from app.operators import ConfigService, StatsService
    from app.store import Store
    from app.streaming import StreamRegistry
    from app.sweepers import Background
    from app.waiting import WaiterHub


@dataclass
class Services:
    store: Store
    activation: ActivationService
    jobs: JobService
    config: ConfigService
    stats: StatsService
    background: Background
    waiters: WaiterHub
    streams: StreamRegistry
    notifier: Notifier


def services(request: Request) -> Services:
    """The services of the app serving ``request`` (set while its lifespan runs)."""
    found: Services = request.app.state.services
    return found
