"""Egress through the SDK: allow_internet_access and network.allow_out /
deny_out map onto airlock's policies, and update_network replaces them.
Only SDKs that have `network` and `update_network` (the latest venv).

The harness (crates/airlock/tests/e2b_sdk.rs) serves a test internet: the
daemon resolves site.test, other.test and not-allowed.test (--egress-host)
to one HTTP server on port 8000. Every name refused here exists and is
reached once a policy allows it, so the refusal is the policy's."""

import pytest

from e2b import Sandbox, SandboxException


def proxied(sbx):
    """Whether the sandbox has an egress path (its processes get the proxy
    variables only then)."""
    out = sbx.commands.run("printenv HTTPS_PROXY || true").stdout.strip()
    return out == "http://10.255.254.1:15001"


HELLO = "hello from the test internet"
# The test internet's server (SITE_ADDRESS in e2b_sdk.rs).
SITE_ADDRESS = "203.0.113.2"


def fetch(sbx, name, proxy=False):
    """What the sandbox gets from http://NAME:8000/: transparently (the
    name resolved by the sandbox's resolver), with the name pinned to the
    server's address (judged by the proxy alone), and, if `proxy`, through
    HTTP_PROXY. One line each, the body or `refused`."""
    script = (
        f"curl --noproxy '*' -sf -m 5 http://{name}:8000/ || echo refused; "
        f"curl --noproxy '*' -sf -m 5 --resolve {name}:8000:{SITE_ADDRESS} "
        f"http://{name}:8000/ || echo refused"
    )
    if proxy:
        script += f"; curl -sf -m 5 http://{name}:8000/ || echo refused"
    return sbx.commands.run(script).stdout.splitlines()


def test_allowlist_then_update():
    sbx = Sandbox.create(
        timeout=60,
        allow_internet_access=False,
        network={"allow_out": ["site.test"], "deny_out": ["0.0.0.0/0"]},
    )
    try:
        assert proxied(sbx)
        assert fetch(sbx, "site.test", proxy=True) == [HELLO] * 3
        # A name off the list does not resolve, and is not served when
        # named to the server's address or through the proxy.
        result = sbx.commands.run("getent hosts not-allowed.test || echo refused")
        assert result.stdout.strip() == "refused"
        assert fetch(sbx, "not-allowed.test", proxy=True) == ["refused"] * 3
        # The new policy holds at once: the name refused before is served,
        # the one allowed before is refused.
        sbx.update_network({"allow_out": ["not-allowed.test"], "deny_out": ["0.0.0.0/0"]})
        assert proxied(sbx)
        result = sbx.commands.run("getent hosts not-allowed.test || echo refused")
        assert result.stdout.split()[0] == SITE_ADDRESS
        assert fetch(sbx, "not-allowed.test", proxy=True) == [HELLO] * 3
        assert fetch(sbx, "site.test", proxy=True) == ["refused"] * 3
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_no_internet_has_no_egress_path():
    sbx = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        assert not proxied(sbx)
        # Not even the name pinned to the server's address gets out.
        assert fetch(sbx, "site.test") == ["refused"] * 2
        with pytest.raises(SandboxException):
            sbx.update_network({"allow_out": ["site.test"], "deny_out": ["0.0.0.0/0"]})
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_partial_deny_list_takes_nothing_allow_out_gives():
    """denyOut of single destinations: on a daemon serving the open
    internet by default it takes them away from it (the native `deny`
    mode, tested by tests/egress.rs); on this harness's daemon, which
    denies by default, the sandbox gets the allowlist of allow_out, and
    allow_out wins over deny_out as e2b documents."""
    sbx = Sandbox.create(
        timeout=60,
        network={"allow_out": ["site.test"], "deny_out": [f"{SITE_ADDRESS}/32"]},
    )
    try:
        assert proxied(sbx)
        assert fetch(sbx, "site.test") == [HELLO] * 2
        assert fetch(sbx, "other.test") == ["refused"] * 2
    finally:
        Sandbox.kill(sbx.sandbox_id)
