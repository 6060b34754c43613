"""StopSet: active stops from the registry's changes, the broadest match, expiry, and fences."""

from __future__ import annotations

from dataclasses import replace

from haltwire.scope import Scope
from haltwire.stops import StopRecord, StopSet


def stop(stop_id: str, scope: str, revision: int, expires_at: float | None = None) -> StopRecord:
    return StopRecord(stop_id, scope, "why", "op", 0.0, expires_at, revision)


def scopes(*texts: str) -> frozenset[Scope]:
    return frozenset(Scope.parse(t) for t in texts)


RUN = scopes("run:r1", "agent:a", "tenant:t", "version:a@1", "global")


def test_match_clear_and_the_broadest_stop_is_named() -> None:
    s = StopSet()
    s.apply("stop", stop("s1", "run:r1", 1), 1)
    s.apply("stop", stop("s2", "tenant:t", 2), 2)
    hit = s.match(RUN, now=10)
    assert hit is not None and (str(hit[0]), hit[1].stop_id) == ("tenant:t", "s2")
    s.apply("clear", replace(stop("s2", "tenant:t", 2), cleared_revision=3), 3)
    hit = s.match(RUN, now=10)
    assert hit is not None and hit[1].stop_id == "s1"
    assert s.match(scopes("run:r2", "agent:b"), now=10) is None
    assert s.revision == 3


def test_two_stops_on_one_scope_need_two_clears() -> None:
    s = StopSet()
    s.apply("stop", stop("s1", "agent:a", 1), 1)
    s.apply("stop", stop("s2", "agent:a", 2), 2)
    s.apply("clear", replace(stop("s1", "agent:a", 1), cleared_revision=3), 3)
    hit = s.match(RUN, now=0)
    assert hit is not None and hit[1].stop_id == "s2"
    s.apply("clear", replace(stop("s2", "agent:a", 2), cleared_revision=4), 4)
    assert s.match(RUN, now=0) is None and len(s) == 0


def test_an_expired_stop_no_longer_matches() -> None:
    s = StopSet()
    s.apply("stop", stop("s1", "global", 1, expires_at=100.0), 1)
    assert s.match(RUN, now=99.9) is not None
    assert s.match(RUN, now=100.0) is None and len(s) == 0


def test_the_fence_outlives_the_clear_and_ignores_other_scopes() -> None:
    s = StopSet()
    assert s.fence(RUN) == 0
    s.apply("stop", stop("s1", "run:r1", 4), 4)
    s.apply("stop", stop("s2", "run:r9", 5), 5)
    s.apply("clear", replace(stop("s1", "run:r1", 4), cleared_revision=6), 6)
    assert s.match(RUN, now=0) is None
    assert s.fence(RUN) == 4  # a lease granted before revision 4 stays fenced off
    assert s.fence(scopes("run:r2", "agent:b")) == 0
