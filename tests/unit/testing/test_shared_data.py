"""The rule for data-dependent tests: a missing shared-data file skips outside CI and fails
in CI, naming the path; present files pass through."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfabric.testing.shared_data import in_ci, require_data, shared_data


def test_the_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("LLMFABRIC_SHARED_DATA", str(tmp_path))
    assert shared_data("traces", "x.csv") == tmp_path / "traces" / "x.csv"
    monkeypatch.delenv("LLMFABRIC_SHARED_DATA")
    assert shared_data().parts[-2:] == ("shared", "data")


@pytest.mark.parametrize(("ci", "outcome"), [
    ("", pytest.skip.Exception), ("0", pytest.skip.Exception),
    ("true", pytest.fail.Exception), ("1", pytest.fail.Exception),
    ("YES", pytest.fail.Exception)])
def test_missing_data_skips_outside_ci_and_fails_in_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str,
        outcome: type[BaseException]) -> None:
    monkeypatch.setenv("CI", ci)
    present, absent = tmp_path / "here.csv", tmp_path / "gone.csv"
    present.write_text("x\n")
    require_data(present)  # nothing to say
    with pytest.raises(outcome, match=r"gone\.csv"):
        require_data(present, absent)
    assert in_ci() is (outcome is pytest.fail.Exception)
