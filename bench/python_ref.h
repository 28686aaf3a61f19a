#pragma once

// The Python side of the benchmarks that compare relay with plain PyTorch on
// the same LibTorch: bench/python/relay_ref.py run as a child process in its
// "serve" mode (one JSON command a line on its stdin, one JSON reply a line
// on its stdout), plus what both sides need to run the same model: a model
// directory relay writes and the script loads, and a logits check that fails
// the benchmark when the two models disagree. Header-only, like bench_util.h.
//
// Every failure here ends the benchmark with a message (exit 1): a comparison
// of unequal work is worse than none.

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "relay/model/checkpoint.h"
#include "relay/model/policy.h"
#include "relay/model/safetensors.h"

namespace relay::bench {

// Where the script and an interpreter with torch are. The interpreter is
// $RELAY_PYTHON, else /usr/bin/python3 (Debian's python3-torch; a pyenv or
// venv `python3` earlier on PATH usually has no torch).
inline std::string default_python() {
  const char* env = std::getenv("RELAY_PYTHON");
  return env && *env ? env : "/usr/bin/python3";
}
inline std::string default_python_script() {
  return std::string(RELAY_SOURCE_DIR) + "/bench/python/relay_ref.py";
}

// A private scratch directory, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "relay_bench_py.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) fail("mkdtemp " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class PythonRef {
 public:
  // Starts `python script serve --threads T --blas-threads B` and reads its
  // greeting (torch version and the thread settings it ended up with).
  PythonRef(const std::string& python, const std::string& script, int threads, int blas_threads) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) fail("pipe");
    const std::string t = std::to_string(threads), b = std::to_string(blas_threads);
    pid_ = fork();
    if (pid_ < 0) fail("fork");
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[0]);
      close(to_child[1]);
      close(from_child[0]);
      close(from_child[1]);
      // OMP_NUM_THREADS would override nothing here (the script sets threads
      // itself), but OpenBLAS reads its variable at load time: drop it so the
      // script's setting is the one in force, as relay's is.
      unsetenv("OPENBLAS_NUM_THREADS");
      execl(python.c_str(), python.c_str(), script.c_str(), "serve", "--threads", t.c_str(),
            "--blas-threads", b.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "cannot run %s: %s\n", python.c_str(), std::strerror(errno));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    hello_ = read_reply("start " + python + " " + script);
  }

  ~PythonRef() {
    if (in_ != nullptr) {
      std::fputs("{\"cmd\": \"quit\"}\n", in_);
      std::fclose(in_);
    }
    if (out_ != nullptr) std::fclose(out_);
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
  }
  PythonRef(const PythonRef&) = delete;
  PythonRef& operator=(const PythonRef&) = delete;

  // {"ok": true, "torch": "1.13.0a0", "intra_op": 1, "blas": 2}
  const nlohmann::json& hello() const { return hello_; }

  // Sends one command; returns its reply, or ends the benchmark when the
  // reply says ok: false (or the process died).
  nlohmann::json call(const nlohmann::json& command) {
    const std::string line = command.dump() + "\n";
    if (std::fputs(line.c_str(), in_) < 0 || std::fflush(in_) != 0) {
      fail("python reference: cannot send " + command.value("cmd", std::string("?")));
    }
    return read_reply(command.value("cmd", std::string("?")));
  }

 private:
  nlohmann::json read_reply(const std::string& what) {
    std::string line;
    for (int c; (c = std::fgetc(out_)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
    if (line.empty()) fail("python reference: no reply to '" + what + "' (see its stderr above)");
    nlohmann::json reply = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded() || !reply.value("ok", false)) {
      fail("python reference: '" + what + "' failed: " + line);
    }
    return reply;
  }

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  nlohmann::json hello_;
};

// Where and how the Python process runs the model it loads: the CPU in fp32
// with eager attention unless the benchmark runs relay's models elsewhere
// (rollout_bench --device, --dtype, --py-attention).
struct PyPlacement {
  std::string device = "cpu";       // "cpu", "cuda", "cuda:1"
  std::string dtype = "float32";    // or "bfloat16"
  std::string attention = "eager";  // or "sdpa" (torch >= 2.0)
  bool fp32_cpu() const { return device == "cpu" && dtype == "float32"; }
  nlohmann::json load(const std::string& dir) const {
    return {{"cmd", "load"},
            {"dir", dir},
            {"device", device},
            {"dtype", dtype},
            {"attention", attention}};
  }
};

// Writes `policy` as an HF model directory `dir`/`name`; returns its path.
inline std::string save_model(model::PolicyImpl& policy, const std::string& dir,
                              const std::string& name) {
  const std::string model_dir = dir + "/" + name;
  model::SaveOptions so;
  so.overwrite = true;
  if (Status s = model::save_policy(policy, model_dir, so); !s.ok()) {
    fail("save_policy: " + std::string(s.message()));
  }
  return model_dir;
}

