#!/usr/bin/python3
"""A hostile gRPC client against a real relay-trainer (issue 17).

Starts relay-trainer on configs/tiny.yaml, registers two workers over the wire
and sends SubmitGroups every kind of malformed group, each on its own lease,
then garbage bytes; checks each refusal's code and message, that refused
groups keep their lease, that good groups are still accepted, that the
trainer survives all of it and that the store holds only the good groups.

Python 3 with Debian's python3-grpcio and python3-protobuf (scripts/setup.sh):
run it with /usr/bin/python3, not a virtualenv's python. The message modules
are generated from proto/relay/v1 with protoc at test time; there is no gRPC
Python plugin, so calls go through channel.unary_unary / stream_stream by
method path.

  /usr/bin/python3 tests/integration/grpc_client_test.py \
      build/src/relay-trainer [SOURCE_DIR]

The trainer path may also come from $RELAY_TRAINER_PATH, the source dir
defaults to this file's ../..; protoc is $RELAY_PROTOC or `protoc` on PATH.
Prints one line per case; exits 1 when any case fails (with the trainer's
log), 0 when all pass. ctest: grpc_hostile_client (tests/CMakeLists.txt).
"""

import glob
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

try:
    import grpc
except ImportError:
    sys.exit("grpc_client_test: python3-grpcio is missing (scripts/setup.sh installs it; "
             "run with /usr/bin/python3, which sees Debian's packages)")

# The run's settings the cases below depend on (passed on the command line,
# or tiny.yaml's own values).
K = 2                    # rollout.n: samples per prompt
GROUPS_PER_STEP = 2      # experiment.groups_per_step
MAX_STALENESS = 4        # trainer.max_staleness
MAX_NEW_TOKENS = 16      # rollout.max_new_tokens in tiny.yaml
MAX_CONTEXT = 128        # model.init.max_seq_len in tiny.yaml (max_position_embeddings)

RPC_TIMEOUT_S = 20
PORT_FILE_TIMEOUT_S = 90

OK, INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED = 0, 3, 9, 7


class CaseFailure(Exception):
    pass


class Results:
    def __init__(self):
        self.passed = []
        self.failed = []
        self.trainer = None  # once it has exited, the remaining cases fail without trying

    def case(self, name, fn):
        if self.trainer is not None and not self.trainer.alive():
            self.failed.append(name)
            print(f"FAIL {name}: not run: relay-trainer exited with "
                  f"{self.trainer.proc.returncode}", flush=True)
            return False
        try:
            detail = fn()
        except CaseFailure as e:
            self.failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
            return False
        except grpc.RpcError as e:  # a call failed outright (the trainer died?)
            self.failed.append(name)
            print(f"FAIL {name}: RPC failed: {e.code()}: {e.details()}", flush=True)
            if self.trainer is not None and e.code() == grpc.StatusCode.UNAVAILABLE:
                try:  # let a dying trainer finish exiting, so later cases say so
                    self.trainer.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            return False
        except Exception as e:  # a bug in this test: still a failed case
            self.failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            return False
        self.passed.append(name)
        print(f"PASS {name}" + (f": {detail}" if detail else ""), flush=True)
        return True


def check(cond, what):
    if not cond:
        raise CaseFailure(what)


def generate_protos(source_dir, out_dir):
    protoc = os.environ.get("RELAY_PROTOC") or shutil.which("protoc")
    if not protoc:
        sys.exit("grpc_client_test: protoc not found (protobuf-compiler; or set $RELAY_PROTOC)")
    protos = sorted(glob.glob(os.path.join(source_dir, "proto", "relay", "v1", "*.proto")))
    if not protos:
        sys.exit(f"grpc_client_test: no protos under {source_dir}/proto/relay/v1")
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([protoc, f"--python_out={out_dir}", "-I", os.path.join(source_dir, "proto")]
                   + protos, check=True)
    sys.path.insert(0, out_dir)


