"""No secrets in the ledger, the metrics or the terminal: credentials in database URLs, redacted.

The ledger's history is append-only and hash-chained: a password written into it cannot be
scrubbed later without breaking the chain. So every URL is redacted before anything records or
prints it: :func:`redact_url` for a URL, :func:`redact_text` for free text that may hold one
(an error message, a log line), :func:`redact_secrets` for a JSON value (a run's config). The
ledger applies :func:`redact_secrets` to every payload and run config it stores, whatever the
caller passed.

A password never has to be in a URL: libpq (and so psycopg) reads ``PGPASSWORD`` from the
environment and ``~/.pgpass`` (or ``PGPASSFILE``) when the URL has none, so
``postgresql+psycopg://ledger@db.internal/runs`` plus either of those is the recommended form.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a URL is parsed: redact_text runs in every CLI command
    import sqlalchemy as sa

__all__ = [
    "PASSWORD_MASK",
    "contains_secret",
    "redact_secrets",
    "redact_text",
    "redact_url",
    "url_without_password",
]

PASSWORD_MASK = "***"

# scheme://user:password@host... The password runs to the last "@" before the host part, so a
# password holding an unescaped "@" is still hidden whole.
_URL_PASSWORD = re.compile(
    r"(?P<prefix>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*):(?P<password>[^\s]*?)"
    r"@(?=[^\s@]*(?:[/?\s\"',;)]|$))"
)
_PASSWORD_NAMES = frozenset({"password", "passwd", "pwd", "pgpassword", "sslpassword"})
# password=... as a URL query parameter or a libpq key=value conninfo.
_KEYWORD_PASSWORD = re.compile(
    r"(?P<prefix>\b(?:password|passwd|pwd|sslpassword)\s*=\s*)(?P<password>'[^']*'|[^\s&;,'\"]+)",
    re.IGNORECASE,
)


def redact_text(text: str) -> str:
    """``text`` with every URL password and ``password=...`` value replaced by ``***``."""
    if "=" not in text and "@" not in text:
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m['prefix']}:{PASSWORD_MASK}@", text)
    return _KEYWORD_PASSWORD.sub(lambda m: f"{m['prefix']}{PASSWORD_MASK}", text)


def redact_url(url: str | sa.URL) -> str:
    """The URL with its password (and any ``password`` query parameter) replaced by ``***``.

    Accepts what :func:`sqlalchemy.make_url` accepts; anything else is redacted as text, so this
    never raises and never returns a password.
    """
    import sqlalchemy as sa

    try:
        parsed = url if isinstance(url, sa.URL) else sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError, TypeError):
        return redact_text(str(url))
    query = {
        key: (PASSWORD_MASK if _KEYWORD_PASSWORD.match(f"{key}=x") else value)
        for key, value in parsed.query.items()
    }
    rendered = parsed.set(query=query).render_as_string(hide_password=True)
    return redact_text(rendered)


def _is_password_key(key: object) -> bool:
    name = str(key).lower()
    return name in _PASSWORD_NAMES or name.endswith(("_password", "-password"))


def url_without_password(url: str | sa.URL) -> str:
    """The URL with its password removed, not masked: the form to print in a command meant to
    be run (``LEDGER_DB=... ledger verify``), the password then coming from ``PGPASSWORD`` or
    ``~/.pgpass`` (a masked ``***`` would be sent as the password). Never raises.
    """
    import sqlalchemy as sa

    try:
        parsed = url if isinstance(url, sa.URL) else sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError, TypeError):
        return redact_text(str(url))
    query = {
        key: value for key, value in parsed.query.items()
        if not _KEYWORD_PASSWORD.match(f"{key}=x")
    }
    bare = parsed._replace(password=None).set(query=query).render_as_string(hide_password=False)
    return redact_text(bare)


def redact_secrets(value: Any) -> Any:
    """A copy of a JSON value with :func:`redact_text` applied to every string in it (keys
    too), and the value of any ``password``-like key replaced by ``***``."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            redact_secrets(key): (
                PASSWORD_MASK if _is_password_key(key) and item else redact_secrets(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_secrets(item) for item in value]
    return value


def contains_secret(value: Any, rendered: str | None = None) -> bool:
    """Whether :func:`redact_secrets` would change ``value``: an unredacted URL password, a
    ``password=`` value, or a ``password``-like key with a value other than ``***``.
    ``rendered``: the value's JSON, if the caller has it."""
    try:
        # A quick no: a value whose JSON has no "=", "@" or password-like name holds nothing
        # redact_secrets would change (the audit asks this of every payload it reads).
        rendered = (rendered if rendered is not None
                    else json.dumps(value, ensure_ascii=False)).lower()
    except (TypeError, ValueError):
        rendered = None
    if rendered is not None and "=" not in rendered and "@" not in rendered \
            and "passw" not in rendered and "pwd" not in rendered:
        return False
    return redact_secrets(value) != value
