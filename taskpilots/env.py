"""Small typed readers for configuration from the environment.

Each raises ImproperlyConfigured with the variable's name and what was expected, so a typo in a
deployment fails at start-up instead of at the first request.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, unquote, urlencode, urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_POSTGRESQL = "django.db.backends.postgresql"


def var_dir() -> Path:
    """Where the local defaults keep their state: ``$TASKPILOTS_VAR_DIR`` or ``./var``."""
    return Path(os.environ.get("TASKPILOTS_VAR_DIR") or Path(__file__).resolve().parents[1] / "var")


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_secret(name: str, default: str | None = None) -> str | None:
    """Read NAME, or the contents of the file named by NAME_FILE (for container secrets)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from exc
    return env_str(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean; use 1/0, true/false, yes/no")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_rates(name: str, default: str = "") -> dict[str, str]:
    """`CODE=rate,CODE=rate` (ISO 4217 codes, positive decimal rates) as {code: rate text}."""
    from decimal import Decimal, InvalidOperation

    rates: dict[str, str] = {}
    given = os.environ.get(name)
    items = [i.strip() for i in (default if given is None else given).split(",") if i.strip()]
    for item in items:
        code, _, rate = item.partition("=")
        code = code.strip().upper()
        try:
            ok = len(code) == 3 and code.isascii() and code.isalpha() and Decimal(rate) > 0
        except InvalidOperation:
            ok = False
        if not ok:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not CODE=rate (an ISO 4217 code and a positive number, "
                "e.g. USD=1,EUR=1.08)"
            )
        rates[code] = rate.strip()
    return rates


def parse_database_url(url: str) -> dict:
    """Turn postgres://user:password@host:port/name?sslmode=... into a DATABASES entry
    (dj-database-url), refusing anything but PostgreSQL.

    A Unix socket directory is given as a `host=` query parameter or as a %2F-encoded host.
    """
    scheme = urlsplit(url).scheme
    engine = dj_database_url.ENGINE_SCHEMES.get(scheme)
    if engine is None or engine.backend != _POSTGRESQL:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {scheme!r} is not supported: TaskPilots runs on "
            "PostgreSQL only (postgres://user:password@host:5432/name)"
        )
    try:
        db = dj_database_url.parse(url)
    except ValueError:  # the URL is not echoed: it may hold a password
        raise ImproperlyConfigured(
            "DATABASE_URL has an invalid port, or a character in it needs %-encoding"
        ) from None
    if not db["NAME"]:
        raise ImproperlyConfigured("DATABASE_URL names no database (…/name at the end)")
    options = db.setdefault("OPTIONS", {})
    host = db["HOST"]
    if host.startswith("/"):  # a %2F-encoded socket directory, which urlsplit lower-cases
        host = unquote(urlsplit(url).netloc.rsplit("@", 1)[-1].split(":")[0])
    db["HOST"] = str(options.pop("host", host))
    db["USER"] = db["USER"] or "postgres"
    db["PORT"] = str(db["PORT"])
    return db


# OPTIONS that are psycopg's or Django's, not libpq connection parameters: never in a URL.
DRIVER_OPTIONS = frozenset({"prepare_threshold", "pool", "server_side_binding", "isolation_level"})


def format_database_url(db: dict, name: str | None = None) -> str:
    """The URL of a DATABASES entry (the inverse of parse_database_url), optionally naming another
    database on the same server. A Unix socket directory goes into the `host` query parameter."""
    auth = quote(db.get("USER") or "postgres", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    options = {
        k: v
        for k, v in (db.get("OPTIONS") or {}).items()
        if isinstance(v, str | int) and k not in DRIVER_OPTIONS
    }
    host = db.get("HOST") or ""
    if host.startswith("/"):
        options = {"host": host, **options}
        host = ""
    elif ":" in host:  # an IPv6 address
        host = f"[{host}]"
    netloc = f"{auth}@{host}" + (f":{db['PORT']}" if db.get("PORT") else "")
    # quote_via=quote: a space is %20, never "+" (libpq reads "+" literally: `-c name=value`).
    query = urlencode(options, safe="/", quote_via=quote) if options else ""
    path = quote(name or db["NAME"], safe="")
    return f"postgres://{netloc}/{path}" + (f"?{query}" if query else "")
