"""The egress proxy (``haltwire egress``): level 5 of the stop ladder.

A forward/CONNECT proxy that knows each connection's run from its proxy credentials (the lease
token), allows each run the hosts of its agent's egress profile, and closes a run's open
connections when a stop, its lease's expiry or a stale watch switches it to ``none``.
``docs/egress.md`` says how to run it and what it cannot see.

Modules: ``config`` (the TOML schema), ``profiles`` and ``auth`` (rules), ``connections``
(state: the open connections by run), ``proxy`` and ``relay`` (HTTP and bytes), ``server``
(the process).
"""

from haltwire.egress.config import EgressConfig, load_config, parse_config
from haltwire.egress.server import EgressProxy

__all__ = ["EgressConfig", "EgressProxy", "load_config", "parse_config"]
