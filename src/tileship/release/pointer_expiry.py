"""An expiry inside the signed pointer, so that a frozen or replayed ``active.json`` is not accepted forever.

A seal (``pointer_seal``) says who wrote a pointer and that it is not older than the one a server serves; it says
nothing of *when*. An attacker who can write the registry root (or stop the activator's writes) can keep a validly
sealed pointer in place for good, and a server starting fresh takes it. TUF's timestamp role answers this with an
expiry signed into its metadata; so does the pointer:

- Writing: ``activate`` / ``rollback`` ``--valid-for DURATION`` (``Registry(valid_for=)``; default
  ``TILESHIP_POINTER_VALID_FOR``) write ``expires``, the UTC instant ``YYYY-MM-DDTHH:MM:SSZ``, among the fields the
  seal signs. Each pointer write states its own: one written without a validity has none. Only a sealed pointer
  takes one (``stamp`` refuses a validity without an activator key: nobody would check it). Activating the active
  release again with a validity writes a new pointer (a new generation, a new ``expires``): that is how an
  activator refreshes the pointer before it expires.
- Reading: ``pointer_seal.check`` (every reader that verifies the seal: ``serve`` at start and on reload, the Ray
  fleet's controller, ``diagnose``, ``releases``) refuses a pointer whose ``expires`` has passed
  (``PointerExpiredError`` naming the instant) or is not such an instant (``PointerSignatureError`` naming the
  field). ``soon`` says when the instant is less than ``WARN_WITHIN`` away (``diagnose``, ``releases`` and
  ``activate`` warn). Readers take the time from ``now`` (tests inject it), else the system clock in UTC.
- Unsigned pointers, pointers without ``expires`` and readers that trust no activator key behave as before.

Not covered: the clocks. A reader whose clock is behind accepts an expired pointer for that long; one that is ahead
refuses early. A server keeps serving the release it loaded after that pointer expires (a reload refuses the
expired pointer; nothing is unloaded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tileship import env
from tileship.errors import PointerExpiredError, PointerSignatureError, RegistryError

#: the pointer field this module writes (signed with the others)
FIELD = "expires"
#: how ``expires`` is written, and the only form a reader accepts
INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
#: ``--valid-for``: a whole number and a unit (weeks, days, hours, minutes, seconds)
DURATION = re.compile(r"([0-9]{1,9})([wdhms])")
_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
#: the most a pointer may be valid for (the expiry is then a decade away: the same as none)
LONGEST = timedelta(days=3660)
#: how close an expiry is when readers warn
WARN_WITHIN = timedelta(days=1)
_REFRESH = "activate the same release again with `--valid-for` (and the activator key) to seal a fresh pointer"


def parse_duration(text: str, source: str = "--valid-for") -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` as a timedelta. Raises RegistryError naming ``source`` for anything
    else, zero, or more than ``LONGEST``."""
    m = DURATION.fullmatch(text.strip())
    span = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))}) if m else None
    if span is None or not timedelta(0) < span <= LONGEST:
        raise RegistryError(f"{source} {text!r}: not a duration of at most {LONGEST.days} days",
                            hint="a whole number and a unit: 7d, 12h, 30m, 90s or 2w")
    return span


def valid_for(given: timedelta | None) -> timedelta | None:
    """The validity a pointer write takes: ``given``, else ``TILESHIP_POINTER_VALID_FOR``; None: no expiry.
    Raises RegistryError naming the variable when it is set but not a duration."""
    if given is not None:
        return given
    raw = env.pointer_valid_for()
    return parse_duration(raw, "TILESHIP_POINTER_VALID_FOR") if raw is not None else None


def instant(when: datetime) -> str:
    """``when`` as ``expires`` is written: UTC, to the second, ``Z``."""
    return when.astimezone(UTC).strftime(_FORMAT)


def _at(text: str) -> datetime:
    """An ``INSTANT`` as an aware datetime; ValueError for a date that does not exist (month 13, 30 February)."""
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)


def stamp(given: timedelta | None, key: Ed25519PrivateKey | None, now: datetime | None = None) -> str | None:
    """The ``expires`` of the pointer about to be written (``valid_for(given)`` from ``now``), or None without a
    validity. Raises RegistryError when there is a validity but no activator key (nothing is written)."""
    span = valid_for(given)
    if span is None:
        return None
    if key is None:
        raise RegistryError("a pointer validity (--valid-for, TILESHIP_POINTER_VALID_FOR) needs an activator key: "
                            "an expiry is checked only on a sealed pointer",
                            hint="pass --sign-key (or set TILESHIP_ACTIVATOR_KEY), or drop the validity")
    return instant((now or datetime.now(UTC)) + span)


def stated(state: Mapping[str, Any]) -> str | None:
    """The ``expires`` a pointer states (not checked: a string or None)."""
    value = state.get(FIELD)
    return value if isinstance(value, str) else None


def parse(path: Path, state: Mapping[str, Any], key_id: str | None = None) -> datetime | None:
    """The instant a pointer's ``expires`` names; None when it has none. Raises PointerSignatureError naming the
    field when it is present but not ``YYYY-MM-DDTHH:MM:SSZ`` (a real UTC instant)."""
    if FIELD not in state:
        return None
    value = state[FIELD]
    try:
        if not (isinstance(value, str) and INSTANT.fullmatch(value)):
            raise ValueError
        return _at(value)
    except ValueError:
        raise PointerSignatureError(f"{path}: malformed pointer field {FIELD!r}: {str(value)[:64]!r} is not a UTC "
                                    "instant YYYY-MM-DDTHH:MM:SSZ", path=str(path), key_id=key_id,
                                    hint=_REFRESH) from None


def check(path: Path, state: Mapping[str, Any], key_id: str | None, now: datetime | None = None) -> str | None:
    """For a pointer whose seal verified: its ``expires`` (None: it has none). Raises PointerExpiredError naming
    the instant when it is at or before ``now`` (default: the system clock), PointerSignatureError when malformed."""
    until = parse(path, state, key_id)
    if until is None:
        return None
    now = now or datetime.now(UTC)
    if now >= until:
        raise PointerExpiredError(f"{path}: the pointer expired at {instant(until)} (it is now {instant(now)}): "
                                  f"a pointer kept past its expiry is refused (frozen or replayed)", path=str(path),
                                  expires=instant(until), key_id=key_id, hint=_REFRESH)
    return instant(until)


def soon(expires: str | None, now: datetime | None = None) -> str | None:
    """A warning when ``expires`` (a pointer's, ``stated``) is less than ``WARN_WITHIN`` away or past, else None
    (also for None and for what is not an instant)."""
    if expires is None or not INSTANT.fullmatch(expires):
        return None
    try:
        left = _at(expires) - (now or datetime.now(UTC))
    except ValueError:
        return None
    if left >= WARN_WITHIN:
        return None
    if left <= timedelta(0):
        return f"the active pointer expired at {expires}: readers that check its seal refuse it; {_REFRESH}"
    return (f"the active pointer expires at {expires}, in {left.total_seconds() / 3600:.1f} h; then readers that "
            f"check its seal refuse it; {_REFRESH}")


__all__ = ["DURATION", "FIELD", "INSTANT", "LONGEST", "WARN_WITHIN", "check", "instant", "parse", "parse_duration",
           "soon", "stamp", "stated", "valid_for"]
