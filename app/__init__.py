"""Jobfair: a job-activation service with fair scheduling between tenants."""

__version__ = "0.1.0"