class Trainer:
    """relay-trainer as a child process with its output in a file."""

    def __init__(self, path, source_dir, base):
        self.base = base
        self.log_path = os.path.join(base, "trainer.log")
        self.port_file = os.path.join(base, "port")
        args = [path, os.path.join(source_dir, "configs", "tiny.yaml"),
                f"experiment.output_dir={base}", "experiment.steps=1000",
                f"experiment.groups_per_step={GROUPS_PER_STEP}", f"rollout.n={K}",
                f"trainer.max_staleness={MAX_STALENESS}",
                "--listen", "127.0.0.1:0", "--port-file", self.port_file]
        env = dict(os.environ)
        env.pop("RELAY_TOKEN", None)  # no bearer token: this client sends none
        self.log = open(self.log_path, "wb")
        print("starting: " + " ".join(args), flush=True)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=base)

    def wait_for_port(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"relay-trainer exited with {self.proc.returncode} "
                                   "before writing its port file")
            try:
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    return int(text)
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no port file {self.port_file} after {timeout_s} s")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def output(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(cannot read {self.log_path}: {e})"


class Client:
    """The Worker and Admin calls by method path (no generated stubs)."""

    def __init__(self, port, pb):
        self.pb = pb
        w, a = pb["worker"], pb["admin"]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(self.channel).result(timeout=RPC_TIMEOUT_S)

        def unary(service, name, req, resp):
            return self.channel.unary_unary(f"/relay.v1.{service}/{name}",
                                            request_serializer=req.SerializeToString,
                                            response_deserializer=resp.FromString)

        self.register_call = unary("Worker", "RegisterWorker", w.RegisterWorkerRequest,
                                   w.RegisterWorkerResponse)
        self.lease_call = unary("Worker", "LeasePrompts", w.LeasePromptsRequest,
                                w.LeasePromptsResponse)
        self.release_call = unary("Worker", "ReleaseLeases", w.ReleaseLeasesRequest,
                                  w.ReleaseLeasesResponse)
        self.stats_call = unary("Admin", "Stats", a.StatsRequest, a.StatsResponse)
        self.health_call = unary("Admin", "Health", a.HealthRequest, a.HealthResponse)
        self.submit_call = self.channel.stream_stream(
            "/relay.v1.Worker/SubmitGroups",
            request_serializer=w.SubmitGroupRequest.SerializeToString,
            response_deserializer=w.SubmitGroupAck.FromString)
        # The same method with the request bytes sent as they are.
        self.submit_raw_call = self.channel.stream_stream(
            "/relay.v1.Worker/SubmitGroups", request_serializer=lambda b: b,
            response_deserializer=w.SubmitGroupAck.FromString)
        self.fetch_call = self.channel.unary_stream(
            "/relay.v1.Worker/FetchWeights",
            request_serializer=w.FetchWeightsRequest.SerializeToString,
            response_deserializer=pb["worker"].WeightChunk.FromString)

    def register(self, name):
        w = self.pb["worker"]
        return self.register_call(
            w.RegisterWorkerRequest(worker_name=name,
                                    capabilities=w.WorkerCapabilities(hostname="test", device="cpu",
                                                                      num_slots=1)),
            timeout=RPC_TIMEOUT_S)

    def lease(self, worker_id):
        """One lease and the trainer's latest version."""
        w = self.pb["worker"]
        resp = self.lease_call(w.LeasePromptsRequest(worker_id=worker_id, max_prompts=1),
                               timeout=RPC_TIMEOUT_S)
        if not resp.leases:
            raise CaseFailure(f"LeasePrompts gave no lease (wait_for_version "
                              f"{resp.wait_for_version}, latest {resp.latest_version})")
        return resp.leases[0], resp.latest_version

    def release(self, worker_id, lease_ids):
        w = self.pb["worker"]
        return self.release_call(w.ReleaseLeasesRequest(worker_id=worker_id, lease_ids=lease_ids),
                                 timeout=RPC_TIMEOUT_S).released

    def submit(self, requests):
        """Sends the requests on one SubmitGroups stream; the acks."""
        return list(self.submit_call(iter(requests), timeout=RPC_TIMEOUT_S))

    def submit_one(self, worker_id, lease_id, group):
        acks = self.submit([self.pb["worker"].SubmitGroupRequest(
            worker_id=worker_id, lease_id=lease_id, group=group)])
        check(len(acks) == 1, f"{len(acks)} acks for one group")
        check(acks[0].lease_id == lease_id,
              f"ack for lease {acks[0].lease_id}, submitted on {lease_id}")
        return acks[0]

    def stats(self):
        return self.stats_call(self.pb["admin"].StatsRequest(), timeout=RPC_TIMEOUT_S)

    def health(self):
        return self.health_call(self.pb["admin"].HealthRequest(), timeout=RPC_TIMEOUT_S)

    def manifest(self, worker_id):
        """The latest published version's manifest (FetchWeights' first message)."""
        w = self.pb["worker"]
        call = self.fetch_call(w.FetchWeightsRequest(worker_id=worker_id, version=-1,
                                                     chunk_bytes=1 << 20),
                               timeout=RPC_TIMEOUT_S)
        try:
            first = next(call)
        finally:
            call.cancel()
        return first.manifest


