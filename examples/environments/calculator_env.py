#!/usr/bin/python3
"""A tool-calling environment in Python: the calculator tool, served to relay.

The model calls tools the way Qwen2.5/Qwen3's chat template teaches it, one
<tool_call> block per call:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "(12 + 3) * 7"}}
    </tool_call>

Each call's result goes back as a tool message; a turn without a call is the
model's final answer, which the task's verifier scores. A malformed call or
an unknown tool is answered with an "error: ..." message and counted, as
relay's built-in calculator environment does (task.environment: calculator);
this file is the same environment written against the remote protocol, to
copy from.

    /usr/bin/python3 examples/environments/calculator_env.py --listen 127.0.0.1:50071
    relay run configs/arith.yaml task.environment=remote \\
        task.environment_address=127.0.0.1:50071 ...
"""

import argparse
import ast
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relay_env  # noqa: E402

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an integer expression with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "for example (12 + 3) * 7"},
            },
            "required": ["expression"],
        },
    },
}

TOOL_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MAX_CALLS_PER_TURN = 4
INT64 = 2 ** 63


def evaluate(expression):
    """Integer + - * and parentheses; ValueError says what is wrong."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse '{expression}'")

    def value(node, depth=0):
        if depth > 64:
            raise ValueError("expression nested too deeply")
        if isinstance(node, ast.Expression):
            return value(node.body, depth + 1)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand, depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = value(node.left, depth + 1), value(node.right, depth + 1)
            v = a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) \
                else a * b
            if not -INT64 <= v < INT64:
                raise ValueError("result out of the 64-bit integer range")
            return v
        raise ValueError(f"only integers, + - * and parentheses, in '{expression}'")

    return value(tree)


def run_call(body):
    """(result text, failed) for one block's body."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return "error: malformed tool call: not a JSON object", True
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "error: malformed tool call: \"name\" must be a non-empty string", True
    args = call.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict):
        return "error: malformed tool call: \"arguments\" must be an object", True
    if call["name"] != "calculator":
        return f"error: no tool named '{call['name']}' (tools: calculator)", True
    expression = args.get("expression")
    if not isinstance(expression, str):
        return "error: calculator: \"expression\" must be a string", True
    try:
        return str(evaluate(expression)), False
    except ValueError as e:
        return f"error: calculator: {e}", True


class Calculator(relay_env.Environment):
    def step(self, turn, text):
        blocks = TOOL_CALL.findall(text)
        if not blocks:
            return relay_env.Step.answered()
        messages, calls, errors = [], 0, 0
        for body, close in blocks:
            if not close:
                result, failed = "error: malformed tool call: <tool_call> is not closed", True
            elif calls + errors >= MAX_CALLS_PER_TURN:
                result, failed = f"error: at most {MAX_CALLS_PER_TURN} calls per turn", True
            else:
                result, failed = run_call(body.strip())
            errors += failed
            calls += not failed
            messages.append(relay_env.tool(result))
        return relay_env.Step.reply(messages, tool_calls=calls, tool_errors=errors)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0 = any free port)")
    p.add_argument("--port-file", help="write the port here once listening")
    a = p.parse_args()
    relay_env.serve(Calculator, tools=[json.dumps(CALCULATOR)], address=a.listen,
                    port_file=a.port_file, name="calculator")


if __name__ == "__main__":
    main()
