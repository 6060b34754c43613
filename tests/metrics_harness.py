"""Helpers for tests of ``/metrics``: a scrape read into samples, and a log captured as JSON lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from haltwire import logs
from haltwire.control import AdminOnly, create_app, parse_control_config
from haltwire.serve import serving

#: A sample: its name and its labels, sorted.
Key = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Key, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(url: str, headers: dict[str, str] | None = None) -> dict[Key, float]:
    """``GET url`` (a ``/metrics``), parsed; fails unless it answers 200 in the text format."""
    async with httpx2.AsyncClient(timeout=10) as http:
        r = await http.get(url, headers=headers or {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0 when absent (a counter not yet moved)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def series(samples: dict[Key, float], name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples if n == name]


@contextmanager
def json_log(level: str = "info") -> Iterator[io.StringIO]:
    """The root logger as ``haltwire --log-format json`` sets it up, into a buffer; restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buffer = io.StringIO()
    logs.configure("json", level, buffer)
    try:
        yield buffer
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    """Every line as JSON (a line that does not parse fails the test)."""
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line]


@asynccontextmanager
async def control_with_admin(data: dict[str, Any]) -> AsyncIterator[tuple[str, str]]:
    """A control plane (config ``data``) on an agents' listener and an admin listener, in one
    process: yields (agents' URL, admin URL)."""
    app = create_app(parse_control_config(data))
    async with serving(app) as agents, serving(AdminOnly(app), lifespan="off") as admin:
        yield agents, admin
