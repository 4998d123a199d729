import json
from typing import Any, Callable

from sessionbox import Client, SessionboxError

# Tool definitions in the JSON-schema shape models take (Anthropic: {"name", "description",
# "input_schema": parameters}; OpenAI: {"type": "function", "function": {..., "parameters"}}).
TOOLS: list[dict[str, Any]] = [
    {
        "name": "bash",
        "description": "Run a shell command in this conversation's workspace.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "read",
        "description": "Read a text file of the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "write",
        "description": "Write a file (created or replaced whole; parent directories are created).",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "edit",
        "description": "Replace exact text in a file; old_string must occur exactly once.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
            },
            "required": ["path", "old_string", "new_string"],
        },
    },
    {
        "name": "ls",
        "description": "List a directory of the workspace (default its root).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]


MAX_OUTPUT_BYTES = 32 * 1024


def dispatch(sb: Client, conversation_id: str, name: str, arguments: str) -> str:
    """Run one tool call of the model (its name and JSON arguments) in the conversation's
    workspace; the answer is text for the model, failures included."""
    try:
        args = json.loads(arguments)
        if name == "bash":
            # Keep what goes back to the model small: 32 KiB of each stream, and say so if cut.
            r = sb.exec(conversation_id, args["command"], output_limit=MAX_OUTPUT_BYTES)
            cut = r.stdout_truncated or r.stderr_truncated
            note = "[output cut: redirect it to a file, then read parts of it]\n" if cut else ""
            return f"{r.stdout}{r.stderr}{note}exit code: {r.exit_code}"
        if name == "read":
            return sb.read_text(conversation_id, args["path"])
        if name == "write":
            sb.write_file(conversation_id, args["path"], args["content"])
            return f"wrote {args['path']}"
        if name == "edit":
            n = sb.edit(conversation_id, args["path"], args["old_string"], args["new_string"])
            return f"{n} replacement(s) in {args['path']}"
        if name == "ls":
            entries = sb.ls(conversation_id, args.get("path"))
            return "\n".join(e.name + ("/" if e.kind == "directory" else "") for e in entries)
        return f"error: unknown tool {name}"
    except SessionboxError as e:
        return f"error ({e.code}): {e.message}"
    except (ValueError, KeyError, TypeError) as e:
        return f"error: bad arguments for {name}: {e}"


# A model: given the messages so far, the tool calls it makes ({"id", "name", "arguments"}),
# none when it is done. Wrap your provider's API in this shape.
Model = Callable[[list[dict[str, Any]]], list[dict[str, str]]]


def run_loop(sb: Client, conversation_id: str, model: Model, prompt: str) -> list[dict[str, Any]]:
    """Ask the model, run its tool calls, hand back their results, until it calls none."""
    sb.open_conversation(conversation_id)  # create or resume it: a new one reads as empty
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    while calls := model(messages):
        messages.append({"role": "assistant", "tool_calls": calls})
        for call in calls:
            result = dispatch(sb, conversation_id, call["name"], call["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages
