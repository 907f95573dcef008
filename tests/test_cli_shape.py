"""The command line stays thin: short functions that parse, call the library and render; the checks it relies on
live in the library, next to the settings they check (and answer Python callers the same way)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpu_backend.errors import first_line, one_line
from hpu_backend.planning.serving.arguments import ServingArgs, ServingArgsError, check, read_plan
from hpu_backend.planning.serving.plan import PlanError
from hpu_backend.targets import DEVICES, target_problem
from cli_helpers import cli

CLI = Path(__file__).resolve().parent.parent / "cli" / "hpurecipe"
LONGEST = 60  # lines of one function in cli/hpurecipe, its signature and docstring included


def test_no_function_of_the_cli_is_long():
    files = sorted(CLI.glob("*.py"))
    assert len(files) > 10
    long = [f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in files for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST]
    assert long == []


def test_the_target_check_names_the_devices():
    assert all(target_problem(name) is None for name in DEVICES)
    assert target_problem("tpu") == "--target 'tpu': expected gaudi2 or gaudi3"


def test_first_line_and_one_line():
    assert first_line(ValueError("\n  bad value  \nmore")) == "bad value"
    assert first_line(ValueError()) == ""
    assert first_line("x" * 10, limit=4) == "xxx…"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(RuntimeError("\nshape mismatch\nat node 3")) == "RuntimeError: shape mismatch"


@pytest.mark.parametrize("changes, message", [
    ({"target": "tpu"}, "--target 'tpu': expected gaudi2 or gaudi3"),
    ({"dtype": "fp16"}, "--dtype 'fp16': expected bf16 or fp8"),
    ({"cards": 9}, "--cards 9: a server joins 1 to 8 cards"),
    ({"max_model_len": 0}, "--max-model-len 0: expected an integer from 1 to 16,777,216"),
    ({"num_gpu_blocks_override": -1}, "--num-gpu-blocks-override -1: expected an integer from 1 to 268,435,456"),
    ({"trace": Path("t.jsonl"), "requests": 10}, "--trace reads a trace, --requests draws one: give one"),
    ({"warmup_budget": 60.0}, "--warmup-budget recommends settings for a trace: give --trace or --requests"),
    ({"env": ("PT_HPU_LAZY_MODE=1",)}, "--env 'PT_HPU_LAZY_MODE=1': expected VLLM_NAME=VALUE"),
    ({"env": ("RUNTIME_SCALE_PATCHING=yes",)}, "RUNTIME_SCALE_PATCHING='yes': expected 0 or 1"),
    ({"requests": 5, "prompt_len": "9:3"}, "--prompt-len '9:3': expected 1 <= LOW <= HIGH"),
])
def test_serving_arguments_are_checked_before_the_model_is_read(changes, message):
    args = ServingArgs(**{"model": "no-such-model.py", "max_model_len": 4096, **changes})
    with pytest.raises(ServingArgsError) as raised:
        check(args, environ={})
    assert str(raised.value).startswith(message)


def test_serving_bucket_variables_come_from_the_environment_given():
    args = ServingArgs("no-such-model.py", 4096, env=("VLLM_PROMPT_SEQ_BUCKET_STEP=256",))
    checked = check(args, environ={"VLLM_DECODE_BS_BUCKET_MAX": "64", "HOME": "/root"})
    assert checked.variables == {"VLLM_DECODE_BS_BUCKET_MAX": "64", "VLLM_PROMPT_SEQ_BUCKET_STEP": "256"}
    assert checked.requests is None and checked.context is None and checked.scale_patching is False
    with pytest.raises(ServingArgsError, match="VLLM_GRAPH_RESERVED_MEM='most'"):
        check(args, environ={"VLLM_GRAPH_RESERVED_MEM": "most"})


def test_a_serving_plan_file_that_is_not_one_is_a_usage_error(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_bytes(b'{"grid": \xff')
    with pytest.raises(ServingArgsError, match="not JSON"):
        read_plan(bad)
    with pytest.raises(ServingArgsError, match="expected a serving plan's JSON file"):
        read_plan(tmp_path)
    with pytest.raises(PlanError, match="expected the JSON of hpurecipe serving-plan --json"):
        read_plan(_written(tmp_path / "empty.json", "{}"))
    result = cli("warm", CLI.parents[1] / "models" / "mnist.py", "--serving-plan", bad, code=2)
    assert result.stderr.startswith(f"error: --serving-plan {bad}: not JSON") and result.stdout == ""


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
