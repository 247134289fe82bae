"""The one HTTP client library of the project (httpx2, the maintained httpx), shared per process.

Tool calls, webhook deliveries and the sandbox client all go through httpx2, whose exceptions
tell apart the two things a caller of a write must not confuse:

- the request never left (`NOT_SENT`: the connection was refused or timed out, no pooled
  connection came free, the URL or a header could not be sent at all), so the call did not
  happen;
- the request went out and the answer did not come back (any other `httpx2.TransportError`: a
  read or write timeout, a reset, a server that hung up), so for a write the outcome is unknown.

`SharedClient` keeps one `httpx2.Client` (and so one connection pool) per process.
"""

from __future__ import annotations

import os
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx2

NOT_SENT: tuple[type[Exception], ...] = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.PoolTimeout,
    httpx2.UnsupportedProtocol,
    httpx2.LocalProtocolError,
    httpx2.InvalidURL,
)

# No cap on connections in use (as before pooling, when every call opened its own; a cap would
# make calls of a busy thread pool wait), at most 20 kept idle, each for less than the idle
# timeout of common servers (gunicorn's is 2 s): a request sent on a connection the server is
# just closing fails after being written, which for a write reads as an unknown outcome.
LIMITS = httpx2.Limits(max_connections=None, max_keepalive_connections=20, keepalive_expiry=1.0)


def _no_cookies() -> CookieJar:
    # A shared client must not carry one call's cookies into another call (another run, another
    # tool): every cookie a server sets is refused.
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


class SharedClient:
    """An `httpx2.Client` shared by the threads of one process and built anew after a fork.

    httpx2's pool is thread-safe, but its sockets must not cross a fork: a Celery prefork child,
    or a process started by `multiprocessing`'s fork, would write into its parent's connections
    and could read the answer meant for the parent. So the client is bound to the pid that built
    it. Two threads building one at once is harmless: one of them is dropped.
    """

    def __init__(self, **options: Any) -> None:
        self._options = {
            "follow_redirects": False,
            "limits": LIMITS,
            **options,
        }
        self._owner: tuple[int, httpx2.Client] | None = None

    def __call__(self) -> httpx2.Client:
        owner = self._owner
        if owner is None or owner[0] != os.getpid():
            owner = (os.getpid(), httpx2.Client(cookies=_no_cookies(), **self._options))
            self._owner = owner
        return owner[1]