def vocab_size_of(manifest):
    for t in manifest.tensors:
        if t.name.endswith("embed_tokens.weight") and t.shape:
            return t.shape[0]
    return None


class Builder:
    """Well-formed groups for a lease, as a real worker would submit them."""

    def __init__(self, pb, vocab_size):
        self.pb = pb
        self.vocab_size = vocab_size
        self.digests = {}  # version -> manifest digest, as published

    def learn(self, manifest):
        """Remembers a published version's digest; the version."""
        self.digests[manifest.version] = manifest.digest
        return manifest.version

    def digest(self, version):
        # A version never published (the future, negative) gets a made-up
        # digest: the checks under test come before any digest comparison.
        return self.digests.get(version, 0x5EED + max(version, 0))

    def trajectory(self, prompt, version, j, length=4):
        t = self.pb["trajectory"]
        # Response tokens copied from the prompt: certainly in the vocabulary.
        response = [prompt[(i + j) % len(prompt)] for i in range(length)]
        lps = [-0.5 - 0.25 * ((i + j) % 4) for i in range(length)]
        return t.Trajectory(
            prompt_tokens=list(prompt),
            response_tokens=response,
            behavior_logprobs=lps,
            token_versions=[version] * length,
            # Scored under the weights the worker held at finish (the same
            # version, no truncation): the proximal log-prob is the behavior one.
            proximal_logprobs=lps,
            proximal_versions=[version] * length,
            offpolicy_mask=[False] * length,
            finish_reason=t.FINISH_REASON_LENGTH,
            interrupt_policy=t.INTERRUPT_POLICY_RECOMPUTE,
            version_digests=[t.VersionDigest(version=version, digest=self.digest(version))],
            reward=float(j % 2),  # 0, 1, ...: the group has a learning signal
        )

    def group(self, lease, version):
        g = self.pb["trajectory"].TrajectoryGroup(group_id=lease.group_id)
        for j in range(lease.k):
            g.trajectories.append(self.trajectory(lease.prompt_tokens, version, j))
        return g


def set_versions(traj, version, builder):
    """Every version field of `traj` to `version`, with a digest for it."""
    n = len(traj.response_tokens)
    del traj.token_versions[:]
    traj.token_versions.extend([version] * n)
    del traj.proximal_versions[:]
    traj.proximal_versions.extend([version] * n)
    del traj.version_digests[:]
    traj.version_digests.add(version=version, digest=builder.digest(version))


def set_response_length(traj, n, version, builder):
    """A response of n tokens with every per-token field as long."""
    prompt = list(traj.prompt_tokens)
    for field in ("response_tokens", "behavior_logprobs", "token_versions", "proximal_logprobs",
                  "proximal_versions", "offpolicy_mask"):
        del getattr(traj, field)[:]
    traj.response_tokens.extend(prompt[i % len(prompt)] for i in range(n))
    traj.behavior_logprobs.extend([-1.0] * n)
    traj.proximal_logprobs.extend([-1.0] * n)
    traj.offpolicy_mask.extend([False] * n)
    set_versions(traj, version, builder)