// Has the Python process load `model_dir` (`load`: a PyPlacement's command)
// and compares logits for two rows of 12 fixed random tokens, through the
// script's full forward and its KV-cache path, with `policy`'s (on whatever
// device and in whatever dtype it is). Ends the benchmark when either
// differs from relay's by more than tol x max(1, max |logit|). Returns the
// reply: max_abs_diff, max_abs_diff_cached, max_abs_logit.
inline nlohmann::json compare_logits(PythonRef& py, model::PolicyImpl& policy,
                                     const std::string& model_dir, const nlohmann::json& load,
                                     double tol) {
  py.call(load);
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<int64_t> token(0, policy.config().vocab_size - 1);
  at::Tensor ids = at::empty({2, 12}, at::kLong);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data_ptr<int64_t>()[i] = token(gen);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    const at::Device device = policy.parameters().front().device();
    logits = policy.forward(ids.to(device)).to(at::kCPU, at::kFloat).contiguous();
  }
  const std::string check = model_dir + ".check.safetensors";
  if (Status s = model::write_safetensors(check, {{"input_ids", ids}, {"logits", logits}});
      !s.ok()) {
    fail("write_safetensors: " + std::string(s.message()));
  }
  return py.call({{"cmd", "check_logits"}, {"file", check}, {"tol", tol}});
}

// The tolerance of the check where both sides run in bfloat16: each rounds
// its activations at its own points (relay's kernels widen the weights and
// accumulate in fp32; LibTorch's may not), so they agree to the format's
// precision, not to fp32's. A wrong RoPE, mask or norm is off by the
// logits' own scale (the probe model below makes sure of that).
inline constexpr double kBFloat16Tolerance = 5e-2;

// The equivalence check before a comparison. The benchmark's own random
// weights (N(0, 0.02)) make attention nearly uniform, so on their own they
// would let a wrong RoPE or mask pass; a probe model of the same
// architecture with weights N(0, sqrt(4 / hidden)) (attention scores of
// standard deviation ~4) is compared first, on the CPU in fp32. Then
// `policy` is written to `dir`/`name` and compared the same way. When the
// benchmark runs elsewhere (`at`: a device, bfloat16), both sides then load
// that directory there and are compared again at the dtype's tolerance;
// the Python process keeps the model as `at` says. Returns the fp32
// comparison's reply plus "probe_max_abs_diff", "placed_max_abs_diff" (the
// comparison at `at`, when it is not the CPU in fp32) and a one-line
// "summary".
inline nlohmann::json load_and_check(PythonRef& py, model::PolicyImpl& policy,
                                     const std::string& dir, const std::string& name,
                                     double tol = 1e-3, const PyPlacement& at = {}) {
  PyPlacement reference = at;
  reference.device = "cpu";
  reference.dtype = "float32";
  auto worst = [](const nlohmann::json& r) {
    return std::max(r.at("max_abs_diff").get<double>(), r.at("max_abs_diff_cached").get<double>());
  };
  model::Policy probe(policy.config());
  model::init_weights(*probe, /*seed=*/1, std::sqrt(4.0 / policy.config().hidden_size));
  const std::string probe_dir = save_model(*probe, dir, name + ".probe");
  const nlohmann::json p = compare_logits(py, *probe, probe_dir, reference.load(probe_dir), tol);

  const std::string model_dir = save_model(policy, dir, name);
  nlohmann::json r, placed;
  if (at.fp32_cpu()) {
    r = compare_logits(py, policy, model_dir, at.load(model_dir), tol);
  } else {
    // The saved weights (rounded to the policy's dtype) in fp32 on the CPU
    // on both sides, then both as `at` says.
    {  // the fp32 copy is freed before the placed load
      auto copy = model::load_policy(model_dir, model::LoadOptions{});
      if (!copy.ok())
        fail("load_policy " + model_dir + ": " + std::string(copy.status().message()));
      (*copy)->eval();
      r = compare_logits(py, **copy, model_dir, reference.load(model_dir), tol);
    }
    placed = compare_logits(py, policy, model_dir, at.load(model_dir),
                            at.dtype == "bfloat16" ? kBFloat16Tolerance : tol);
    r["placed_max_abs_diff"] = worst(placed);
  }
  r["probe_max_abs_diff"] = worst(p);
  char buf[384];
  std::snprintf(buf, sizeof(buf),
                "python vs relay logits: max |diff| %.1e (cached path %.1e, max |logit| %.2f); "
                "probe weights %.1e (max |logit| %.1f)",
                r.at("max_abs_diff").get<double>(), r.at("max_abs_diff_cached").get<double>(),
                r.at("max_abs_logit").get<double>(), r["probe_max_abs_diff"].get<double>(),
                p.at("max_abs_logit").get<double>());
  std::string summary = buf;
  if (!placed.is_null()) {
    std::snprintf(buf, sizeof(buf), "; on %s in %s, %s attention: %.1e (max |logit| %.2f)",
                  at.device.c_str(), at.dtype.c_str(), at.attention.c_str(), worst(placed),
                  placed.at("max_abs_logit").get<double>());
    summary += buf;
  }
  r["summary"] = summary;
  return r;
}

}  // namespace relay::bench
