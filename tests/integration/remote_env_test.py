#!/usr/bin/python3
"""Episodes answered by an environment in another process (issue 19).

`relay rollout` runs calculator episodes against the Python example server
(examples/environments/calculator_env.py) over proto/relay/v1/environment.proto,
and then against servers that hang, crash and are not there at all: a failing
environment must end its episodes as env_error with the reason, never the
rollout, and one that is not up must stop the start with its address.

  /usr/bin/python3 tests/integration/remote_env_test.py build/src/relay [SOURCE_DIR]

ctest: remote_environment (tests/CMakeLists.txt). Prints one line per case and
exits 1 when any fails. The same file is the faulty servers' program
(`--serve hang|crash`).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SOURCE_DIR = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 and not sys.argv[1].startswith("--")
                             else os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(SOURCE_DIR, "examples", "environments")
sys.path.insert(0, EXAMPLES)

CALL = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n'
        "</tool_call>")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 256, 257, 258
OBSERVATION = ("\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
               "<|im_start|>assistant\n")


def serve_faulty(mode, port_file):
    """A calculator whose Step hangs (past any deadline) or kills the process."""
    import calculator_env
    import relay_env

    class Faulty(calculator_env.Calculator):
        def step(self, turn, text):
            if mode == "hang":
                time.sleep(3600)
            os._exit(3)

    relay_env.serve(Faulty, tools=[json.dumps(calculator_env.CALCULATOR)],
                    address="127.0.0.1:0", port_file=port_file, name=f"faulty-{mode}")


def byte_symbol(b):
    """GPT-2's byte-to-unicode table, as relay's test tokenizer uses it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    if b in printable:
        return chr(b)
    n = 0
    for c in range(256):
        if c in printable:
            continue
        if c == b:
            return chr(256 + n)
        n += 1


def byte_tokenizer(specials):
    added = [{"id": 256 + i, "content": s, "special": True, "lstrip": False, "rstrip": False,
              "normalized": False, "single_word": False} for i, s in enumerate(specials)]
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "ignore_merges": False,
                      "vocab": {byte_symbol(b): b for b in range(256)}, "merges": []}}


def detokenize(ids):
    names = {256 + i: s for i, s in enumerate(SPECIALS)}
    return "".join(names.get(i, chr(i)) for i in ids)


class Server:
    def __init__(self, args, base, name):
        self.port_file = os.path.join(base, f"{name}.port")
        self.log_path = os.path.join(base, f"{name}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(["/usr/bin/python3"] + args + ["--port-file", self.port_file],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{self.output()}")
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(self.port_file).read().strip()

    def output(self):
        self.log.flush()
        return open(self.log_path, errors="replace").read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.output()


class Case:
    failed = []

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            print(f"PASS {self.name}", flush=True)
        else:
            Case.failed.append(self.name)
            print(f"FAIL {self.name}: {kind.__name__}: {value}", flush=True)
        return True  # recorded; the next case runs


