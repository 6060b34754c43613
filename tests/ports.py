"""Free loopback ports for the servers a test starts: the stacks' own helpers
(``haltwire.demo.processes``), so that tests and ``haltwire drill``/the demos pick ports alike."""

from haltwire.demo.processes import free_port, free_ports

__all__ = ["free_port", "free_ports"]
