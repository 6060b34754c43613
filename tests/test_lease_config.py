"""Lease configuration: agent-class timing and lease keys are checked at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from haltwire.config import ConfigError, LeaseKeysSection
from haltwire.control import parse_control_config

SECRET = "s" * 32


def control(**extra: Any) -> dict[str, Any]:
    return {"control": {"development": True}, **extra}


@pytest.mark.parametrize(
    ("timing", "problem"),
    [
        ({"ttl_s": 10, "renew_timeout_s": 10, "renew_every_s": 2}, "ttl_s (10) must exceed renew_timeout_s"),
        ({"ttl_s": 15, "renew_timeout_s": 6, "renew_every_s": 5}, "must exceed 1.2 x renew_every_s (6)"),
        ({"ttl_s": 0}, "greater than 0"),
    ],
)
def test_agent_class_timing_is_ordered_like_leader_election(timing: dict[str, float], problem: str) -> None:
    with pytest.raises(ConfigError, match=r"agent_classes\.fast") as exc:
        parse_control_config(control(agent_classes={"default": {}, "fast": timing}))
    assert problem in str(exc.value)


def test_default_agent_class_and_a_valid_fast_one() -> None:
    config = parse_control_config(
        control(agent_classes={"default": {}, "fast": {"ttl_s": 3, "renew_timeout_s": 2, "renew_every_s": 1}})
    )
    assert config.agent_classes["default"].ttl_s == 15
    assert config.agent_classes["fast"].renew_every_s == 1
    with pytest.raises(ConfigError, match="'default' class is needed"):
        parse_control_config(control(agent_classes={"fast": {}}))


def test_lease_keys_need_a_signing_key_and_env_secrets_outside_development() -> None:
    keys = [{"kid": "k1", "secret": SECRET}]
    with pytest.raises(ConfigError, match="name the key"):
        parse_control_config(control(leases={"keys": keys}))
    with pytest.raises(ConfigError, match=r"accepted only with control\.development"):
        parse_control_config({"leases": {"signing_key": "k1", "keys": keys}})
    with pytest.raises(ConfigError, match="not among the keys"):
        parse_control_config(control(leases={"signing_key": "k9", "keys": keys}))
    with pytest.raises(ConfigError, match="exactly one of secret or secret_env"):
        parse_control_config(control(leases={"signing_key": "k1", "keys": [{"kid": "k1"}]}))
    config = parse_control_config(control(leases={"signing_key": "k1", "keys": keys}))
    assert config.leases is not None and config.leases.lease_keys().signing == "k1"


def test_a_missing_or_short_secret_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    section = LeaseKeysSection.model_validate({"keys": [{"kid": "k1", "secret_env": "HW_TEST_LEASE_KEY"}]})
    monkeypatch.delenv("HW_TEST_LEASE_KEY", raising=False)
    with pytest.raises(ConfigError, match="HW_TEST_LEASE_KEY is not set"):
        section.lease_keys()
    monkeypatch.setenv("HW_TEST_LEASE_KEY", "short")
    with pytest.raises(ConfigError, match="needs 32 or more"):
        section.lease_keys()
    monkeypatch.setenv("HW_TEST_LEASE_KEY", SECRET)
    assert section.lease_keys().kids == {"k1"}


def test_haltwire_control_exits_2_when_a_lease_secret_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from haltwire.cli import main

    monkeypatch.delenv("HW_TEST_LEASE_KEY", raising=False)
    path = tmp_path / "control.toml"
    path.write_text(
        '[leases]\nsigning_key = "k1"\n[[leases.keys]]\nkid = "k1"\nsecret_env = "HW_TEST_LEASE_KEY"\n'
    )
    with pytest.raises(SystemExit) as exc:
        main(["control", "--config", str(path)])
    assert exc.value.code == 2
    assert "HW_TEST_LEASE_KEY is not set" in capsys.readouterr().err


def test_a_time_to_stop_shorter_than_one_lease_period_is_a_config_error() -> None:
    # The fail-closed path: a runtime whose control plane is unreachable stops within ttl_s.
    timing = {"ttl_s": 3, "renew_timeout_s": 2, "renew_every_s": 1, "time_to_stop_s": 2.5}
    with pytest.raises(ConfigError, match=r"agent_classes\.fast") as exc:
        parse_control_config(control(agent_classes={"default": {}, "fast": timing}))
    assert "time_to_stop_s (2.5) is shorter than ttl_s (3)" in str(exc.value)
    assert "one lease period" in str(exc.value)


def test_a_time_to_stop_of_at_least_one_lease_period_is_valid() -> None:
    timing = {"ttl_s": 3, "renew_timeout_s": 2, "renew_every_s": 1, "time_to_stop_s": 3}
    config = parse_control_config(control(agent_classes={"default": {}, "fast": timing}))
    assert config.agent_classes["fast"].time_to_stop_s == 3
    assert config.agent_classes["default"].time_to_stop_s is None  # no target unless one is given
