"""A multi-host URL is tried host by host (app.db.connect): each host's URL is the
original with that host alone, and ``connect_timeout`` (libpq's name: seconds, per host)
is taken out, as asyncpg would send it to the server as a setting."""

from __future__ import annotations

import pytest

from app.db.connect import CONNECT_TIMEOUT_S, per_host


def test_hosts_in_the_authority_are_tried_one_by_one_with_the_rest_of_the_url():
    url = "postgresql://u:p%40w@db1:5432,db2:5433/jobfair?target_session_attrs=read-write"
    assert per_host(url) == (
        [
            "postgresql://u:p%40w@db1:5432/jobfair?target_session_attrs=read-write",
            "postgresql://u:p%40w@db2:5433/jobfair?target_session_attrs=read-write",
        ],
        CONNECT_TIMEOUT_S,
    )


def test_hosts_in_the_query_are_paired_with_their_ports_or_share_one():
    assert per_host("postgresql://u@/db?host=/run/a,10.0.0.2&port=5432,6432")[0] == [
        "postgresql://u@/db?host=/run/a&port=5432",
        "postgresql://u@/db?host=10.0.0.2&port=6432",
    ]
    assert per_host("postgresql://u@/db?host=a,b&port=5432")[0] == [
        "postgresql://u@/db?host=a&port=5432",
        "postgresql://u@/db?host=b&port=5432",
    ]


def test_ipv6_hosts_keep_their_brackets():
    assert per_host("postgresql://u@[::1]:5432,[fd00::2]/db")[0] == [
        "postgresql://u@[::1]:5432/db",
        "postgresql://u@[fd00::2]/db",
    ]


def test_a_url_of_one_host_is_given_as_it_is():
    url = "postgresql://u@db1/jobfair?sslmode=require&application_name=x"
    assert per_host(url) == ([url], CONNECT_TIMEOUT_S)


def test_connect_timeout_is_the_time_per_host_and_not_sent_on():
    urls, timeout_s = per_host("postgresql://u@db1,db2/j?connect_timeout=2.5&sslmode=disable")
    assert timeout_s == 2.5
    assert urls == ["postgresql://u@db1/j?sslmode=disable", "postgresql://u@db2/j?sslmode=disable"]


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_connect_timeout_that_is_not_a_positive_number_is_refused(value: str):
    with pytest.raises(ValueError):
        per_host(f"postgresql://u@db1/j?connect_timeout={value}")
