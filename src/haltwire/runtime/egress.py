"""The proxy environment of a run: how a run and its subprocesses go out through ``haltwire egress``.

``proxy_env`` is the environment that curl, requests, httpx, aiohttp (``trust_env``), Node's
proxy agents and most HTTP clients read: ``HTTPS_PROXY`` and ``HTTP_PROXY`` (both cases) name
the proxy with the run's current lease token as the password and the run id as the user, so
every request and tunnel carries the run's credentials (``Proxy-Authorization: Basic``);
``NO_PROXY`` (both cases) names what the run reaches without the proxy (unguarded: keep it
empty, or loopback only).

``Lease.proxy_env`` gives it for the lease's current token; ``Lease.export_proxy_env`` writes it
into ``os.environ`` (or another mapping) now and again at every renewal, so a subprocess started
later inherits the token current when it starts. A subprocess holds the token it was started
with: the proxy accepts it until its own expiry (a renewal does not revoke the token it
replaces), and refuses it after (407 ``lease_expired``) or as soon as a stop covers the run
(403). A long-lived subprocess must therefore be restarted, or re-read the token, within one
lease period.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

#: The variables ``proxy_env`` sets, upper and lower case (curl reads only ``http_proxy`` in
#: lower case; most clients read either).
NAMES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")


def proxy_url_with(proxy_url: str, run_id: str, token: str) -> str:
    """``proxy_url`` (``http://HOST:PORT``) with ``RUN_ID:TOKEN@`` as its credentials."""
    parts = urlsplit(proxy_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the egress proxy URL must be http://HOST:PORT, not {proxy_url!r}")
    host = parts.netloc.rpartition("@")[2]  # credentials already in the URL are replaced
    netloc = f"{quote(run_id, safe='')}:{quote(token, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def proxy_env(proxy_url: str, run_id: str, token: str, no_proxy: str = "") -> dict[str, str]:
    """The six variables (``NAMES``) for a run going out through ``proxy_url`` with ``token``."""
    url = proxy_url_with(proxy_url, run_id, token)
    env: dict[str, str] = {}
    for name in ("HTTPS_PROXY", "HTTP_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    return env
