"""Slurm launch profiles: one YAML file says where and how a provider job runs.

    name: llama-8b
    partition: gpu
    account: myproject
    gpus: 4                      # per node; gpu_type: a100 -> --gres=gpu:a100:4
    cpus: 16
    memory: 128G
    time: "04:00:00"
    modules: [cuda/12.4]
    setup: ["source ~/venvs/vllm/bin/activate"]
    container: {runtime: apptainer, image: docker://vllm/vllm-openai:latest}
    engine: vllm serve meta-llama/Llama-3.1-8B-Instruct --port {port}
    fabric:
      bootstrap: [ingress.example.org:7946]
      secret_file: ~/.llmfabric/network.secret
      preset: wan
    signal_lead: 120

Validated at the boundary (pydantic): every value that reaches the sbatch script is checked
for newlines and quoted when rendered (launch/sbatch.py), so a profile cannot inject shell.
"""

from __future__ import annotations

import pathlib
import re
import shlex
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from llmfabric.launch.errors import ProfileError, profile_problems

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# Slurm --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")
_MEMORY = re.compile(r"^\d+[KMGT]?\Z")


def time_limit_s(text: str) -> int:
    """Seconds of a Slurm `--time` value ("90" is minutes, "1:30:00", "2-00:00:00")."""
    m = _TIME.match(text)  # (not stripped: the value goes into the script as written)
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time (minutes, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if b is None:  # minutes
        return int(a) * 60
    if c is None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 3600 + int(b) * 60 + int(c)


# A value of an #SBATCH line: Slurm's directive parser splits words on any whitespace (tab,
# \v and \f too), ends the line at '#' and unescapes '\' even inside quotes, so a value with
# any of those can carry a directive of its own (`partition: "gpu\t--account=theirs"`).
# Partition, account, QoS, GRES type, constraint expressions (`a100&ib`, `[r1|r2]`) and
# output patterns (`logs/%x-%j.out`) need none of them.
_DIRECTIVE = re.compile(r"^[A-Za-z0-9_.,:/%=@+\-&|\[\]*!~]+\Z")


def _directive(value: str, what: str) -> str:
    if not _DIRECTIVE.match(value):
        raise ValueError(f"{what} {value!r}: an #SBATCH value takes letters, digits and "
                         "'_.,:/%=@+-&|[]*!~' only (no spaces, quotes, '#' or '\\')")
    return value


def _one_line(value: str, what: str) -> str:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError(f"{what} must be one line")
    return value


class Container(BaseModel):
    """Run the engine in a container; the node itself runs on the host and supervises it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    runtime: Literal["apptainer", "enroot", "pyxis"]
    image: str
    mounts: tuple[str, ...] = ()  # "src:dst" (apptainer --bind, enroot --mount, pyxis mounts)
    args: tuple[str, ...] = ()  # extra arguments of the runtime

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        return _one_line(v, "container.image")

    @field_validator("mounts", "args")
    @classmethod
    def _words(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_one_line(x, "value") for x in v)


class Fabric(BaseModel):
    """How the job's node joins the fabric."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    bootstrap: tuple[str, ...] = Field(min_length=1)
    secret_file: str  # read at job start into LLMFABRIC_NETWORK_SECRET; never in the script
    network: str | None = None
    preset: Literal["lan", "wan", "local"] = "wan"
    provider: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    llmfabric: str = "llmfabric"  # how to run the CLI on the compute node
    home: str = "$HOME/.llmfabric/slurm/$SLURM_JOB_ID"  # node key and logs, one per job
    listen: str = "0.0.0.0:0"
    http_listen: str = "0.0.0.0:0"
    drain_timeout: float = Field(default=20.0, ge=0)
    args: tuple[str, ...] = ()  # more `llmfabric start` arguments

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _bootstrap(cls, v: Any) -> Any:
        return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v

    @field_validator("bootstrap", "args")
    @classmethod
    def _words(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_one_line(x, "value") for x in v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            _one_line(key + value, "label")
            if "=" in key or not key:
                raise ValueError(f"label key {key!r} must be non-empty and hold no '='")
        return v

    @field_validator("network", "provider", "llmfabric", "listen", "http_listen")
    @classmethod
    def _line(cls, v: str | None) -> str | None:
        return None if v is None else _one_line(v, "value")


class Controller(BaseModel):
    """What `llmfabric controller --launcher slurm` needs to size the fleet of these jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    model: str  # the model the engine serves (demand for it drives submissions)
    capacity_rps: float | None = Field(default=None, gt=0)  # requests/s one job sustains
    # Without capacity_rps: the simulator's capacity of one replica of `model` on the job's
    # GPUs (`gpu`: a simulator catalog name, e.g. H100-SXM) at these mean lengths.
    gpu: str | None = None
    mean_in: float = Field(default=512.0, ge=1)
    mean_out: float = Field(default=128.0, ge=1)
    min_jobs: int = Field(default=0, ge=0)
    max_jobs: int = Field(default=4, ge=1)
    startup_s: float = Field(default=300.0, ge=0)  # submit -> SERVING once running
    idle_s: float = Field(default=300.0, ge=0)  # surplus this long -> cancel a job

    @model_validator(mode="after")
    def _capacity_source(self) -> Controller:
        if self.capacity_rps is None and self.gpu is None:
            raise ValueError("give capacity_rps (requests/s one job sustains) or gpu (the "
                             "simulator then estimates it)")
        return self


class SlurmProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = "provider"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = Field(default=1, ge=1)
    gpus: int = Field(default=0, ge=0)
    gpu_type: str | None = None
    cpus: int | None = Field(default=None, ge=1)
    memory: str | None = None
    time: str = "01:00:00"
    constraint: str | None = None
    sbatch: tuple[str, ...] = ()  # extra sbatch options, e.g. ["--exclusive"]
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()  # shell lines run before the node starts (venv, conda, ...)
    env: dict[str, str] = Field(default_factory=dict)
    container: Container | None = None
    engine: tuple[str, ...] = Field(min_length=1)  # argv; "{port}" becomes a free port
    fabric: Fabric
    signal_lead: int = Field(default=120, ge=10, le=65535)  # s before the end: TERM, drain
    output: str = "llmfabric-%j.out"
    controller: Controller | None = None

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("engine")
    @classmethod
    def _engine_lines(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # sbatch refuses scripts with \r (DOS line breaks); a newline has no place in argv.
        return tuple(_one_line(x, "engine argument") for x in v)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return {k: _one_line(x, f"env {k}") for k, x in v.items()}

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: letters, digits, '_', '.', '-' (at most 64)")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        if time_limit_s(v) <= 0:
            raise ValueError("the time limit must be positive")
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None and not _MEMORY.match(v):
            raise ValueError(f"{v!r} is not a Slurm memory size (e.g. 64G, 512000M)")
        return v

    @field_validator("partition", "account", "qos", "gpu_type", "constraint", "output")
    @classmethod
    def _line(cls, v: str | None) -> str | None:
        return None if v is None else _directive(v, "value")

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for opt in v:
            _directive(opt, "sbatch option")
            if not opt.startswith("-"):
                raise ValueError(f"sbatch option {opt!r} must start with '-'")
        return v

    @field_validator("modules", "setup")
    @classmethod
    def _lines(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_one_line(x, "entry") for x in v)

    @model_validator(mode="after")
    def _lead_inside_the_limit(self) -> SlurmProfile:
        if self.signal_lead >= self.time_s:
            raise ValueError(f"signal_lead ({self.signal_lead} s) must be shorter than the time "
                             f"limit ({self.time_s} s): the node would drain as it starts")
        return self

    @property
    def job_name(self) -> str:
        return f"llmfabric-{self.name}"

    @property
    def time_s(self) -> int:
        return time_limit_s(self.time)


def parse_profile(data: Any, source: str = "profile") -> SlurmProfile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source} must hold a mapping of option: value")
    try:
        return SlurmProfile(**{str(k).replace("-", "_"): v for k, v in data.items()})
    except ValidationError as exc:
        problems = profile_problems(exc, "docs/deploy-slurm.md, Provider jobs")
        raise ProfileError(f"invalid Slurm profile {source}: {problems}") from None


def load_profile(path: pathlib.Path) -> SlurmProfile:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {path} is not valid YAML: {exc}") from None
    return parse_profile(data, str(path))
