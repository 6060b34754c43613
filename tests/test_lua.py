"""The Redis Lua scripts ship as package resources and Redis accepts each of them.

A script that fails to compile would only show at its first call in a gateway; here every
script is loaded from the installed package and compiled by the shared Redis (``SCRIPT LOAD``).
"""

from __future__ import annotations

import hashlib

import pytest
import redis

from haltwire.store.lua import lua_script
from redis_process import require_shared_redis

pytestmark = pytest.mark.redis

SCRIPTS = [
    ("haltwire.store.counters", "admit.lua"),
    ("haltwire.store.counters", "release.lua"),
    ("haltwire.store.idempotency", "begin.lua"),
    ("haltwire.store.idempotency", "complete.lua"),
    ("haltwire.store.idempotency", "release.lua"),
]


@pytest.mark.parametrize(("package", "name"), SCRIPTS, ids=[f"{p.rsplit('.', 1)[1]}/{n}" for p, n in SCRIPTS])
def test_each_script_loads_from_the_package_and_redis_compiles_it(package: str, name: str) -> None:
    source = lua_script(package, name)
    assert source.strip()
    client = redis.Redis.from_url(require_shared_redis(), socket_timeout=2, socket_connect_timeout=2)
    try:
        # SCRIPT LOAD compiles without running; its SHA1 is the one EVALSHA will be given.
        assert client.script_load(source) == hashlib.sha1(source.encode()).hexdigest()
    finally:
        client.close()
