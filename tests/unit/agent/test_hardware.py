from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Sequence

import pytest

from llmfabric.agent.hardware import discover_hardware, parse_nvidia_smi

SMI = "NVIDIA H100 80GB HBM3, 81559 MiB\nNVIDIA H100 80GB HBM3, 81559 MiB\n"


def fake_run(output: str):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> str:
        assert argv[0] == "nvidia-smi"
        return output
    return run


def test_parse_nvidia_smi() -> None:
    gpus = parse_nvidia_smi(SMI + "\n garbage line\n")
    assert [(g.name, g.memory_gb) for g in gpus] == [("NVIDIA H100 80GB HBM3", 85.5)] * 2


def test_gpus_found_and_normalised() -> None:
    hw = discover_hardware(run=fake_run(SMI), use_nvml=False)
    assert hw.gpu_count == 2 and hw.gpu_memory_gb == 85.5
    assert hw.gpu_model in ("H100-SXM", "H100-80GB-HBM3")  # catalog name when sim knows it
    assert hw.cpu_count == (os.cpu_count() or 0)


def test_overrides() -> None:
    hw = discover_hardware(run=fake_run(SMI), use_nvml=False, gpu_count=1, gpu_memory_gb=40)
    assert (hw.gpu_count, hw.gpu_memory_gb) == (1, 40)
    cpu = discover_hardware(run=fake_run(SMI), use_nvml=False, gpu="cpu")
    assert (cpu.gpu_model, cpu.gpu_count) == ("cpu", 0)
    none = discover_hardware(run=fake_run(""), use_nvml=False)
    assert (none.gpu_model, none.gpu_count) == ("cpu", 0)
    forced = discover_hardware(run=fake_run(""), use_nvml=False, gpu="A100-80GB", gpu_count=4)
    assert (forced.gpu_model, forced.gpu_count) == ("A100-80GB", 4)


def test_real_nvidia_smi_binary_on_path(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920 MiB'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    hw = discover_hardware(use_nvml=False)
    assert hw.gpu_count == 1 and hw.gpu_memory_gb == pytest.approx(85.9, abs=0.1)
    assert "A100" in hw.gpu_model
