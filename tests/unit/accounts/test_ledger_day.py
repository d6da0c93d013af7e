"""The usage ledger formats the UTC day once per day: whatever order the wall clock's readings
come in (NTP steps it back, days go by), every row lands on utc_day(now)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmfabric.accounts.ledger import UsageLedger, utc_day
from llmfabric.accounts.policy import clamp_tokens

DAY = 86400.0
MIDNIGHT = 1_700_006_400.0  # 2023-11-15 00:00:00 UTC


class _NoBackend:
    """record() never touches the database (only flush does)."""


def test_records_either_side_of_midnight_are_two_rows() -> None:
    now = [MIDNIGHT - 1.0]
    ledger = UsageLedger(_NoBackend(), lambda: now[0])  # type: ignore[arg-type]
    ledger.record("k", "m", 1, 1)
    now[0] = MIDNIGHT
    ledger.record("k", "m", 1, 1)
    ledger.record("k", "m", 1, 1)
    assert ledger.pending_rows == 2
    now[0] = MIDNIGHT - 0.5  # the clock stepped back
    ledger.record("k", "m", 1, 1)
    assert ledger.pending_rows == 2


@given(st.lists(st.floats(min_value=MIDNIGHT - 3 * DAY, max_value=MIDNIGHT + 3 * DAY),
                min_size=1, max_size=30))
def test_every_reading_gets_its_own_utc_day(readings: list[float]) -> None:
    now = [0.0]
    ledger = UsageLedger(_NoBackend(), lambda: now[0])  # type: ignore[arg-type]
    for i, t in enumerate(readings):
        now[0] = t
        ledger.record(f"k{i}", "m", 1, 1)  # (a row of its own: its day is the reading's)
        assert [day for key, _, day in ledger._pending if key == f"k{i}"] == [utc_day(t)]


_CLAIMS = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.booleans(),
                    st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text())


@given(st.lists(st.tuples(_CLAIMS, _CLAIMS, st.booleans()), min_size=1, max_size=20))
def test_a_row_counts_exactly_the_clamped_claims(claims: list[tuple[object, object, bool]]
                                                 ) -> None:
    """Whatever a provider claims (2**64 - 1, negatives, floats, NaN, bools, junk), the row
    holds the sums of clamp_tokens of each claim (the in-range fast path changes nothing)."""
    ledger = UsageLedger(_NoBackend(), lambda: MIDNIGHT)  # type: ignore[arg-type]
    for p, c, est in claims:
        ledger.record("k", "m", p, c, est)  # type: ignore[arg-type]
    [row] = ledger._pending.values()
    assert (row.requests, row.estimated) == (len(claims), sum(e for _, _, e in claims))
    assert row.prompt == sum(clamp_tokens(p) for p, _, _ in claims)
    assert row.completion == sum(clamp_tokens(c) for _, c, _ in claims)
