"""Egress through the SDK: allow_internet_access and network.allow_out /
deny_out map onto airlock's policies, and update_network replaces them.
Only SDKs that have `network` and `update_network` (the latest venv)."""

import pytest

from e2b import Sandbox, SandboxException


def proxied(sbx):
    """Whether the sandbox has an egress path (its processes get the proxy
    variables only then)."""
    out = sbx.commands.run("printenv HTTPS_PROXY || true").stdout.strip()
    return out == "http://127.0.0.1:15001"


def test_allowlist_then_update():
    sbx = Sandbox.create(
        timeout=60,
        allow_internet_access=False,
        network={"allow_out": ["site.test"], "deny_out": ["0.0.0.0/0"]},
    )
    try:
        assert proxied(sbx)
        # A name off the list does not resolve.
        result = sbx.commands.run("getent hosts not-allowed.test || echo refused")
        assert result.stdout.strip() == "refused"
        sbx.update_network({"allow_out": ["other.test"], "deny_out": ["0.0.0.0/0"]})
        assert proxied(sbx)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_no_internet_has_no_egress_path():
    sbx = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        assert not proxied(sbx)
        with pytest.raises(SandboxException):
            sbx.update_network({"allow_out": ["site.test"], "deny_out": ["0.0.0.0/0"]})
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_partial_deny_lists_are_refused_clearly():
    with pytest.raises(SandboxException) as raised:
        Sandbox.create(timeout=60, network={"deny_out": ["8.8.8.8/32"]})
    assert "denyOut" in str(raised.value)
