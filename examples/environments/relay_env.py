"""Serve an environment for relay's multi-turn episodes, from Python.

relay-rollout calls this server over gRPC (proto/relay/v1/environment.proto)
when a run sets

    task:
      environment: remote
      environment_address: 127.0.0.1:50071
      environment_timeout_s: 30

Write a class with reset() and step(), pass it to serve(), and run the script.
One object is made per episode (from reset to close); relay keeps the token
sequence itself, renders your messages with the model's chat template and
tokenizes them once, so an environment only ever sees and returns text.

    class Guess(relay_env.Environment):
        def reset(self, task_id, prompt, reference):
            self.answer = reference
        def step(self, turn, text):
            if text.strip() == self.answer:
                return relay_env.Step.answered(reward=1.0)
            return relay_env.Step.reply([relay_env.user("no, try again")])

    relay_env.serve(Guess, tools=[], address="127.0.0.1:50071")

An exception in reset() or step() fails that episode (relay records the
message as its env_error), never the worker; a model's mistakes (a malformed
tool call, say) belong in an observation the model can read instead.

Needs Debian's python3-grpcio and python3-protobuf, and protoc
(protobuf-compiler): the message module is generated from the .proto at
start-up into a temporary directory ($RELAY_PROTOC names another protoc,
$RELAY_PROTO_DIR another proto/ directory). Run it with /usr/bin/python3.
"""

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent import futures

import grpc

SERVICE = "relay.v1.Environment"
_HERE = os.path.dirname(os.path.abspath(__file__))


def load_messages():
    """The generated environment_pb2 module (protoc runs once per process)."""
    proto_dir = os.environ.get("RELAY_PROTO_DIR") or os.path.join(_HERE, "..", "..", "proto")
    source = os.path.join(proto_dir, "relay", "v1", "environment.proto")
    if not os.path.exists(source):
        sys.exit(f"relay_env: {source} not found (set $RELAY_PROTO_DIR to relay's proto/)")
    protoc = os.environ.get("RELAY_PROTOC") or shutil.which("protoc")
    if not protoc:
        sys.exit("relay_env: protoc not found (install protobuf-compiler, or set $RELAY_PROTOC)")
    out = tempfile.mkdtemp(prefix="relay_env_proto_")
    subprocess.run([protoc, f"--python_out={out}", "-I", proto_dir, source], check=True)
    sys.path.insert(0, out)
    from relay.v1 import environment_pb2  # noqa: E402 (generated just now)
    return environment_pb2


pb = load_messages()


def tool(content):
    """A tool's output, rendered as a <tool_response> block."""
    return ("tool", str(content))


def user(content):
    """A user message."""
    return ("user", str(content))


class Step:
    """What step() returns. Use the constructors below."""

    CONTINUE, ANSWERED, DONE = (pb.StepEnvironmentResponse.CONTINUE,
                                pb.StepEnvironmentResponse.ANSWERED,
                                pb.StepEnvironmentResponse.DONE)

    def __init__(self, next, messages=(), reward=None, tool_calls=0, tool_errors=0):
        self.next = next
        self.messages = list(messages)
        self.reward = reward
        self.tool_calls = tool_calls
        self.tool_errors = tool_errors

    @classmethod
    def reply(cls, messages, reward=None, tool_calls=0, tool_errors=0):
        """The model reads `messages` (tool() / user() pairs) and takes another turn."""
        if not messages:
            raise ValueError("Step.reply: at least one message")
        return cls(cls.CONTINUE, messages, reward, tool_calls, tool_errors)

    @classmethod
    def answered(cls, reward=None):
        """The turn was the model's final answer; the task's verifier scores it."""
        return cls(cls.ANSWERED, reward=reward)

    @classmethod
    def done(cls, reward=None):
        """The environment ends the episode (a game over, a task solved)."""
        return cls(cls.DONE, reward=reward)

    def to_proto(self):
        out = pb.StepEnvironmentResponse(next=self.next, tool_calls=self.tool_calls,
                                         tool_errors=self.tool_errors)
        for role, content in self.messages:
            out.messages.add(role=role, content=content)
        if self.reward is not None:
            out.has_reward = True
            out.reward = float(self.reward)
        return out


