"""Refusals of model calls and of the egress proxy: providers, models, targets, proxy credentials."""

from __future__ import annotations

from haltwire.refusal.core import Refusal, _request, _terminal


def provider_unavailable(provider: str, retry_after_s: float = 5.0) -> Refusal:
    """``upstream_unavailable`` for a model call: its provider (``[[models]]``) cannot be reached."""
    return Refusal(
        code="upstream_unavailable",
        message=(
            f"The model provider {provider} cannot be reached right now, "
            f"so wait {retry_after_s:g} s and then send this call again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )


def unknown_model(model: str) -> Refusal:
    """A model call naming a model no ``[[models]]`` entry of the gateway routes."""
    return _request("unknown_model", f"No model provider of this gateway serves the model {model!r}.")


def model_request_invalid(why: str) -> Refusal:
    """A model call whose body the gateway cannot route (``invalid_request``)."""
    return _request("invalid_request", f"This model request cannot be routed ({why}).")


def egress_denied(run: str, target: str, profile: str) -> Refusal:
    """The egress proxy's profile for the run does not allow ``target`` (``HOST:PORT``)."""
    if profile == "none":
        clause = f"Run {run} may reach nothing through the egress proxy (its profile is none) and {target} was not contacted"
    else:
        clause = f"Run {run} may not reach {target} through the egress proxy (profile {profile})"
    return _terminal("egress_denied", clause, extra=(("run", run), ("target", target), ("profile", profile)))


def egress_private_address(run: str, target: str, address: str, profile: str) -> Refusal:
    """``egress_denied``: ``target``'s name resolves to a private, loopback or otherwise non-public
    ``address`` that the profile does not list by address."""
    return _terminal(
        "egress_denied",
        f"Run {run} may not reach {target} through the egress proxy because it resolves to the "
        f"non-public address {address} and profile {profile} does not list that address",
        extra=(("run", run), ("target", target), ("profile", profile), ("address", address)),
    )


def proxy_auth_required(why: str) -> Refusal:
    """No usable proxy credentials (answered 407 with ``Proxy-Authenticate``)."""
    return _request(
        "proxy_auth_required",
        f"The egress proxy needs the run's lease token as proxy credentials ({why}): send it as the "
        "password of Proxy-Authorization Basic (HTTPS_PROXY=http://RUN:TOKEN@HOST:PORT) or as a Bearer token.",
    )


def proxy_request_invalid(why: str) -> Refusal:
    """A request a forward proxy cannot serve: not an absolute http URI nor a CONNECT, say."""
    return _request("proxy_request_invalid", f"The egress proxy cannot forward this request ({why}).")


def target_unreachable(target: str, retry_after_s: float = 5.0) -> Refusal:
    """``upstream_unavailable`` at the egress proxy: ``target`` does not resolve or does not answer."""
    return Refusal(
        code="upstream_unavailable",
        message=(
            f"The egress proxy cannot reach {target} right now, "
            f"so wait {retry_after_s:g} s and then send this request again."
        ),
        retryable=True,
        retry_after_s=retry_after_s,
    )
