"""Who may use the console, and proof that a form was sent by the console's own page.

Credentials come from the environment or a file, never from the command line (where ``ps``
and shell histories would show them): a bearer token, or a user name and password (HTTP
Basic), or both. A browser signs in once on ``/login`` and gets a session cookie (random,
kept in this process only, ``HttpOnly``, ``SameSite=Strict``); scripts may send the token
as ``Authorization: Bearer`` or the password as ``Authorization: Basic`` on every request.

Every change is a POST carrying a CSRF token: the session's own random token, or for
header-authenticated requests an HMAC of who they are under a secret made at start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from inbox.errors import ConfigurationError

__all__ = [
    "MIN_SECRET_LENGTH",
    "PASSWORD_ENV",
    "SESSION_COOKIE",
    "TOKEN_ENV",
    "USER_ENV",
    "Credentials",
    "Session",
    "Sessions",
    "claimed_user",
    "load_credentials",
]

TOKEN_ENV: Final = "INBOX_CONSOLE_TOKEN"
PASSWORD_ENV: Final = "INBOX_CONSOLE_PASSWORD"
USER_ENV: Final = "INBOX_CONSOLE_USER"
DEFAULT_USER: Final = "operator"
MIN_SECRET_LENGTH: Final = 16
SESSION_COOKIE: Final = "inbox_console_session"
SESSION_SECONDS: Final = 8 * 3600


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Credentials:
    """The console's secrets: a token, a user and password, or both."""

    token: str | None = None
    user: str = DEFAULT_USER
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.token is None and self.password is None:
            raise ConfigurationError(
                f"the console needs credentials: set {TOKEN_ENV} (or --token-file FILE) or "
                f"{PASSWORD_ENV} (or --password-file FILE)"
            )
        for what, secret in (("token", self.token), ("password", self.password)):
            if secret is not None and len(secret) < MIN_SECRET_LENGTH:
                raise ConfigurationError(
                    f"the console's {what} is too short: at least {MIN_SECRET_LENGTH} characters"
                )
        if not self.user or ":" in self.user:
            raise ConfigurationError("the console's user name must be non-empty and hold no ':'")

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, token={'***' if self.token else None})"

    def check_token(self, token: str) -> bool:
        """Whether ``token`` is the console's token (in constant time)."""
        return self.token is not None and _equal(token, self.token)

    def check_password(self, user: str, password: str) -> bool:
        """Whether ``user`` and ``password`` are the console's (in constant time)."""
        if self.password is None:
            return False
        return _equal(user, self.user) & _equal(password, self.password)

    def from_header(self, authorization: str | None) -> str | None:
        """Who an ``Authorization`` header proves to be (``token`` or the user), else None."""
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            return "token" if self.check_token(value.strip()) else None
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            user, _, password = decoded.partition(":")
            return user if self.check_password(user, password) else None
        return None


def claimed_user(authorization: str | None) -> str:
    """The user name an ``Authorization: Basic`` header claims, proven or not (for the audit
    line of a refusal); ``-`` for any other header or none."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return "-"
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "-"
    return decoded.partition(":")[0] or "-"


def _read_secret(path: str, what: str) -> str:
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"the {what} file {path} is not UTF-8 text") from None
    if not secret:
        raise ConfigurationError(f"the {what} file {path} is empty")
    return secret


def load_credentials(
    *,
    token_file: str | None = None,
    password_file: str | None = None,
    user: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Credentials:
    """The credentials from files (``token_file``, ``password_file``) or else the
    environment (:data:`TOKEN_ENV`, :data:`PASSWORD_ENV`, :data:`USER_ENV`). ``ValueError``
    with one line when there are none, or they are too short."""
    env = os.environ if environ is None else environ
    token = _read_secret(token_file, "token") if token_file else env.get(TOKEN_ENV) or None
    password = (
        _read_secret(password_file, "password") if password_file else env.get(PASSWORD_ENV) or None
    )
    return Credentials(token, user or env.get(USER_ENV) or DEFAULT_USER, password)


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: who, its CSRF token, and when it expires (monotonic seconds)."""

    who: str
    csrf: str
    expires: float


class Sessions:
    """The signed-in browsers of this process, by the random id their cookie carries; and
    the CSRF tokens of requests that authenticate by header."""

    def __init__(self, lifetime: float = SESSION_SECONDS) -> None:
        self._lifetime = lifetime
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._secret = secrets.token_bytes(32)

    def start(self, who: str) -> tuple[str, Session]:
        """A new session for ``who``: its cookie value and the session."""
        session_id = secrets.token_urlsafe(32)
        session = Session(who, secrets.token_urlsafe(32), time.monotonic() + self._lifetime)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: s for k, s in self._by_id.items() if s.expires > now}
            self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie value, else None."""
        if not session_id:
            return None
        with self._lock:
            session = self._by_id.get(session_id)
            if session is not None and session.expires <= time.monotonic():
                del self._by_id[session_id]
                return None
            return session

    def end(self, session_id: str | None) -> None:
        """Forget a session (sign out)."""
        if session_id:
            with self._lock:
                self._by_id.pop(session_id, None)

    def header_csrf(self, who: str) -> str:
        """The CSRF token for requests authenticated by header as ``who``."""
        return hmac.new(self._secret, f"header:{who}".encode(), hashlib.sha256).hexdigest()