def run(trainer_path, source_dir):
    results = Results()
    base = tempfile.mkdtemp(prefix="relay_grpc_client_")
    trainer = None
    ok = False
    try:
        generate_protos(source_dir, os.path.join(base, "py"))
        from relay.v1 import admin_pb2, trajectory_pb2, worker_pb2  # noqa: E402 (generated)
        pb = {"worker": worker_pb2, "admin": admin_pb2, "trajectory": trajectory_pb2}

        trainer = Trainer(trainer_path, source_dir, base)
        results.trainer = trainer
        port = trainer.wait_for_port(PORT_FILE_TIMEOUT_S)
        print(f"relay-trainer serving on port {port}", flush=True)
        c = Client(port, pb)

        reg_a = c.register("hostile-a")
        reg_b = c.register("hostile-b")
        a, b = reg_a.worker_id, reg_b.worker_id
        vocab = vocab_size_of(reg_a.manifest)
        builder = Builder(pb, vocab)
        builder.learn(reg_a.manifest)
        version0 = reg_a.version
        print(f"workers {a} and {b}; version {version0}, k {reg_a.k}, vocab {vocab}", flush=True)
        check(reg_a.k == K, f"RegisterWorker k = {reg_a.k}, the run has rollout.n = {K}")
        check(vocab is not None, "the manifest names no embed_tokens tensor (vocabulary size)")
        good_accepted = []  # store_seq of every good group acknowledged

        # ---- malformed groups, each on its own lease --------------------------
        # mutate(group, lease, version) breaks one thing; the ack must refuse
        # it with `code`, naming `needle`. Refused leases are released again
        # (the dispenser's capacity is the staleness bound), except the one
        # kept for the corrected resubmission below.
        kept = {}

        def malformed(name, mutate, code, needle, keep=False):
            def body():
                lease, version = c.lease(a)
                group = builder.group(lease, version)
                mutate(group, lease, version)
                ack = c.submit_one(a, lease.lease_id, group)
                try:
                    check(not ack.accepted, f"accepted (store_seq {ack.store_seq})")
                    check(ack.error_code == code,
                          f"error_code {ack.error_code}, want {code}; message: "
                          f"{ack.error_message!r}")
                    check(needle in ack.error_message,
                          f"message does not contain {needle!r}: {ack.error_message!r}")
                finally:
                    if keep and not ack.accepted:
                        kept[name] = (lease, ack)
                    elif not ack.accepted:
                        c.release(a, [lease.lease_id])
                    else:
                        good_accepted.append(ack.store_seq)  # it is in the store now
                return f"code {ack.error_code}: {ack.error_message}"
            results.case(name, body)

        def traj0(g):
            return g.trajectories[0]

        def k_mismatch(g, lease, v):
            g.trajectories.append(builder.trajectory(lease.prompt_tokens, v, 2))
        malformed("k mismatch", k_mismatch, INVALID_ARGUMENT, f"k = {K}", keep=True)

        def outside_vocab(g, lease, v):
            traj0(g).response_tokens[1] = vocab + 7
        malformed("token id outside the vocabulary", outside_vocab, INVALID_ARGUMENT,
                  "response_tokens")

        def short_field(g, lease, v):
            del g.trajectories[1].token_versions[-1]
        malformed("per-token field length mismatch", short_field, INVALID_ARGUMENT,
                  "token_versions")

        def positive_lp(g, lease, v):
            traj0(g).behavior_logprobs[1] = 0.5
        malformed("positive log-prob 0.5", positive_lp, INVALID_ARGUMENT, "behavior_logprobs")

        def neg_inf_lp(g, lease, v):
            traj0(g).behavior_logprobs[2] = -math.inf
        malformed("-inf log-prob", neg_inf_lp, INVALID_ARGUMENT, "behavior_logprobs")

        def future_version(g, lease, v):
            set_versions(traj0(g), v + 1, builder)
        malformed("future token version", future_version, INVALID_ARGUMENT, "token_versions")

        def nan_reward(g, lease, v):
            traj0(g).reward = math.nan
        malformed("NaN reward", nan_reward, INVALID_ARGUMENT, "reward")

        def huge_reward(g, lease, v):
            g.trajectories[1].reward = 1e300
        malformed("reward 1e300", huge_reward, INVALID_ARGUMENT, "reward")

        def all_nan_lp(g, lease, v):
            t = traj0(g)
            for i in range(len(t.behavior_logprobs)):
                t.behavior_logprobs[i] = math.nan
        malformed("all-NaN behavior log-probs", all_nan_lp, INVALID_ARGUMENT,
                  "allow_missing_logprobs")

        def tiny_lp(g, lease, v):
            traj0(g).behavior_logprobs[0] = -1e30
        malformed("log-prob -1e30", tiny_lp, INVALID_ARGUMENT, "below")

        def negative_version(g, lease, v):
            set_versions(traj0(g), -3, builder)
        malformed("negative token version -3", negative_version, INVALID_ARGUMENT, "negative")

        def too_long(g, lease, v):
            check(len(lease.prompt_tokens) + MAX_NEW_TOKENS + 1 <= MAX_CONTEXT,
                  f"prompt of {len(lease.prompt_tokens)} tokens: cannot exceed max_new_tokens "
                  "within the context")
            set_response_length(traj0(g), MAX_NEW_TOKENS + 1, v, builder)
        malformed("response longer than max_new_tokens", too_long, INVALID_ARGUMENT,
                  "max_new_tokens")

        def beyond_context(g, lease, v):
            set_response_length(traj0(g), MAX_CONTEXT + 8, v, builder)
        malformed("prompt + response beyond the context", beyond_context, INVALID_ARGUMENT,
                  "context")

        def other_group_id(g, lease, v):
            g.group_id = lease.group_id + "-not-leased"
        malformed("group_id not the leased one", other_group_id, INVALID_ARGUMENT, "group_id")

        def other_prompt(g, lease, v):
            for t in g.trajectories:
                t.prompt_tokens[0] = (t.prompt_tokens[0] + 1) % vocab
        malformed("prompt tokens not the leased ones", other_prompt, INVALID_ARGUMENT,
                  "prompt_tokens")

        # A lease held by worker a, submitted by worker b.
        def other_worker():
            lease, version = c.lease(a)
            ack = c.submit_one(b, lease.lease_id, builder.group(lease, version))
            try:
                check(not ack.accepted, f"accepted (store_seq {ack.store_seq})")
                check(ack.error_code == PERMISSION_DENIED,
                      f"error_code {ack.error_code}, want {PERMISSION_DENIED}: "
                      f"{ack.error_message!r}")
                check("held by worker" in ack.error_message,
                      f"message does not say 'held by worker': {ack.error_message!r}")
            finally:
                if ack.accepted:
                    good_accepted.append(ack.store_seq)
                else:
                    check(c.release(a, [lease.lease_id]) == 1,
                          "the lease was not still held by its worker after the refusal")
            return f"code {ack.error_code}: {ack.error_message}"
        results.case("lease held by another worker", other_worker)

        def unknown_lease():
            lease, version = c.lease(a)
            try:
                bogus = lease.lease_id + (1 << 40)
                ack = c.submit_one(a, bogus, builder.group(lease, version))
            finally:
                c.release(a, [lease.lease_id])
            if ack.accepted:
                good_accepted.append(ack.store_seq)
            check(not ack.accepted, "accepted")
            check(ack.error_code == FAILED_PRECONDITION,
                  f"error_code {ack.error_code}, want {FAILED_PRECONDITION}: {ack.error_message!r}")
            return f"code {ack.error_code}: {ack.error_message}"
        results.case("unknown lease id", unknown_lease)

        def unregistered_worker():
            lease, version = c.lease(a)
            try:
                ack = c.submit_one("w999-never-registered", lease.lease_id,
                                   builder.group(lease, version))
            finally:
                c.release(a, [lease.lease_id])
            if ack.accepted:
                good_accepted.append(ack.store_seq)
            check(not ack.accepted, "accepted")
            check(ack.error_code == FAILED_PRECONDITION,
                  f"error_code {ack.error_code}, want {FAILED_PRECONDITION}: {ack.error_message!r}")
            check("worker_id" in ack.error_message,
                  f"message does not name worker_id: {ack.error_message!r}")
            return f"code {ack.error_code}: {ack.error_message}"
        results.case("unregistered worker id", unregistered_worker)

        # ---- several bad groups and a good one on one stream -------------------
        def one_stream():
            w = pb["worker"]
            bad_lease, version = c.lease(a)
            bad = builder.group(bad_lease, version)
            bad.trajectories[0].behavior_logprobs[0] = math.inf
            reqs = [w.SubmitGroupRequest(worker_id=a, lease_id=bad_lease.lease_id, group=bad),
                    w.SubmitGroupRequest(worker_id=a, lease_id=(1 << 50), group=bad),
                    w.SubmitGroupRequest(worker_id=a, lease_id=bad_lease.lease_id,
                                         group=builder.group(bad_lease, version))]
            acks = c.submit(reqs)
            check(len(acks) == 3, f"{len(acks)} acks for 3 groups on one stream")
            if acks[2].accepted:
                good_accepted.append(acks[2].store_seq)
            check([x.lease_id for x in acks] == [r.lease_id for r in reqs],
                  f"acks out of order: {[x.lease_id for x in acks]}")
            check([x.error_code for x in acks] == [INVALID_ARGUMENT, FAILED_PRECONDITION, OK],
                  "codes " + ", ".join(f"{x.error_code} {x.error_message!r}" for x in acks))
            check(acks[2].accepted, f"the corrected group was refused: {acks[2].error_message!r}")
            return (f"refused {acks[0].error_code}, {acks[1].error_code}, then accepted "
                    f"(store_seq {acks[2].store_seq})")
        results.case("bad groups do not poison the stream", one_stream)

        # ---- refused groups keep their lease: correct and resubmit -------------
        def submit_good(lease):
            version = builder.learn(c.manifest(a))
            ack = c.submit_one(a, lease.lease_id, builder.group(lease, version))
            if ack.accepted:
                good_accepted.append(ack.store_seq)
            check(ack.accepted, f"refused: code {ack.error_code}: {ack.error_message!r}")
            return ack

        def resubmit():
            check("k mismatch" in kept, "no refused lease was kept (the k mismatch case failed)")
            lease, _ = kept.pop("k mismatch")
            ack = submit_good(lease)
            return f"lease {lease.lease_id} accepted (store_seq {ack.store_seq})"
        results.case("corrected group on a refused lease is accepted", resubmit)

        def fresh_good():
            lease, _ = c.lease(a)
            return f"store_seq {submit_good(lease).store_seq}"
        results.case("good group on a fresh lease is accepted", fresh_good)

        def still_serving():
            h = c.health()
            s = c.stats()
            check(h.serving, "Health.serving is false")
            check(trainer.alive(), "relay-trainer exited")
            return f"version {s.version}, accepted {s.accepted}, in flight {s.in_flight}"
        results.case("trainer still serving after the malformed groups", still_serving)

        # ---- garbage bytes --------------------------------------------------------
        def garbage():
            try:
                acks = list(c.submit_raw_call(iter([b"\xff\xff\xff garbage"]),
                                              timeout=RPC_TIMEOUT_S))
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                      f"status {e.code()}: {e.details()!r}, want INVALID_ARGUMENT")
                check("does not parse" in (e.details() or ""),
                      f"details do not say 'does not parse': {e.details()!r}")
                return f"{e.code().name}: {e.details()}"
            raise CaseFailure(f"the call ended OK with {len(acks)} acks; want INVALID_ARGUMENT "
                              "'does not parse'")
        results.case("garbage bytes end the stream with INVALID_ARGUMENT", garbage)

        def garbage_after_a_group():
            w = pb["worker"]
            first = w.SubmitGroupRequest(worker_id=a, lease_id=(1 << 51)).SerializeToString()
            acks = []
            try:
                for ack in c.submit_raw_call(iter([first, b"\xff\xff\xff garbage"]),
                                             timeout=RPC_TIMEOUT_S):
                    acks.append(ack)
            except grpc.RpcError as e:
                check(len(acks) == 1, f"{len(acks)} acks before the error, want 1")
                check(acks[0].error_code == FAILED_PRECONDITION,
                      f"first ack: code {acks[0].error_code} {acks[0].error_message!r}")
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                      f"status {e.code()}: {e.details()!r}, want INVALID_ARGUMENT")
                check("does not parse" in (e.details() or ""),
                      f"details do not say 'does not parse': {e.details()!r}")
                return f"1 ack, then {e.code().name}: {e.details()}"
            raise CaseFailure(f"the call ended OK with {len(acks)} acks")
        results.case("garbage after a parseable message: ack, then INVALID_ARGUMENT",
                     garbage_after_a_group)

        # The same on a stream that sends ahead of its acks (the trainer reads
        # it ahead of them: src/comm/rpc/submit_stream.h): every message
        # before the garbage is acked, in order, before the call ends.
        def garbage_after_groups_sent_ahead():
            w = pb["worker"]
            sent = [w.SubmitGroupRequest(worker_id=a, lease_id=(1 << 51) + i).SerializeToString()
                    for i in range(3)]
            acks = []
            try:
                for ack in c.submit_raw_call(iter(sent + [b"\xff\xff\xff garbage"]),
                                             timeout=RPC_TIMEOUT_S,
                                             metadata=[("relay-submit-ahead", "1")]):
                    acks.append(ack)
            except grpc.RpcError as e:
                check([k.lease_id for k in acks] == [(1 << 51) + i for i in range(3)],
                      f"acks for leases {[k.lease_id for k in acks]}, want the 3 sent, in order")
                check(all(k.error_code == FAILED_PRECONDITION for k in acks),
                      f"ack codes {[k.error_code for k in acks]}")
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
                      f"status {e.code()}: {e.details()!r}, want INVALID_ARGUMENT")
                check("message 3: does not parse" in (e.details() or ""),
                      f"details do not say 'message 3: does not parse': {e.details()!r}")
                return f"3 acks, then {e.code().name}: {e.details()}"
            raise CaseFailure(f"the call ended OK with {len(acks)} acks")
        results.case("sent ahead: three acks in order, then INVALID_ARGUMENT",
                     garbage_after_groups_sent_ahead)

        # ---- stale: a group of version 0 once the trainer is past the bound ----
        def stale():
            target = version0 + MAX_STALENESS + 1
            deadline = time.monotonic() + 60
            while c.stats().version < target:
                check(time.monotonic() < deadline,
                      f"trainer at version {c.stats().version} after 60 s, want {target}")
                check(trainer.alive(), "relay-trainer exited")
                s = c.stats()
                if s.store_ready >= GROUPS_PER_STEP:  # a step is due: let it happen
                    time.sleep(0.05)
                    continue
                lease, _ = c.lease(a)
                version = builder.learn(c.manifest(a))
                ack = c.submit_one(a, lease.lease_id, builder.group(lease, version))
                check(ack.accepted, f"good group refused: code {ack.error_code}: "
                      f"{ack.error_message!r}")
                good_accepted.append(ack.store_seq)
            lease, version = c.lease(a)
            g = builder.group(lease, version)
            for t in g.trajectories:
                set_versions(t, version0, builder)
            in_flight = c.stats().in_flight
            ack = c.submit_one(a, lease.lease_id, g)
            if ack.accepted:
                good_accepted.append(ack.store_seq)
            check(not ack.accepted, f"a version-{version0} group accepted at version {version}")
            check(ack.error_code == FAILED_PRECONDITION,
                  f"error_code {ack.error_code}, want {FAILED_PRECONDITION}: {ack.error_message!r}")
            check("token_versions" in ack.error_message,
                  f"message does not name token_versions: {ack.error_message!r}")
            # Stale is final: the server gives the lease back itself.
            after = c.stats().in_flight
            check(after == in_flight - 1,
                  f"in flight {in_flight} -> {after}: the stale group's lease was not released")
            check(c.release(a, [lease.lease_id]) == 0, "the stale group's lease is still held")
            return f"at version {version}: code {ack.error_code}: {ack.error_message}"
        results.case("stale token version past the staleness bound", stale)

        # ---- the end: alive, and the store holds only the good groups -----------
        def end_state():
            check(trainer.alive(), f"relay-trainer exited with {trainer.proc.returncode}")
            h = c.health()
            check(h.serving, "Health.serving is false")
            s = c.stats()
            check(s.accepted == len(good_accepted),
                  f"Stats.accepted {s.accepted}, but {len(good_accepted)} good groups were "
                  f"acknowledged: a refused group reached the store")
            check(len(set(good_accepted)) == len(good_accepted),
                  f"store_seq repeated: {sorted(good_accepted)}")
            log = trainer.output()
            check("quarantined" not in log,
                  "the trainer quarantined a group it had accepted:\n" +
                  "\n".join(line for line in log.splitlines() if "quarantined" in line))
            return (f"version {s.version}, accepted {s.accepted} = good groups; ready "
                    f"{s.store_ready}, consumed {s.store_consumed}, expired {s.store_expired}")
        results.case("trainer alive; the store holds only the good groups", end_state)
        ok = not results.failed
    except Exception:
        traceback.print_exc()
        ok = False
    finally:
        if trainer is not None:
            code = trainer.stop()
            print(f"relay-trainer stopped (SIGTERM): exit code {code}", flush=True)
            if not ok:
                print("---- relay-trainer log ----\n" + trainer.output() + "---- end of log ----",
                      flush=True)
        shutil.rmtree(base, ignore_errors=True)
    print(f"{len(results.passed)} passed, {len(results.failed)} failed" +
          (": " + "; ".join(results.failed) if results.failed else ""), flush=True)
    return 0 if ok else 1


def main():
    trainer_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RELAY_TRAINER_PATH")
    source_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not trainer_path:
        sys.exit("usage: grpc_client_test.py RELAY_TRAINER [SOURCE_DIR] "
                 "(or set $RELAY_TRAINER_PATH)")
    if not os.access(trainer_path, os.X_OK):
        sys.exit(f"grpc_client_test: {trainer_path} is not an executable")
    return run(os.path.abspath(trainer_path), os.path.abspath(source_dir))


if __name__ == "__main__":
    sys.exit(main())
