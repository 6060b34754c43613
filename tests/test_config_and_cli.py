"""Bad input gets a clear error and never a crash: config problems, upstreams that do not start, the CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli_process import run_haltwire
from haltwire.config import ConfigError
from haltwire.gateway.config import load_config, parse_config
from haltwire.identity import token_sha256

GOOD = """
[gateway]
development = true

[limits]
budget = 20
max_in_flight = 2

[[identities]]
agent = "ops-bot"
token = "tok-ops"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:9/mcp"
"""


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_haltwire(*args, timeout=timeout)


def test_a_good_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert config.limits.budget == 20
    identity = config.token_table().resolve("tok-ops")
    assert identity is not None and identity.agent == "ops-bot"
    assert config.token_table().resolve("tok-other") is None


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        (GOOD.replace("budget = 20", 'budget = "lots"'), "limits.budget", "valid integer"),
        (GOOD.replace("budget = 20", "budget = -1"), "limits.budget", "greater than or equal to 0"),
        (GOOD.replace("max_in_flight = 2", "max_inflight = 2"), "limits.max_inflight", "Extra inputs"),
        (GOOD.replace('token = "tok-ops"', ""), "identities[0]", "exactly one of token_sha256 or token"),
        (GOOD.replace('url = "http://127.0.0.1:9/mcp"', ""), "upstreams[0]", "exactly one of url"),
        (GOOD.replace("development = true", "development = false"), "(top level)", "plain 'token'"),
        (GOOD.replace('token = "tok-ops"', 'token_sha256 = "abc"'), "identities[0].token_sha256", "64"),
        (GOOD + '\n[counters]\nbackend = "memcached"\n', "counters.backend", "'memory' or 'redis'"),
    ],
)
def test_a_bad_config_names_the_file_the_key_and_the_problem(
    tmp_path: Path, toml: str, key: str, problem: str
) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {key}: "), message
    assert problem in message


def test_invalid_toml_and_a_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[gateway\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read the file"):
        load_config(tmp_path / "missing.toml")


def test_slot_ttl_must_outlast_the_longest_deadline() -> None:
    data = {
        "counters": {"backend": "redis", "slot_ttl_s": 60},
        "limits": {"tools": {"export": {"deadline_s": 120}}},
        "upstreams": [{"name": "u", "url": "http://127.0.0.1:9/mcp"}],
    }
    with pytest.raises(ConfigError, match=r"slot_ttl_s \(60\) must exceed the longest deadline \(120 s\)"):
        parse_config(data, "x.toml")


def test_hashed_tokens_resolve_without_the_plain_token_in_the_config() -> None:
    data = {
        "identities": [{"agent": "ops-bot", "token_sha256": token_sha256("s3cret")}],
        "upstreams": [{"name": "u", "url": "http://127.0.0.1:9/mcp"}],
    }
    table = parse_config(data).token_table()
    resolved = table.resolve("s3cret")
    assert resolved is not None and resolved.agent == "ops-bot"


def test_cli_exits_2_on_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(GOOD.replace("budget = 20", 'budget = "lots"'))
    done = run_cli("gateway", "--config", str(path))
    assert done.returncode == 2
    assert f"{path}: limits.budget:" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_exits_2_naming_an_upstream_command_that_does_not_start(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        GOOD.replace('url = "http://127.0.0.1:9/mcp"', 'command = ["/nonexistent/mcp-server", "--stdio"]')
    )
    done = run_cli("gateway", "--config", str(path), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "upstream 'demo'" in done.stderr and "/nonexistent/mcp-server" in done.stderr
    assert "did not start" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_exits_2_naming_an_http_upstream_that_is_not_there(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(GOOD.replace("[[upstreams]]", "[[upstreams]]\nconnect_timeout_s = 3"))
    done = run_cli("gateway", "--config", str(path), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "upstream 'demo' (http://127.0.0.1:9/mcp) did not start" in done.stderr


def test_hash_token_prints_the_sha256() -> None:
    done = run_cli("hash-token", "tok-ops")
    assert done.returncode == 0
    assert done.stdout.strip() == token_sha256("tok-ops")


def test_the_example_config_is_valid() -> None:
    config = load_config(Path(__file__).parent.parent / "examples" / "gateway.toml")
    billing = config.token_table().resolve("tok-billing")
    assert billing is not None and billing.refuse_at == "edge"
    assert config.gateway.suspended_file is not None and config.gateway.suspended_file.is_absolute()


def test_suspend_and_unsuspend_edit_the_kill_switch(tmp_path: Path) -> None:
    from haltwire.gateway.killswitch import SuspensionFile

    path = tmp_path / "suspended.json"
    switch = SuspensionFile(path)
    assert run_cli("suspend", "ops-bot", "billing-bot", "--file", str(path)).returncode == 0
    assert switch.suspended() == {"ops-bot", "billing-bot"}
    done = run_cli("unsuspend", "ops-bot", "--file", str(path))
    assert done.returncode == 0 and "billing-bot" in done.stdout
    assert switch.suspended() == {"billing-bot"}
    path.write_text("{not json")
    broken = run_cli("suspend", "ops-bot", "--file", str(path))
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert path.read_text() == "{not json", "a malformed file is left for the operator to fix"


def test_the_example_control_config_is_valid() -> None:
    from haltwire.control.config import load_control_config

    config = load_control_config(Path(__file__).parent.parent / "examples" / "control.toml")
    assert config.registry.backend == "sqlite" and config.registry.path.is_absolute()
    assert {i.role for i in config.identities} == {"operator", "viewer", "tripwire", "gateway", "executor", "agent"}


def test_a_taken_port_is_one_sentence_and_exit_1_for_the_gateway_and_the_control_plane(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        control = tmp_path / "control.toml"
        control.write_text(f'[control]\nport = {port}\ndevelopment = true\n[registry]\npath = "c.db"\n')
        gateway = tmp_path / "gateway.toml"
        gateway.write_text(
            f'[gateway]\nport = {port}\n\n[[upstreams]]\nname = "u"\nurl = "http://127.0.0.1:9/mcp"\n'
        )
        for command, config in (("control", control), ("gateway", gateway)):
            done = run_cli(command, "--config", str(config))
            assert done.returncode == 1, done.stderr
            assert f"haltwire {command}: cannot listen on 127.0.0.1:{port}" in done.stderr
            assert "Traceback" not in done.stderr


def test_suspend_finds_the_kill_switch_through_the_gateways_config_and_says_where_it_wrote(
    tmp_path: Path,
) -> None:
    """From any working directory, ``--config`` edits the file the gateway reads (relative to its
    config), and every write says the absolute path it went to."""
    config = tmp_path / "conf" / "gateway.toml"
    config.parent.mkdir()
    config.write_text(GOOD.replace("development = true", 'development = true\nsuspended_file = "suspended.json"'))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_haltwire("suspend", "ops-bot", "--config", str(config), cwd=elsewhere, timeout=30)
    assert done.returncode == 0, done.stderr
    read_by_gateway = load_config(config).gateway.suspended_file
    assert read_by_gateway == tmp_path / "conf" / "suspended.json"
    assert read_by_gateway.read_text() == '{"suspended": ["ops-bot"]}'
    assert str(read_by_gateway) in done.stdout and not (elsewhere / "suspended.json").exists()
    relative = run_haltwire("suspend", "x", "--file", "here.json", cwd=elsewhere, timeout=30)
    assert relative.returncode == 0 and str(elsewhere / "here.json") in relative.stdout
    config.write_text(GOOD)  # no suspended_file: nothing to edit
    unset = run_haltwire("suspend", "ops-bot", "--config", str(config), cwd=elsewhere, timeout=30)
    assert unset.returncode == 2 and "gateway.suspended_file is not set" in unset.stderr
    assert "Traceback" not in unset.stderr


def test_suspend_into_a_folder_that_does_not_exist_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    done = run_cli("suspend", "ops-bot", "--file", str(tmp_path / "nodir" / "s.json"))
    assert done.returncode == 2
    assert f"the folder {tmp_path / 'nodir'} does not exist" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize(
    ("section", "key"),
    [("[gateway]\nsuspended_file", "gateway.suspended_file"), ("[idempotency]\npath", "idempotency.path")],
)
def test_a_file_in_a_missing_folder_is_a_config_error_exit_2(tmp_path: Path, section: str, key: str) -> None:
    """A kill switch in a folder that is not there would never be read: nobody could be suspended."""
    path = tmp_path / "gw.toml"
    body = GOOD.replace("[limits]", f'{section} = "missing/file"\n\n[limits]')
    if section.startswith("[gateway]"):
        body = body.replace("[gateway]\ndevelopment = true\n", "").replace("[gateway]", "[gateway]\ndevelopment = true")
    path.write_text(body)
    with pytest.raises(ConfigError, match=f"{key}: the folder {tmp_path / 'missing'} does not exist"):
        load_config(path)
    done = run_cli("gateway", "--config", str(path), "--port", "0")
    assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr


def test_an_unusable_idempotency_store_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "records").mkdir()  # a folder where the database file should be
    path = tmp_path / "gw.toml"
    path.write_text(GOOD.replace("[limits]", '[idempotency]\npath = "records"\n\n[limits]'))
    done = run_cli("gateway", "--config", str(path), "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "cannot open the idempotency store" in done.stderr and str(tmp_path / "records") in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:8701", "localhost", "ftp://127.0.0.1:8701"])
def test_a_control_plane_url_without_http_is_a_usage_error(url: str) -> None:
    done = run_cli("stops", "--url", url, "--token", "tok")
    assert done.returncode == 2, done.stderr
    assert "is not an http:// or https:// URL" in done.stderr and "Traceback" not in done.stderr
    if "://" not in url:
        assert f"did you mean http://{url}?" in done.stderr


def test_the_control_plane_announces_no_url_when_its_registry_cannot_be_opened(tmp_path: Path) -> None:
    """A URL printed is a URL served: the announcement comes once the registry is open."""
    path = tmp_path / "control.toml"
    path.write_text(
        '[control]\ndevelopment = true\n\n[registry]\nbackend = "postgres"\n'
        'url = "postgresql://postgres@127.0.0.1:1/test"\n\n'
        '[[identities]]\nname = "oncall"\nrole = "operator"\ntoken = "tok-oncall"\n'
    )
    done = run_cli("control", "--config", str(path), "--port", "0", "--admin-port", "0", "--enforcement-port", "0")
    assert done.returncode == 1, done.stderr
    assert "haltwire control: registry store failed" in done.stderr and "port 1" in done.stderr
    assert " on http://" not in done.stderr and "Traceback" not in done.stderr
