"""Several replica URLs for one control plane: the config, and the order a client tries them in."""

from __future__ import annotations

import pytest

from haltwire.config import ConfigError, ControlLink, validate_config
from haltwire.replicas import Replicas


def link(**fields: object) -> ControlLink:
    return validate_config(ControlLink, {"token": "t", **fields}, "gateway.toml")


def test_one_url_or_a_list_of_replicas() -> None:
    assert link(url="http://a:1/").urls == ("http://a:1/",)
    both = link(url=["http://a:1", "http://b:1"], staleness_s=8)
    assert both.urls == ("http://a:1", "http://b:1")
    assert both.silence_s == 4, "several replicas: a silent one is left at half the staleness bound"
    assert link(url="http://a:1", staleness_s=8).silence_s == 8, "one: nowhere else to go"
    assert link(url=["http://a:1", "http://b:1"], staleness_s=8, failover_s=2).silence_s == 2


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"url": []}, "non-empty list"),
        ({"url": ["http://a:1", " "]}, "non-empty list"),
        ({"url": ["http://a:1", "http://a:1"]}, "unique"),
        ({"url": ["http://a:1", "http://b:1"], "staleness_s": 4, "failover_s": 4}, "below staleness_s"),
    ],
)
def test_bad_replica_lists_are_refused_naming_the_problem(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        link(**fields)


def test_a_failed_replica_is_left_for_the_next_round_and_round() -> None:
    replicas = Replicas(["http://a/", "http://b", "http://c"])
    assert replicas.round() == ["http://a", "http://b", "http://c"]
    replicas.failed("http://a")
    assert replicas.current == "http://b"
    replicas.failed("http://a")  # a late failure of one already left moves nothing
    assert replicas.current == "http://b"
    replicas.failed("http://b")
    replicas.failed("http://c")
    assert replicas.current == "http://a" and replicas.round() == ["http://a", "http://b", "http://c"]
    with pytest.raises(ValueError):
        Replicas([])
