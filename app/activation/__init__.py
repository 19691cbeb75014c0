"""Activation: how a worker's ask becomes jobs.  ``Activation`` (app.activation.service)
is the one door; ``ActivateRequest`` and ``Caller`` (app.activation.ports) what comes in
through it."""

from app.activation.ports import ActivateRequest, Caller
from app.activation.service import Activated, Activation, Anonymous
from app.activation.streaming import keep_alive_factory

__all__ = [
    "ActivateRequest",
    "Activated",
    "Activation",
    "Anonymous",
    "Caller",
    "keep_alive_factory",
]
