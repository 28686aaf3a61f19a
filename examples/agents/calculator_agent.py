#!/usr/bin/python3
"""An agent that plays relay's training episodes with a calculator tool.

relay-rollout with rollout.agent (docs/serve.md, "Inside training") serves
the OpenAI API with the policy being trained and hands out episodes: each is
one sample of a leased prompt. This agent, several episodes at once:

  1. takes an episode:   POST /v1/episodes            -> id, messages, reference
  2. plays it:           POST /v1/chat/completions    (X-Relay-Episode-Id: id)
     with the calculator tool; each tool call's result goes back as a tool
     message and the model is asked again, up to --max-turns model turns;
  3. ends it:            POST /v1/episodes/{id}/end   {"reward": 1 or 0}
     (the final answer against the reference; --no-reward leaves the
     reward to relay's verifier)

until relay answers 410 (the run is over). Only the standard library: no
openai package needed (the official one works the same way: pass
extra_headers={"X-Relay-Episode-Id": id}).

relay-rollout starts it with OPENAI_BASE_URL, OPENAI_API_KEY and RELAY_MODEL
set (rollout.agent.command); by hand:

    OPENAI_BASE_URL=http://127.0.0.1:8100/v1 RELAY_MODEL=agent_calc \\
        /usr/bin/python3 examples/agents/calculator_agent.py
"""

import argparse
import ast
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

# The same schema as relay's built-in calculator (task.environment:
# calculator), so that the prompts the agent's episodes start from are the
# ones relay's warm start and evaluation use.
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


def evaluate(expression):
    """Integer + - * and parentheses; ValueError says what is wrong."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse '{expression}'")

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = value(node.left), value(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        raise ValueError(f"only integers, + - * and parentheses: '{expression}'")

    return value(tree)


class Relay:
    def __init__(self, base, key, model):
        self.base = base.rstrip("/")
        self.key = key
        self.model = model

    def post(self, path, body, episode=None, timeout=600):
        """(status, JSON body or None)."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Bearer " + self.key)
        if episode:
            req.add_header("X-Relay-Episode-Id", episode)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = r.read()
                return r.status, (json.loads(data) if data else None)
        except urllib.error.HTTPError as e:
            data = e.read()
            try:
                return e.code, json.loads(data)
            except ValueError:
                return e.code, None


def play(relay, ticket, max_turns, give_reward, stats):
    messages = list(ticket["messages"])
    answer = None
    for _ in range(max_turns):
        status, reply = relay.post(
            "/chat/completions",
            {"model": relay.model, "messages": messages, "tools": [CALCULATOR]},
            episode=ticket["id"])
        if status != 200:
            # The episode cannot go on (the worker is stopping, or it
            # expired): relay drops its group; nothing to end.
            stats["failed"] += 1
            return
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        turn = {"role": "assistant", "content": message.get("content") or ""}
        if calls:
            turn["tool_calls"] = calls
        messages.append(turn)
        if not calls:
            answer = message.get("content") or ""
            break
        stats["tool_calls"] += len(calls)
        for call in calls:
            try:
                args = json.loads(call["function"]["arguments"])
                result = str(evaluate(str(args["expression"])))
            except (ValueError, KeyError, TypeError) as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    body = {}
    if give_reward:
        correct = answer is not None and answer.strip() == ticket["reference"].strip()
        body["reward"] = 1.0 if correct else 0.0
        stats["correct"] += int(correct)
    status, _ = relay.post(f"/episodes/{ticket['id']}/end", body, timeout=60)
    stats["ended" if status == 200 else "failed"] += 1


def worker(relay, args, stats, lock, done):
    failures = 0
    while not done.is_set():
        try:
            status, ticket = relay.post("/episodes", {"wait_s": 10}, timeout=30)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            # The worker is not listening (restarting, or gone): it stops
            # this process when it stops for good.
            failures += 1
            if failures > 60:
                print(f"calculator_agent: cannot reach {relay.base}: {e}", file=sys.stderr)
                done.set()
                return
            time.sleep(1)
            continue
        failures = 0
        if status == 410:  # the run is over
            done.set()
            return
        if status == 204:  # no episode within wait_s
            continue
        if status != 200:
            print(f"calculator_agent: POST /episodes: {status} {ticket}", file=sys.stderr)
            time.sleep(1)
            continue
        local = {"ended": 0, "failed": 0, "tool_calls": 0, "correct": 0}
        try:
            play(relay, ticket, args.max_turns, not args.no_reward, local)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            local["failed"] += 1
        with lock:
            for k, v in local.items():
                stats[k] += v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=8, help="episodes played at once")
    p.add_argument("--max-turns", type=int, default=3, help="model turns per episode")
    p.add_argument("--no-reward", action="store_true", help="let relay's verifier score")
    args = p.parse_args()
    relay = Relay(os.environ["OPENAI_BASE_URL"], os.environ.get("OPENAI_API_KEY", "relay"),
                  os.environ.get("RELAY_MODEL", ""))
    stats = {"ended": 0, "failed": 0, "tool_calls": 0, "correct": 0}
    lock, done = threading.Lock(), threading.Event()
    threads = [threading.Thread(target=worker, args=(relay, args, stats, lock, done), daemon=True)
               for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"calculator_agent: {stats['ended']} episodes ended ({stats['correct']} correct, "
          f"{stats['tool_calls']} tool calls), {stats['failed']} failed")


if __name__ == "__main__":
    main()
