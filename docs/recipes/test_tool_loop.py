"""python-tool-loop.md: tool_loop.run_loop with a scripted list of tool calls standing in for
the model, against a real server through the Python SDK."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from sessionbox import Client

from conftest import Sessionbox
from tool_loop import TOOLS, Model, dispatch, run_loop


def scripted(turns: list[list[tuple[str, dict[str, Any]]]]) -> Model:
    """A stand-in model: each turn's tool calls, in order, then none."""
    it: Iterator[list[tuple[str, dict[str, Any]]]] = iter(turns)
    n = 0

    def model(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        nonlocal n
        calls = []
        for name, args in next(it, []):
            n += 1
            calls.append({"id": f"call_{n}", "name": name, "arguments": json.dumps(args)})
        return calls

    return model


@pytest.fixture()
def sb(sessionbox: Sessionbox) -> Iterator[Client]:
    with Client(sessionbox.url, sessionbox.key) as c:
        yield c
        for cid in ("loop-alice", "loop-bob"):
            c.destroy_conversation(cid)


def results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_tool_definitions_are_json_schema() -> None:
    for tool in TOOLS:
        assert set(tool) == {"name", "description", "parameters"}
        assert tool["parameters"]["type"] == "object"
        assert set(tool["parameters"].get("required", [])) <= set(tool["parameters"]["properties"])


def test_scripted_model_drives_the_workspace(sb: Client) -> None:
    model = scripted([
        [("write", {"path": "src/greet.py", "content": "print('hello')\n"})],
        [("bash", {"command": "python3 src/greet.py"}), ("ls", {"path": "."})],
        [("edit", {"path": "src/greet.py", "old_string": "hello", "new_string": "goodbye"})],
        [("read", {"path": "src/greet.py"}), ("read", {"path": "missing.txt"})],
        [("frobnicate", {}), ("bash", {"nope": 1})],
    ])
    out = results(run_loop(sb, "loop-alice", model, "write a greeting script and run it"))
    assert out[0] == "wrote src/greet.py"
    assert out[1] == "hello\nexit code: 0"
    assert out[2] == "src/"
    assert out[3] == "1 replacement(s) in src/greet.py"
    assert out[4] == "print('goodbye')\n"
    assert out[5].startswith("error (not_found):"), out[5]
    assert out[6] == "error: unknown tool frobnicate"
    assert out[7].startswith("error: bad arguments for bash"), out[7]
    # Effects are real: the file is there for the SDK too, and another conversation is empty.
    assert sb.read_text("loop-alice", "src/greet.py") == "print('goodbye')\n"
    bob = results(run_loop(sb, "loop-bob", scripted([[("ls", {}), ("read", {"path": "src/greet.py"})]]), "?"))
    assert bob[0] == "" and bob[1].startswith("error (not_found):"), bob


def test_a_long_output_reaches_the_model_cut_and_marked(sb: Client) -> None:
    out = dispatch(sb, "loop-long", "bash", '{"command": "yes | head -c 5000000"}')
    assert len(out) < 70_000, len(out)
    assert out.endswith("[output cut: redirect it to a file, then read parts of it]\nexit code: 0"), out[-120:]
