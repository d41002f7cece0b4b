"""``--allow-hosts``: which task URLs a dispatcher may send to
(``blizzard/dispatch/allow_hosts.py``)."""

from __future__ import annotations

import pytest

from blizzard.dispatch.allow_hosts import HostPolicy
from blizzard.wire.errors import InvalidArgument

POLICY = HostPolicy.parse(["api.example.org", "10.0.0.7", "::1", "*.example.com"])


@pytest.mark.parametrize("url", [
    "https://api.example.org/hook", "http://API.Example.org./x", "http://10.0.0.7:8080/",
    "http://[::1]/", "http://[0:0::1]:81/", "https://a.example.com/", "http://b.a.example.com/",
])
def test_an_allowed_host_is_sent_to(url):
    assert POLICY.refusal(url) == ""


@pytest.mark.parametrize("url, host", [
    ("http://example.com/", "example.com"),  # *.example.com is below it, not it
    ("http://evilexample.com/", "evilexample.com"),
    ("http://a.example.com.evil.net/", "a.example.com.evil.net"),
    ("http://api.example.org@169.254.169.254/", "169.254.169.254"),  # the host, not the user
    ("http://10.0.0.8/", "10.0.0.8"),
    ("http://localhost/", "localhost"),
])
def test_any_other_host_is_refused_by_name(url, host):
    assert POLICY.refusal(url) == (f"host {host!r} is not in the dispatcher's --allow-hosts; "
                                   "not sent")


def test_no_patterns_allow_any_host():
    assert HostPolicy.parse([]).refusal("http://169.254.169.254/latest") == ""


@pytest.mark.parametrize("pattern", ["*", "*.", "http://a.com", "a.com:80", "a/b", "a..b", ""])
def test_a_bad_pattern_is_refused(pattern):
    with pytest.raises(InvalidArgument, match="is not a host name"):
        HostPolicy.parse([pattern])
