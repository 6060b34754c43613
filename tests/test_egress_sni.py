"""The TLS SNI check of the egress proxy's tunnels: the ClientHello parser on real ClientHellos
(made by OpenSSL through Python's ssl), and a tunnel whose SNI names a host its profile does not
allow closed before any byte reaches the target."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress_harness import basic, connect_via, echo_target, egress_config, running_egress, tls_client_hello
from haltwire.egress import sni
from leases_harness import mint
from stops_harness import control_plane

LATE = 10**6


def _records(handshake: bytes, sizes: list[int]) -> bytes:
    """``handshake`` framed as TLS handshake records of ``sizes`` (the rest in the last one)."""
    out, at = b"", 0
    for size in [*sizes, len(handshake)]:
        part = handshake[at : at + size]
        if part:
            out += b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part
        at += len(part)
    return out


def test_a_real_client_hello_names_its_server() -> None:
    hello = tls_client_hello("API.Example.com")
    assert sni.client_hello(hello) == sni.Hello("api.example.com")
    assert sni.client_hello(tls_client_hello(None)) == sni.Hello(None)


def test_a_client_hello_not_yet_whole_needs_more_and_may_span_records() -> None:
    hello = tls_client_hello("api.example.com")
    for cut in (0, 1, 4, 5, 6, 40, len(hello) - 1):
        assert sni.client_hello(hello[:cut]) is sni.NEED_MORE, cut
    handshake = hello[5 : 5 + int.from_bytes(hello[3:5], "big")]
    split = _records(handshake, [3, 100])
    assert sni.client_hello(split) == sni.Hello("api.example.com")
    assert sni.client_hello(split[:-1]) is sni.NEED_MORE


def test_what_is_not_a_client_hello() -> None:
    assert sni.client_hello(b"GET / HTTP/1.1\r\n") is sni.NOT_TLS
    assert sni.client_hello(b"SSH-2.0-OpenSSH") is sni.NOT_TLS
    server_hello = _records(b"\x02\x00\x00\x04abcd", [])
    assert sni.client_hello(server_hello) is sni.MALFORMED
    truncated_body = _records(b"\x01\x00\x00\x04\x03\x03ab", [])
    assert sni.client_hello(truncated_body) is sni.MALFORMED
    hello = tls_client_hello("a.example")
    # A handshake record, then something else before the hello is whole.
    handshake = hello[5 : 5 + int.from_bytes(hello[3:5], "big")]
    assert sni.client_hello(_records(handshake[:10], []) + b"\x17\x03\x03\x00\x01x") is sni.MALFORMED


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_an_answer_never_an_exception(data: bytes) -> None:
    answer = sni.client_hello(b"\x16" + data)
    assert answer in (sni.NEED_MORE, sni.MALFORMED) or isinstance(answer, sni.Hello)


@pytest.mark.anyio
async def test_a_tunnel_whose_sni_names_a_host_not_allowed_is_closed_before_the_target_hears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "haltwire.egress")
    async with (
        control_plane(tmp_path / "control.db") as cp,
        echo_target() as echo,
        running_egress(
            egress_config(cp, {"web": [f"127.0.0.1:{echo.port}", "localhost:*"]}, {"ops-bot": "web"})
        ) as (_, port),
    ):
        auth = basic("run-t", mint("run-t", generation=LATE))
        target = f"127.0.0.1:{echo.port}"

        # SNI naming a host the profile allows: the hello reaches the target.
        allowed, answer = await connect_via(port, target, auth)
        assert answer.status == 200
        hello = tls_client_hello("localhost")
        await allowed.send(hello)
        with anyio.fail_after(5):
            received = b""
            while len(received) < len(hello):
                received += await allowed.receive()
        assert received == hello and echo.received == len(hello)
        await allowed.aclose()

        # Domain fronting: CONNECT to an allowed address, SNI naming another host.
        fronted, answer = await connect_via(port, target, auth)
        assert answer.status == 200
        await fronted.send(tls_client_hello("exfiltrate.example"))
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await fronted.receive()
        await fronted.aclose()
        await echo.until_closed(2, within=5)
        assert echo.received == len(hello), "not one byte of the fronted hello reached the target"
        cut = [r.getMessage() for r in caplog.records if "cut by its TLS SNI" in r.getMessage()]
        assert len(cut) == 1 and "'exfiltrate.example'" in cut[0] and "profile web" in cut[0]

        # Not TLS (a server-speaks-first or plain protocol): no SNI to match, it goes on.
        plain, answer = await connect_via(port, target, auth)
        await plain.send(b"hello")
        assert await plain.receive() == b"hello"
        await plain.aclose()
