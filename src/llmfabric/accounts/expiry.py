"""Key expiry as people write it: `30d`, `12h`, `2027-01-31` or `2027-01-31T12:00:00Z`.

`parse_duration` reads a duration (also the Batch API's `--batch-retention`);
`parse_expiry` turns the text of `llmfabric keys create --expires` (and of the admin API's
`expires_at`, which also takes Unix seconds) into Unix seconds; `expired_message` is what an
expired key's holder is told.
"""

from __future__ import annotations

import datetime as dt
import re

from llmfabric.accounts.errors import InvalidRequest

_UNITS_S = {"m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"([1-9][0-9]{0,6})([mhdw])")
FORMS = ("a duration from now (90m, 12h, 30d, 2w), a UTC date (2027-01-31: its start, "
         "00:00 UTC) or a date and time (2027-01-31T12:00:00Z; without a zone: UTC)")


def parse_duration(text: str) -> int | None:
    """Seconds of a duration as people write it (90m, 12h, 30d, 2w), or None for other
    text."""
    m = _DURATION.fullmatch(text.strip())
    return int(m[1]) * _UNITS_S[m[2]] if m is not None else None


def parse_expiry(text: str, now: float) -> float:
    """Unix seconds of the expiry `text` names, relative to `now` for a duration; raises
    InvalidRequest for anything else (the policy checks that it is in the future)."""
    spec = text.strip()
    if (seconds := parse_duration(spec)) is not None:
        return now + seconds
    try:
        if len(spec) == 10:  # (a date alone: fromisoformat would read it as local time)
            day = dt.date.fromisoformat(spec)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()
        when = dt.datetime.fromisoformat(spec)
    except ValueError:
        raise InvalidRequest(f"cannot read expiry {text!r}: give {FORMS}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def format_time(ts: float) -> str:
    """Unix seconds as an ISO 8601 UTC time, to the second."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expired_message(expires_at: float) -> str:
    """What the holder of a key that expired at `expires_at` is told (401 expired_api_key)."""
    return (f"this API key expired at {format_time(expires_at)}; ask whoever issued it "
            "for a new one (`llmfabric keys create`)")
