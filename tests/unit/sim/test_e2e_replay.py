"""`sim.e2e`: reading measured rows, quantization, MAPE, the replay's JSON shape, the CLI, and
the calibration file itself (data-dependent: fails in CI when the data is missing)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfabric.cli.main import cli
from llmfabric.sim import SpecError, e2e, get_gpu
from llmfabric.testing.shared_data import require_data, shared_data

pytestmark = pytest.mark.unit
HEADER = ",".join(e2e.COLUMNS)
ROOT = Path(__file__).resolve().parents[3]


def _csv(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join((HEADER, *lines)) + "\n")
    return path


def _row(**kw: object) -> e2e.E2ERow:
    base: dict[str, object] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100_sxm", "backend": "vllm",
        "backend_version": "", "precision": "", "gemm_quant": "", "tp": 1, "isl": 512,
        "osl": 64, "concurrency": 4, "ttft_ms": 50.0, "tpot_ms": 8.0}
    base.update(kw)
    return e2e.E2ERow(**base)  # type: ignore[arg-type]


def test_read_rows_parses_and_rejects_hostile_input(tmp_path: Path) -> None:
    ok = _csv(tmp_path, "Qwen/Qwen3-32B,h200_sxm,SGLang,0.5,fp8,fp8,2,1024,128,16,840.5,16.5")
    (row,) = e2e.read_rows(ok)
    assert (row.backend, row.gemm_quant, row.tp, row.concurrency) == ("sglang", "fp8", 2, 16)
    assert row.ttft_ms == 840.5 and get_gpu(row.gpu).name == "H200"
    bad = ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,0,1024,128,16,1,1",  # tp 0
           "Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,10.5,128,16,1,1",  # fractional isl
           "Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024,128,16,-3,1",  # negative ttft
           "Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024,128,16,nan,1")  # NaN ttft
    for line in bad:
        with pytest.raises(SpecError, match="row 2"):
            e2e.read_rows(_csv(tmp_path, line))
    (tmp_path / "short.csv").write_text("model,gpu\nx,y\n")
    with pytest.raises(SpecError, match="missing columns"):
        e2e.read_rows(tmp_path / "short.csv")
    with pytest.raises(SpecError, match="cannot read"):
        e2e.read_rows(tmp_path / "absent.csv")
    (tmp_path / "binary.csv").write_bytes(b"model,gpu\n\x00\xfe\xff")
    with pytest.raises(SpecError, match=r"binary\.csv is not a CSV file: not UTF-8 text \(a 0xfe"):
        e2e.read_rows(tmp_path / "binary.csv")


def test_quantization_of_a_row() -> None:
    assert e2e.model_for(_row()).matmul_bits == 16
    fp8 = e2e.model_for(_row(precision="fp8", gemm_quant="fp8"))
    assert (fp8.weight_bits, fp8.kv_bits, fp8.matmul_bits) == (8, 8, 8)
    fp4 = e2e.model_for(_row(precision="fp4", gemm_quant="nvfp4"))
    assert (fp4.weight_bits, fp4.kv_bits, fp4.matmul_bits) == (4, 8, 4)
    with pytest.raises(SpecError, match="unknown quantization"):
        e2e.model_for(_row(gemm_quant="int3"))


def test_summary_mape_is_hand_computed() -> None:
    recs = [
        {"gpu": "a", "backend": "x", "ttft_ms": 100.0, "pred_ttft_ms": 110.0,
         "tpot_ms": 10.0, "pred_tpot_ms": 9.0},
        {"gpu": "a", "backend": "y", "ttft_ms": 200.0, "pred_ttft_ms": 100.0,
         "tpot_ms": 20.0, "pred_tpot_ms": 20.0},
        {"gpu": "b", "backend": "x", "ttft_ms": 50.0, "pred_ttft_ms": math.nan,
         "tpot_ms": 5.0, "pred_tpot_ms": math.nan, "error": "unknown GPU"},
    ]
    s = e2e.summarize(recs)
    assert s["all"] == {"n": 2, "ttft_mape": pytest.approx(30.0), "tpot_mape": pytest.approx(5.0)}
    assert s["by_gpu"]["a"]["n"] == 2 and s["by_gpu"]["b"]["n"] == 0
    assert math.isnan(s["by_gpu"]["b"]["ttft_mape"])
    assert s["by_backend"]["x"] == {"n": 1, "ttft_mape": pytest.approx(10.0),
                                    "tpot_mape": pytest.approx(10.0)}


def test_replay_shape_and_unknown_rows(tmp_path: Path) -> None:
    path = _csv(tmp_path,
                "meta-llama/Llama-3.1-8B-Instruct,h100_sxm,vllm,,,,1,512,32,4,60,9",
                "meta-llama/Llama-3.1-8B-Instruct,b200_sxm,trtllm,,fp8,fp8,1,512,32,4,40,5",
                "meta-llama/Llama-3.1-8B-Instruct,tpu_v9,vllm,,,,1,512,32,4,60,9")
    out = e2e.replay(path, waves=3)
    assert set(out) == {"rows", "summary"}
    assert set(out["summary"]) == {"all", "by_gpu", "by_backend"}
    assert set(out["summary"]["all"]) == {"n", "ttft_mape", "tpot_mape", "ttft_floor",
                                          "tpot_floor"}
    rows = out["rows"]
    assert len(rows) == 3 and "error" in rows[2] and "unknown GPU" in rows[2]["error"]
    assert out["summary"]["all"]["n"] == 2
    for r in rows[:2]:
        assert r["pred_ttft_ms"] > 0 and r["pred_tpot_ms"] > 0
    assert rows[1]["pred_tpot_ms"] < rows[0]["pred_tpot_ms"]  # B200 FP8 beats H100 BF16
    assert e2e.replay(path, waves=3) == out  # deterministic
    with pytest.raises(SpecError, match="waves"):
        e2e.replay(path, waves=1)


def test_cli_simulate_e2e_writes_the_json(tmp_path: Path) -> None:
    # (TTFT falls from 500 to 250 ms as the clients double: no monotone prediction can be
    # within 25 % of both, the floor the summary reports beside the MAPE)
    path = _csv(tmp_path, "Qwen/Qwen3-32B,h100_sxm,sglang,,,,2,1024,64,8,500,15",
                "Qwen/Qwen3-32B,h100_sxm,sglang,,,,2,1024,64,16,250,15")
    dest = tmp_path / "out.json"
    res = CliRunner().invoke(cli, ["simulate", "e2e", str(path), "--json", str(dest),
                                   "--waves", "3"])
    assert res.exit_code == 0, res.output
    data = json.loads(dest.read_text())
    assert data["summary"]["all"]["n"] == 2 and data["rows"][0]["backend"] == "sglang"
    assert data["summary"]["by_gpu"]["h100_sxm"]["n"] == 2
    assert data["summary"]["all"]["ttft_floor"] == pytest.approx(25.0)
    assert data["summary"]["by_backend"]["sglang"]["tpot_floor"] == 0.0
    assert "TTFT MAPE" in res.output and "own floor: 25.0 / 0.0 %" in res.output


def test_cli_closed_loop_prints_steady_and_first_wave() -> None:
    args = ["simulate", "--model", "llama-3.1-8b", "--gpu", "H100", "--concurrency", "8",
            "--input", "512", "--output", "32", "--engine-profile", "sglang"]
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["engine_profile"] == "sglang" and data["n_completed"] == 80
    assert data["steady_ttft_s"] > 0 and data["first_wave_ttft_s"] > 0
    table = CliRunner().invoke(cli, args)
    assert "TTFT steady state" in table.output and "TTFT first wave" in table.output
    missing = CliRunner().invoke(cli, ["simulate", "--gpu", "H100"])
    assert missing.exit_code != 0 and "--model and --gpu are required" in missing.output


def _calibration_file() -> Path:
    path = shared_data("e2e", "serving_e2e_calibration.csv")
    require_data(path)
    return path


def test_every_calibration_row_is_simulated() -> None:
    """Every GPU, model, backend and quantization in the file is known to the simulator."""
    rows = e2e.read_rows(_calibration_file())
    assert len(rows) >= 800
    for key in sorted({(r.model, r.gpu, r.backend, r.gemm_quant) for r in rows}):
        row = next(r for r in rows if (r.model, r.gpu, r.backend, r.gemm_quant) == key)
        small = e2e.E2ERow(**{**{c: getattr(row, c) for c in e2e.COLUMNS},
                              "concurrency": 2, "osl": 16})
        ttft, tpot = e2e.predict(small, waves=2)
        assert ttft > 0 and tpot > 0, key


@pytest.mark.parametrize(("line", "match"), [
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,inf,1024,128,16,1,1", "row 2: tp must be an integer"),
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,2048,1024,128,16,1,1", "row 2: tp must be <= 1024"),
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,2e7,128,16,1,1", "row 2: isl must be <= 10000000"),
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024,1e8,16,1,1", "row 2: osl must be <= 10000000"),
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024,128,1e7,1,1",
     "row 2: concurrency must be <= 100000"),
    ("Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024", "row 2 has too few cells: no osl, concurrency"),
])
def test_read_rows_refuses_unbounded_or_short_rows(tmp_path: Path, line: str,
                                                   match: str) -> None:
    with pytest.raises(SpecError, match=match):
        e2e.read_rows(_csv(tmp_path, line))


def test_cli_simulate_e2e_names_the_bad_row(tmp_path: Path) -> None:
    rows = _csv(tmp_path, "Qwen/Qwen3-32B,h100_sxm,vllm,,,,1,1024,128,16,1,1",
                "Qwen/Qwen3-32B,h100_sxm,vllm,,,,inf,1024,128,16,1,1")
    res = CliRunner().invoke(cli, ["simulate", "e2e", str(rows)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert "row 3: tp must be an integer" in res.output


def _curve(*points: tuple[int, float], **setup: object) -> list[dict[str, object]]:
    """Records of one set-up: (concurrency, measured TTFT ms) each."""
    base = {c: getattr(_row(**setup), c) for c in e2e.SET_UP}
    return [{**base, "concurrency": c, "ttft_ms": m, "tpot_ms": math.nan} for c, m in points]


def test_monotone_floor_is_hand_computed() -> None:
    assert e2e.monotone_floor(_curve((1, 50.0), (2, 80.0), (4, 80.0)), "ttft_ms") == 0.0
    # 100 ms at c=1, 50 ms at c=2: one prediction p for both (it may not fall); p = 50 costs
    # |50/100 - 1| = 0.5, p = 100 costs |100/50 - 1| = 1: the floor is 0.5 / 2 rows = 25 %.
    assert e2e.monotone_floor(_curve((1, 100.0), (2, 50.0)), "ttft_ms") == pytest.approx(25.0)
    # rows of one concurrency share their prediction: 100 and 200 at c=4 cost 0.5 at best
    assert e2e.monotone_floor(_curve((4, 100.0), (4, 200.0)), "ttft_ms") == pytest.approx(25.0)
    # set-ups do not constrain each other: a falling pair split over two TPs is free
    rows = _curve((1, 100.0), tp=1) + _curve((2, 50.0), tp=2)
    assert e2e.monotone_floor(rows, "ttft_ms") == 0.0
    # unmeasured rows are left out; none at all: nan
    assert e2e.monotone_floor(_curve((1, 100.0), (2, math.nan)), "ttft_ms") == 0.0
    assert math.isnan(e2e.monotone_floor(_curve((1, math.nan)), "ttft_ms"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.floats(1.0, 1e4)), min_size=1, max_size=7))
def test_monotone_floor_is_the_least_error_of_a_monotone_prediction(
        points: list[tuple[int, float]]) -> None:
    """Against brute force over every non-decreasing choice of measured values, and never
    above the error of a simple monotone predictor (the running maximum)."""
    recs = _curve(*points)
    floor = e2e.monotone_floor(recs, "ttft_ms")
    levels = sorted({c for c, _ in points})
    values = sorted({m for _, m in points})
    best = min(
        sum(abs(pick[levels.index(c)] / m - 1.0) for c, m in points)
        for pick in itertools.combinations_with_replacement(values, len(levels)))
    assert floor == pytest.approx(100.0 * best / len(points), abs=1e-9)
    running, top = {}, 0.0
    for c in levels:
        top = max(top, *(m for cc, m in points if cc == c))
        running[c] = top
    assert floor <= 100.0 * sum(abs(running[c] / m - 1.0) for c, m in points) / len(points) \
        + 1e-9
    per_level = [{m for cc, m in points if cc == c} for c in levels]
    exact = [min(v) for v in per_level]  # (a zero-error prediction, if there is one)
    monotone = all(len(v) == 1 for v in per_level) and exact == sorted(exact)
    assert (floor == 0.0) == monotone


def test_flat_floor_is_hand_computed() -> None:
    # TTFT 100 ms at OSL 64 and 200 ms at OSL 128, same concurrency: one prediction for both;
    # 100 costs |100/200 - 1| = 0.5, 200 costs 1: 0.5 over 2 rows = 25 %
    rows = _curve((4, 100.0), osl=64) + _curve((4, 200.0), osl=128)
    assert e2e.flat_floor(rows, "ttft_ms", "osl") == pytest.approx(25.0)
    # other concurrencies, or other ISLs, are other groups: nothing forced
    rows = _curve((4, 100.0), osl=64) + _curve((8, 200.0), osl=128)
    assert e2e.flat_floor(rows, "ttft_ms", "osl") == 0.0
    rows = _curve((4, 100.0), osl=64, isl=256) + _curve((4, 200.0), osl=128)
    assert e2e.flat_floor(rows, "ttft_ms", "osl") == 0.0
    # three rows: the best shared prediction is a measured value, here 110 ms
    rows = (_curve((4, 100.0), osl=64) + _curve((4, 110.0), osl=128)
            + _curve((4, 300.0), osl=256))
    best = min(sum(abs(v / m - 1) for m in (100.0, 110.0, 300.0)) for v in (100.0, 110.0, 300.0))
    assert best == pytest.approx(10 / 100 + 190 / 300)  # (at 110)
    assert e2e.flat_floor(rows, "ttft_ms", "osl") == pytest.approx(100 * best / 3)
    assert math.isnan(e2e.flat_floor(_curve((4, math.nan)), "ttft_ms", "osl"))
    with pytest.raises(SpecError, match="concurrency"):
        e2e.flat_floor(rows, "ttft_ms", "concurrency")