class Environment:
    """One episode's state. Override reset() and step()."""

    def reset(self, task_id, prompt, reference):
        pass

    def step(self, turn, text):
        raise NotImplementedError


class _Servicer:
    """Routes calls to one Environment per episode id."""

    def __init__(self, make_env, tools, name, max_episodes):
        self.make_env = make_env
        self.tools = list(tools)
        self.name = name
        self.max_episodes = max_episodes
        self.lock = threading.Lock()
        # Least recently used first: episodes relay never closed (a worker
        # that died) are dropped once there are more than max_episodes.
        self.episodes = collections.OrderedDict()
        self.counts = collections.Counter()

    def _fail(self, context, code, what):
        context.abort(code, what)

    def describe(self, request, context):
        return pb.DescribeEnvironmentResponse(name=self.name, tool_schemas_json=self.tools)

    def reset(self, request, context):
        env = self.make_env()
        try:
            env.reset(request.task_id, request.prompt, request.reference)
        except Exception as e:  # the episode fails, the server goes on
            traceback.print_exc()
            self._fail(context, grpc.StatusCode.INTERNAL, f"reset raised {type(e).__name__}: {e}")
        with self.lock:
            self.counts["reset"] += 1
            self.episodes[request.episode_id] = env
            while len(self.episodes) > self.max_episodes:
                self.episodes.popitem(last=False)
        return pb.ResetEnvironmentResponse()

    def step(self, request, context):
        with self.lock:
            env = self.episodes.get(request.episode_id)
            if env is not None:
                self.episodes.move_to_end(request.episode_id)
        if env is None:
            self._fail(context, grpc.StatusCode.NOT_FOUND,
                       f"episode '{request.episode_id}': no such episode (never reset, or closed)")
        try:
            result = env.step(request.turn, request.text)
            if not isinstance(result, Step):
                raise TypeError(f"step() returned {type(result).__name__}, not relay_env.Step")
        except Exception as e:
            traceback.print_exc()
            self._fail(context, grpc.StatusCode.INTERNAL, f"step raised {type(e).__name__}: {e}")
        with self.lock:
            self.counts["step"] += 1
        return result.to_proto()

    def close(self, request, context):
        with self.lock:
            self.counts["close"] += 1
            self.episodes.pop(request.episode_id, None)
        return pb.CloseEnvironmentResponse()


def serve(make_env, tools=(), address="127.0.0.1:0", port_file=None, name=None, threads=16,
          max_episodes=100000):
    """Serves until SIGTERM or SIGINT. `make_env()` makes one Environment per
    episode; `tools` are JSON strings (OpenAI function schemas) the prompt
    lists. With port 0 the server picks a free port; `port_file` receives it
    (written once the server is listening)."""
    servicer = _Servicer(make_env, tools, name or getattr(make_env, "__name__", "environment"),
                         max_episodes)

    def unary(fn, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString)

    handlers = grpc.method_handlers_generic_handler(SERVICE, {
        "Describe": unary(servicer.describe, pb.DescribeEnvironmentRequest,
                          pb.DescribeEnvironmentResponse),
        "Reset": unary(servicer.reset, pb.ResetEnvironmentRequest, pb.ResetEnvironmentResponse),
        "Step": unary(servicer.step, pb.StepEnvironmentRequest, pb.StepEnvironmentResponse),
        "Close": unary(servicer.close, pb.CloseEnvironmentRequest, pb.CloseEnvironmentResponse),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port(address)
    if port == 0:
        sys.exit(f"relay_env: cannot listen on {address}")
    server.start()
    host = address.rsplit(":", 1)[0]
    print(f"relay_env: {servicer.name} listening on {host}:{port}", flush=True)
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, port_file)  # readers never see a half-written file

    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    server.stop(grace=2).wait()
    c = servicer.counts
    print(f"relay_env: stopped after {c['reset']} resets, {c['step']} steps, "
          f"{c['close']} closes", flush=True)
