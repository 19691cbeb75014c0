"""Jobfair's Python client: produce jobs and run workers over long polling or SSE."""

from jobfair_client.client import AsyncJobfair, Backoff, Jobfair
from jobfair_client.config import JobTypeConfig, KeyConfig, RateLimit, TenantConfig
from jobfair_client.errors import (
    Conflict,
    Forbidden,
    InvalidArgument,
    JobfairError,
    NotFound,
    OutcomeUnknown,
    ProblemError,
    ResourceExhausted,
    StaleActivation,
    Unauthorized,
)
from jobfair_client.models import BusinessError, Job, NewJob
from jobfair_client.worker import AsyncWorker, Worker, WorkerStats

__all__ = [
    "AsyncJobfair",
    "AsyncWorker",
    "Backoff",
    "BusinessError",
    "Conflict",
    "Forbidden",
    "InvalidArgument",
    "Job",
    "JobTypeConfig",
    "Jobfair",
    "JobfairError",
    "KeyConfig",
    "NewJob",
    "NotFound",
    "OutcomeUnknown",
    "ProblemError",
    "RateLimit",
    "ResourceExhausted",
    "StaleActivation",
    "TenantConfig",
    "Unauthorized",
    "Worker",
    "WorkerStats",
]