def main():
    relay = os.path.abspath(sys.argv[1])
    base = tempfile.mkdtemp(prefix="relay_remote_env_")
    config = os.path.join(SOURCE_DIR, "configs", "tiny.yaml")
    model = os.path.join(base, "model")
    init = subprocess.run([relay, "init", config, "--out", model, "model.init.vocab=259",
                           "model.init.max_seq_len=1024"], capture_output=True, text=True)
    if init.returncode != 0:
        sys.exit(f"relay init failed: {init.stderr}")
    os.remove(os.path.join(model, "relay_tokenizer.json"))
    with open(os.path.join(model, "tokenizer.json"), "w") as f:
        json.dump(byte_tokenizer(SPECIALS), f)
    data = os.path.join(base, "agent.jsonl")
    with open(data, "w") as f:
        line = json.dumps({"prompt": "What is 6*7?", "answer": "42", "target": CALL})
        f.write(line + "\n" + line + "\n")

    def rollout(address, out, *extra):
        # The first turn is the target, forced whole: a calculator call.
        args = [relay, "rollout", config, "--model", model, "--prompts", "1", "--out", out,
                f"task.path={data}", "rollout.n=2", "task.name=jsonl",
                "task.environment=remote", f"task.environment_address={address}",
                "model.chat_template=auto", "rollout.max_new_tokens=96",
                "rollout.episode.max_turns=2", "rollout.prefix.n_prefix=-1",
                "rollout.prefix.strategy=fixed", "rollout.prefix.min_ratio=1.0",
                "rollout.prefix.max_ratio=1.0"] + list(extra)
        t0 = time.monotonic()
        r = subprocess.run(args, capture_output=True, text=True, timeout=240)
        return r, time.monotonic() - t0

    with Case("episodes answered by the Python calculator server"):
        server = Server([os.path.join(EXAMPLES, "calculator_env.py")], base, "calculator")
        out = os.path.join(base, "ok.jsonl")
        r, _ = rollout(server.address, out)
        log = server.stop()
        assert r.returncode == 0, r.stderr
        group = json.loads(open(out).readline())
        # The server's tool schema, listed as Qwen's template writes it.
        assert '{"type": "function", "function": {"name": "calculator"' in group["prompt"], \
            group["prompt"]
        for t in group["trajectories"]:
            tokens, env = t["response_tokens"], t["env_mask"]
            model_end, env_end = t["turns"][0]["model_end"], t["turns"][0]["env_end"]
            assert model_end == len(CALL) + 1 and tokens[model_end - 1] == 258, t["turns"]
            got = detokenize(tokens[model_end:env_end])
            assert got == OBSERVATION, repr(got)
            assert all(env[j] == 1 for j in range(model_end, env_end)), env
            assert all(t["behavior_logprobs"][j] is None for j in range(model_end, env_end))
            assert t["finish_reason"] in ("stop", "length", "tool_budget"), t["finish_reason"]
        assert "stopped after 2 resets" in log, log

    def faulty(mode, timeout_s, expect_detail):
        """Episodes against a server that fails: each ends as env_error, the rollout does not."""
        server = Server([__file__, "--serve", mode], base, mode)
        out = os.path.join(base, f"{mode}.jsonl")
        r, seconds = rollout(server.address, out, f"task.environment_timeout_s={timeout_s}")
        server.stop()
        assert r.returncode == 0, r.stderr
        for t in json.loads(open(out).readline())["trajectories"]:
            assert t["finish_reason"] == "env_error", t["finish_reason"]
            assert expect_detail(t["finish_detail"], server.address), t["finish_detail"]
        assert seconds < 60, f"took {seconds:.0f} s"

    with Case("a hung environment ends its episodes at the deadline, not the rollout"):
        faulty("hang", 1, lambda detail, _: "DEADLINE_EXCEEDED" in detail or
               "no answer within 1000 ms" in detail)

    # The first Step kills the server: that episode's Step fails, and an
    # episode not reset yet by then fails at its Reset.
    with Case("a crashed environment ends its episodes with UNAVAILABLE"):
        faulty("crash", 5, lambda detail, address:
               f"environment at {address}: Step: UNAVAILABLE" in detail or
               f"environment at {address}: Reset: UNAVAILABLE" in detail)

    with Case("no server at the address stops the start, naming it"):
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{s.getsockname()[1]}"
        r, seconds = rollout(address, os.path.join(base, "none.jsonl"),
                             "task.environment_timeout_s=2")
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert f"task.environment_address: environment at {address}: no answer to Describe" \
            in r.stderr, r.stderr
        assert seconds < 60, f"took {seconds:.0f} s"

    if Case.failed:
        print(f"remote_env_test: {len(Case.failed)} failed; files kept in {base}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_faulty(sys.argv[2], sys.argv[sys.argv.index("--port-file") + 1])
    else:
        sys.exit(main())
