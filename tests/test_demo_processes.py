"""``haltwire.demo.processes``: what the stacks of real processes (the demos, ``haltwire drill``)
rely on before any part starts."""

from __future__ import annotations

from haltwire.demo.processes import free_port, free_ports


def test_ports_picked_together_are_all_different() -> None:
    """A stack picks its ports together (the drill's seven, the refunds demo's six). Once a
    socket is closed the kernel may hand its port to the next bind, and a part given another
    part's port does not start: picked one by one, 200 ports repeat one most times."""
    for _ in range(5):
        ports = free_ports(200)
        assert len(set(ports)) == 200
        assert all(1024 <= p <= 65535 for p in ports)


def test_a_port_picked_alone_is_free_to_bind() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if something holds it
