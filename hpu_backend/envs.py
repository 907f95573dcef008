"""Every environment variable the project reads or sets: one typed entry each, read when asked, never at import.

``envs.get(NAME)`` (or ``envs.NAME``) parses the variable by its entry: the entry's default when it is unset or
empty, a ``EnvError`` naming the variable and what its entry allows when the value is bad. A caller that tests
with a mapping of its own passes it as ``env=``. ``docs/reference/environment.md`` is generated from this table
(``python .ci/envdoc.py --write``), and a test fails on any variable the code reads that is not in it.

Torch-free and import-cheap: the lowest floors read it. ``recipecache`` sits below ``hpu_backend`` and reads its own
variables; they are listed here, marked with the modules that read them, as are those of modules read elsewhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import HpuBackendError
from .units import SIZE_FORMS, parse_size

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
MAX_CARDS = 4096  # no machine holds more simulated cards than this; a larger value is a typo


class EnvError(HpuBackendError, ValueError):
    """An environment variable with a value its entry does not allow (the message names both)."""


@dataclass(frozen=True)
class Var:
    """One environment variable: its form, its default, what it does, and the modules that read or set it."""

    name: str
    kind: str  # flag | int | number | text | choice | path | size | set (the project writes it for its children)
    default: Any
    doc: str
    readers: tuple[str, ...]
    topic: str
    choices: tuple[str, ...] = ()
    low: float | None = None  # int and number: the range allowed
    high: float | None = None
    unit: str = ""  # int: what is counted ("cards")
    form: str = ""  # text: the form a value takes, in words
    option: str = ""  # the compile option (``Settings`` field) this variable sets; ``Settings`` parses it

    def allowed(self) -> str:
        """What a value may be, in words (the error messages and the docs page say the same)."""
        if self.kind == "flag":
            return "1/true/yes/on or 0/false/no/off"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "int":
            return f"a whole number{' of ' + self.unit if self.unit else ''} from {_n(self.low)} to {_n(self.high)}"
        if self.kind == "number":
            return f"a number from {_n(self.low)} to {_n(self.high)}"
        if self.kind == "size":
            return SIZE_FORMS
        return self.form or {"path": "a file or folder path", "set": "(set by the project)"}.get(self.kind, "any text")

    def parse(self, text: str) -> Any:
        """The typed value of ``text`` (stripped); ``EnvError`` when the entry does not allow it."""
        value = _parse(self, text.strip())
        if value is None:
            raise EnvError(f"environment variable {self.name}={text!r} is not valid: use {self.allowed()}")
        return value


def _n(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _parse(var: Var, text: str) -> Any:
    """The value, or None when ``text`` is not allowed."""
    if var.kind == "flag":
        low = text.lower()
        return True if low in _TRUE else False if low in _FALSE else None
    if var.kind == "choice":
        return text if text in var.choices else None
    if var.kind == "int":
        ok = text.isascii() and text.lstrip("-").isdigit() and var.low <= int(text) <= var.high
        return int(text) if ok else None
    if var.kind == "number":
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) and var.low <= number <= var.high else None
    if var.kind == "size":
        return parse_size(text)
    return text


@dataclass(frozen=True)
class Family:
    """Variables named by a pattern (vLLM-Gaudi's bucket grid): read by a plan from its own mapping."""

    pattern: str  # a regular expression over the whole name
    example: str
    doc: str
    readers: tuple[str, ...]
    topic: str


_SETTINGS = ("hpu_backend.settings",)
_RANKS = ("hpu_backend.run.ranks",)
_BUCKETS = ("hpu_backend.planning.serving.buckets",)
_DEVICE = "Simulated device"
_LAUNCH = "Launcher and ranks"
_CACHE = "Recipe cache and shipped files"
_COMPILE = "Compile options"
_INTEL = "Intel Gaudi bridge names"
_SERVING = "Serving plan (vLLM-Gaudi)"
_CLI = "hpurecipe command line"

# The table. Compile options first (``Settings`` holds their text and parsing), then by topic.
VARIABLES: dict[str, Var] = {v.name: v for v in (
    Var("HPU_BACKEND_STRICT", "flag", False, "", _SETTINGS, _COMPILE, option="strict"),
    Var("HPU_BACKEND_TARGET", "choice", "gaudi2", "", (*_SETTINGS, "hpu_backend.run.launcher (sets it)"), _COMPILE,
        choices=("gaudi2", "gaudi3"), option="target"),
    Var("HPU_BACKEND_BUCKETS", "text", "exp", "", _SETTINGS, _COMPILE, option="buckets",
        form="exact, exp[:MIN[:MAX]], lin:STEP[:MAX] or list:B1,B2,..."),
    Var("HPU_BACKEND_FUSION", "flag", True, "", _SETTINGS, _COMPILE, option="fusion"),
    Var("PT_HPU_PLACE_ON_CPU", "text", "", "", _SETTINGS, _COMPILE, option="place_on_cpu",
        form="aten op names, comma-separated"),
    Var("HPU_BACKEND_DTYPE_POLICY", "choice", "native", "", _SETTINGS, _COMPILE, choices=("native", "fp8"),
        option="dtype_policy"),
    Var("PT_HPU_MAX_COMPOUND_OP_SIZE", "int", 0, "", _SETTINGS, _COMPILE, low=0, high=2 ** 31 - 1,
        option="max_compound_op_size"),
    Var("HPU_BACKEND_CACHE", "flag", True, "", _SETTINGS, _COMPILE, option="cache"),
    Var("PT_HPU_RECIPE_CACHE_CONFIG", "text", "", "", (*_SETTINGS, "recipecache.config"), _COMPILE,
        option="cache_config", form="<path>,<delete_on_start true|false>,<max_size_mb>"),
    Var("HPU_BACKEND_RECOMPILE_WARN", "int", 4, "", _SETTINGS, _COMPILE, low=0, high=2 ** 31 - 1,
        option="recompile_warn"),
    Var("HPU_BACKEND_MODEL", "text", "", "", _SETTINGS, _COMPILE, option="model"),
    Var("HPU_BACKEND_EXECUTE", "flag", True, "", _SETTINGS, _COMPILE, option="execute"),
    Var("PT_HPU_USE_EAGER_FALLBACK", "flag", True,
        "Intel's name: 0 raises on a graph that cannot run on the device, as HPU_BACKEND_STRICT=1 does",
        _SETTINGS, _INTEL),
    # The simulated device
    Var("HPU_SIM_CARDS", "int", 1, "how many cards the simulated device has (device_count())",
        ("hpu_backend.device.module", "hpu_backend.run.environment"), _DEVICE, low=1, high=MAX_CARDS, unit="cards"),
    Var("HPU_SIM_RELEASE", "text", "", "the Gaudi software release the device simulates (its default mode)",
        ("hpu_backend.device.release",), _DEVICE),
    Var("PT_HPU_LAZY_MODE", "choice", "", "1: lazy mode for the whole process; 0: eager with torch.compile "
        "(the default from Gaudi software 1.21 on)", ("hpu_backend.device.release", "hpu_backend.gaudi.lazy_mode"),
        _DEVICE, choices=("0", "1")),
    Var("HPU_BACKEND_HBM_BYTES", "size", None, "the device memory one simulated card holds (default: the "
        "target's HBM)", ("hpu_backend.device.memory", "hpu_backend.run.environment"), _DEVICE),
    Var("PT_HPU_METRICS_FILE", "path", "", "write the bridge's metrics as JSON here at exit (-rankN added under "
        "RANK)", ("hpu_backend.metrics",), _INTEL),
    Var("LOG_LEVEL_PT_FALLBACK", "int", None, "1 or 0: print each op run on the CPU and a frequency table at exit",
        ("hpu_backend.serve.fallback",), _INTEL, low=0, high=6),
    Var("LOG_LEVEL_ALL", "int", None, "the level of every log of Intel's bridge; LOG_LEVEL_PT_FALLBACK over it",
        ("hpu_backend.serve.fallback",), _INTEL, low=0, high=6),
    Var("ENABLE_CONSOLE", "flag", False, "true: the CPU fallback lines go to stderr rather than the log",
        ("hpu_backend.serve.fallback",), _INTEL),
    Var("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST", "path", "", "a file of op names autocast runs in bf16",
        ("hpu_backend.gaudi.mixed_precision",), _INTEL),
    Var("LOWER_LIST", "path", "", "the older name of PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
        ("hpu_backend.gaudi.mixed_precision",), _INTEL),
    Var("PT_HPU_AUTOCAST_FP32_OPS_LIST", "path", "", "a file of op names autocast runs in fp32",
        ("hpu_backend.gaudi.mixed_precision",), _INTEL),
    Var("FP32_LIST", "path", "", "the older name of PT_HPU_AUTOCAST_FP32_OPS_LIST",
        ("hpu_backend.gaudi.mixed_precision",), _INTEL),
    # The launcher and the ranks it starts (torchrun's and Open MPI's names, which a rank reads)
    Var("WORLD_SIZE", "int", 1, "ranks in the job; a precompiled graph is built for one layout",
        ("hpu_backend.serve.precompiled", "hpu_backend.run.report", "hpu_backend.run.environment",
         "hpu_backend.device.module", "hpu_backend.gaudi.distributed", *_RANKS), _LAUNCH, low=1, high=MAX_CARDS),
    Var("RANK", "int", 0, "this process's rank: per-rank metrics files, reports, traces and cache folders",
        ("hpu_backend.metrics", "hpu_backend.run.report", "hpu_backend.run.environment", "hpu_backend.device.setup",
         "hpu_backend.gaudi.distributed", "recipecache.config", *_RANKS), _LAUNCH, low=0, high=MAX_CARDS - 1),
    Var("LOCAL_RANK", "int", 0, "this process's card on its host", ("hpu_backend.run.environment",
        "hpu_backend.gaudi.distributed", "recipecache.config", *_RANKS), _LAUNCH, low=0, high=MAX_CARDS - 1),
    Var("LOCAL_WORLD_SIZE", "int", 1, "ranks on this host", ("hpu_backend.run.environment",
        "hpu_backend.device.module", *_RANKS), _LAUNCH, low=1, high=MAX_CARDS),
    Var("GROUP_RANK", "set", "0", "torchrun's node rank, set for every rank", _RANKS, _LAUNCH),
    Var("MASTER_ADDR", "set", "127.0.0.1", "the rendezvous host, set for every rank",
        (*_RANKS, "hpu_backend.run.launcher"), _LAUNCH),
    Var("MASTER_PORT", "set", "", "the rendezvous port (a free one), set for every rank",
        (*_RANKS, "hpu_backend.run.launcher"), _LAUNCH),
    Var("OMPI_COMM_WORLD_RANK", "set", "", "Open MPI's RANK: read when torchrun's are not set",
        (*_RANKS, "hpu_backend.gaudi.distributed", "hpu_backend.run.launcher"), _LAUNCH),
    Var("OMPI_COMM_WORLD_SIZE", "set", "", "Open MPI's WORLD_SIZE", (*_RANKS, "hpu_backend.gaudi.distributed"),
        _LAUNCH),
    Var("OMPI_COMM_WORLD_LOCAL_RANK", "set", "", "Open MPI's LOCAL_RANK",
        (*_RANKS, "hpu_backend.gaudi.distributed"), _LAUNCH),
    Var("OMPI_COMM_WORLD_LOCAL_SIZE", "set", "", "Open MPI's LOCAL_WORLD_SIZE", _RANKS, _LAUNCH),
    Var("OMPI_COMM_WORLD_NODE_RANK", "set", "", "Open MPI's node rank", _RANKS, _LAUNCH),
    Var("PMI_RANK", "text", "", "an MPI launcher's rank: the script runs under one (no rendezvous of ours)",
        ("hpu_backend.run.launcher",), _LAUNCH),
    Var("HPU_BACKEND_RUN_RANK", "flag", False, "set in every rank the launcher starts: a stop still writes the "
        "rank's report", ("hpu_backend.run.report", "hpu_backend.run.script", "hpu_backend.run.launcher",
                          *_RANKS), _LAUNCH),
    Var("HPU_BACKEND_RUN_PARENT", "set", "", "the launcher's process id, set in every rank (a rank ends with it)",
        ("hpu_backend.run.group", *_RANKS), _LAUNCH),
    Var("TORCH_DEVICE_BACKEND_AUTOLOAD", "choice", "1", "torch's switch: 1 loads the simulated Intel modules at "
        "start (hccl registered), as `import torch` does on Gaudi since 1.18", ("hpu_backend.run.names",), _LAUNCH,
        choices=("0", "1")),
    Var("HPU_BACKEND_DIST_PATH", "path", "", "the folder holding the simulated habana-torch-plugin's metadata, "
        "inherited by the processes a script starts", ("hpu_backend.run.distribution",), _LAUNCH),
    # The recipe cache (recipecache reads its own) and the files the tools ship
    Var("HPU_RECIPE_CACHE_POLICY", "choice", "created", "which entries eviction drops first: the oldest created "
        "(Gaudi's) or the least recently used", ("recipecache.config",), _CACHE, choices=("created", "lru")),
    Var("HPU_RECIPE_CACHE_REMOTE", "text", "", "the fleet tier (none: off)", ("recipecache.config",), _CACHE,
        form="redis://[:password@]host:port/db, rediss://..., unix://... or none"),
    Var("HPU_RECIPE_CACHE_REMOTE_TTL", "number", 7 * 86400, "seconds an entry lives in the fleet tier",
        ("recipecache.config",), _CACHE, low=1e-3, high=1e12),
    Var("HPU_RECIPE_CACHE_LAUNCH_ID", "text", "", "the launch this process belongs to (set for its children); "
        "delete_on_start clears the cache once per launch", ("recipecache.startup",), _CACHE),
    Var("TORCHELASTIC_RUN_ID", "text", "", "torchrun's launch id (none: not set)", ("recipecache.startup",), _CACHE),
    Var("PMIX_NAMESPACE", "text", "", "a PMIx launcher's launch id", ("recipecache.startup",), _CACHE),
    Var("SLURM_JOB_ID", "text", "", "Slurm's job id (with SLURM_STEP_ID, the launch id)", ("recipecache.startup",),
        _CACHE),
    Var("SLURM_STEP_ID", "text", "", "Slurm's step of the job", ("recipecache.startup",), _CACHE),
    Var("XDG_CACHE_HOME", "path", "~/.cache", "the default cache is $XDG_CACHE_HOME/hpu_backend/recipes",
        ("recipecache.config",), _CACHE),
    Var("HPURECIPE_BUNDLE_KEY", "text", "", "the team key that signs and checks bundles, packages, precompiled "
        "files and fleet entries (never stored; precompiled files are signed with this machine's own key without it)",
        ("recipecache.signing",), _CACHE),
    Var("XDG_CONFIG_HOME", "path", "~/.config", "this machine's own signing key (precompiled files) is "
        "$XDG_CONFIG_HOME/hpu_backend/machine.key", ("recipecache.signing",), _CACHE),
    # The command line
    Var("HPURECIPE_TRACEBACK", "flag", False, "1: an error prints its traceback before its one line",
        ("hpurecipe.errors",), _CLI),
    Var("COLUMNS", "int", None, "the width tables are drawn to (default: the terminal's, 160 in a pipe)",
        ("hpurecipe.render",), _CLI, low=1, high=100_000),
    # The serving plan: the process environment's VLLM_*, under hpurecipe serving-plan --env
    Var("VLLM_GRAPH_RESERVED_MEM", "number", 0.1, "the share of free device memory kept for graphs",
        ("hpurecipe.servingcmd",), _SERVING, low=0, high=0.999999),
    Var("RUNTIME_SCALE_PATCHING", "choice", "0", "1: fp8 scales patched at run time (vLLM-Gaudi's reading)",
        ("hpurecipe.servingcmd",), _SERVING, choices=("0", "1")),
    Var("VLLM_BUCKETING_STRATEGY", "choice", "exp", "the bucket grid's strategy", _BUCKETS, _SERVING,
        choices=("exp", "lin", "pad")),
    Var("VLLM_EXPONENTIAL_BUCKETING", "flag", True, "the older switch: false is the linear grid", _BUCKETS,
        _SERVING),
    Var("VLLM_BUCKETING_FROM_FILE", "path", "", "a file listing the buckets", _BUCKETS, _SERVING),
    Var("VLLM_CONTIGUOUS_PA", "flag", None, "contiguous paged attention (the decode grid's block dimension)",
        _BUCKETS, _SERVING),
)}

FAMILIES: tuple[Family, ...] = (
    Family(r"VLLM_(PROMPT|DECODE)_(BS|SEQ|BLOCK|QUERY|CTX)_BUCKET_(MIN|STEP|MAX|LIMIT|PAD_MAX|PAD_PERCENT)",
           "VLLM_PROMPT_QUERY_BUCKET_MAX", "the bounds and steps of vLLM-Gaudi's bucket grid, read as its plugin "
           "reads them", (*_BUCKETS, "hpurecipe.servingcmd"), _SERVING),
)


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The typed value of ``name`` (its default when unset or empty); ``EnvError`` for a bad value."""
    var = VARIABLES[name]
    text = (os.environ if env is None else env).get(name, "")
    return var.parse(text) if text.strip() else var.default


def is_set(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` has a value (not empty) in the environment."""
    if name not in VARIABLES:
        raise KeyError(name)
    return bool((os.environ if env is None else env).get(name, "").strip())


def __getattr__(name: str) -> Any:
    if name in VARIABLES:  # read now, from the environment as it is now: nothing is cached
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *VARIABLES])
