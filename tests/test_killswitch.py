"""The kill-switch file: cheap re-reads, and the last good list kept through bad writes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from haltwire.gateway.killswitch import SuspensionFile, write_suspensions


def test_missing_file_suspends_nobody(tmp_path: Path) -> None:
    switch = SuspensionFile(tmp_path / "none.json")
    assert switch.suspended() == frozenset()
    assert SuspensionFile(None).is_suspended("ops-bot") is False


def test_changes_are_seen_on_the_next_check(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    switch = SuspensionFile(path)
    write_suspensions(path, ["ops-bot"])
    assert switch.is_suspended("ops-bot")
    path.write_text('{"suspended": ["billing-bot", "ops-bot"]}')  # in place, not renamed
    assert switch.suspended() == {"billing-bot", "ops-bot"}
    write_suspensions(path, [])
    assert not switch.is_suspended("ops-bot")


@pytest.mark.parametrize(
    "bad",
    ['{"suspended": ["billing', "", "[]", '{"suspended": "ops-bot"}', '{"suspended": [1, 2]}', "\xff\xfe"],
)
def test_a_bad_file_keeps_the_last_good_list_and_logs_it(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.json"
    write_suspensions(path, ["ops-bot"])
    switch = SuspensionFile(path)
    assert switch.suspended() == {"ops-bot"}
    path.write_bytes(bad.encode("latin-1"))
    with caplog.at_level(logging.ERROR, logger="haltwire.killswitch"):
        assert switch.suspended() == {"ops-bot"}
    assert "keeping the last good list" in caplog.text
    write_suspensions(path, ["billing-bot"])  # a good write after a bad one is taken
    assert switch.suspended() == {"billing-bot"}


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.json"
    write_suspensions(path, ["ops-bot"])
    switch = SuspensionFile(path)
    assert switch.is_suspended("ops-bot")
    reads: list[str] = []
    real_open = open

    def counting_open(file: str, *args: object, **kwargs: object) -> object:
        reads.append(os.fspath(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", counting_open)
    for _ in range(100):
        assert switch.is_suspended("ops-bot")
    assert reads == []
