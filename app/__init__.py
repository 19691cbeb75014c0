"""Jobfair: a job-activation service with fair scheduling between tenants."""
