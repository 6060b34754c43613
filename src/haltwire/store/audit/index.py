"""The audit log's index by subject: which records name a run, an intent or a stop in their detail.

A run's report reads only the records about the run, its intents and the stops that hit it
(``haltwire.control.reports``). A record's ``target`` is already indexed (``audit_by_target``);
what its detail names (``run_id``, ``stop_id``, the lists ``runs`` and ``intents``) is kept
here, one row per name, written in the record's own transaction. The index is derived: the hash
chain does not cover it, and a report filters what it finds by the records themselves.

A database made before the index has records it does not cover: ``audit_indexed`` holds the
last such seq (set once, as the tables are opened), and ``backfill`` indexes them and sets it
to 0, in one transaction, the first time a control plane opens the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from haltwire.store.audit import COLUMNS

#: Detail keys naming one subject, and those listing several.
ONE: Final = ("run_id", "stop_id")
MANY: Final = ("runs", "intents")

DDL: Final = (
    """CREATE TABLE IF NOT EXISTS {audit_subjects} (
    subject TEXT NOT NULL,
    seq     BIGINT NOT NULL,
    PRIMARY KEY (subject, seq)
)""",
    # The last seq written before the index existed (0 once backfilled): one row, set once.
    "CREATE TABLE IF NOT EXISTS {audit_indexed} (legacy_upto BIGINT NOT NULL)",
    "INSERT INTO {audit_indexed} (legacy_upto) SELECT COALESCE(MAX(seq), 0) FROM {audit} "
    "WHERE NOT EXISTS (SELECT 1 FROM {audit_indexed})",
)

QUERIES: Final = {
    "insert": "INSERT INTO {audit_subjects} (subject, seq) VALUES (?, ?) ON CONFLICT DO NOTHING",
    "legacy": "SELECT legacy_upto FROM {audit_indexed}",
    "indexed": "UPDATE {audit_indexed} SET legacy_upto = 0",
    "legacy_records": f"SELECT {', '.join(COLUMNS)} FROM {{audit}} WHERE seq <= ? ORDER BY seq",
}


def subjects(target: str, detail: Mapping[str, Any]) -> set[str]:
    """What a record's detail names, besides its target (indexed on its own)."""
    out = {v for key in ONE if isinstance(v := detail.get(key), str)}
    for key in MANY:
        value = detail.get(key)
        if isinstance(value, list):
            out |= {v for v in value if isinstance(v, str)}
    out.discard(target)
    return out


def about_query(count: int) -> str:
    """The records whose target or an indexed subject is one of ``count`` names, in seq order
    (tables unbound; the names are bound twice: for the target, then for the index). A UNION,
    not an OR: PostgreSQL scans the whole log for ``target IN (...) OR seq IN (...)``."""
    marks = ", ".join("?" for _ in range(count))
    select = f"SELECT {', '.join(COLUMNS)} FROM {{audit}}"
    return (
        f"{select} WHERE target IN ({marks}) UNION {select} WHERE seq IN "
        f"(SELECT seq FROM {{audit_subjects}} WHERE subject IN ({marks})) ORDER BY seq"
    )


def rows(seq: int, target: str, detail: Mapping[str, Any]) -> Iterable[tuple[str, int]]:
    """The index rows of one record."""
    return ((subject, seq) for subject in sorted(subjects(target, detail)))
