// Rules of the process-level sections (experiment, eval, services, run,
// model), which no single component reads. The components' own sections are
// checked by their check() functions (trainer, rollout, task).

#include "config/rules.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace relay::config {
namespace {

bool is_run_name_char(char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-';
}

void check_experiment(const ExperimentConfig& config, Problems& p) {
  const ExperimentSection& ex = config.experiment;
  if (ex.name.empty()) {
    p.add("experiment.name", "must be non-empty", ex.name);
  } else if (!std::all_of(ex.name.begin(), ex.name.end(), is_run_name_char)) {
    p.add("experiment.name", "must contain only [A-Za-z0-9._-]", ex.name);
  } else if (ex.name == "." || ex.name == "..") {
    // The run directory is <output_dir>/<name>; these would escape it.
    p.add("experiment.name", "must not be '.' or '..'", ex.name);
  }
  if (ex.output_dir.empty()) p.add("experiment.output_dir", "must be non-empty", "");
  p.at_least("experiment.steps", ex.steps, 0);
  p.at_least("experiment.groups_per_step", ex.groups_per_step, 1);
  p.at_least("eval.prompts", config.eval.prompts, 0);
  p.at_least("eval.every", config.eval.every, 0);
  p.at_least("eval.n", config.eval.n, 0);
  p.positive("eval.temperature", config.eval.temperature);
  p.at_least("experiment.checkpoint_every", ex.checkpoint_every, 0);
  p.at_least("experiment.keep_checkpoints", ex.keep_checkpoints, 1);
  p.at_least("experiment.warm_start.sft_steps", ex.warm_start.sft_steps, 0);
  p.positive("experiment.warm_start.sft_lr", ex.warm_start.sft_lr);
  p.at_least("experiment.warm_start.batch", ex.warm_start.batch, 1);
}

void check_services(const ServicesConfig& sv, Problems& p) {
  if (sv.listen.empty() || sv.listen.rfind(':') == std::string::npos) {
    p.add("services.listen", "must be host:port", sv.listen);
  }
  if (!sv.http_listen.empty() && sv.http_listen.rfind(':') == std::string::npos) {
    p.add("services.http_listen", "must be host:port or empty (off)", sv.http_listen);
  }
  p.positive("services.lease_timeout_s", sv.lease_timeout_s);
  p.positive("services.group_wait_s", sv.group_wait_s);
  p.positive("services.rpc_timeout_s", sv.rpc_timeout_s);
  p.non_negative("services.worker_timeout_s", sv.worker_timeout_s);
  if (sv.weight_sync_port < 0 || sv.weight_sync_port > 65535) {
    p.add("services.weight_sync_port", "must be in [0, 65535]", sv.weight_sync_port);
  }
  p.at_least("services.weight_sync_bucket_mb", sv.weight_sync_bucket_mb, 1);
  p.positive("services.weight_sync_timeout_s", sv.weight_sync_timeout_s);
  if (sv.tls.cert.empty() != sv.tls.key.empty()) {
    p.add(sv.tls.cert.empty() ? "services.tls.cert" : "services.tls.key",
          "services.tls.cert and services.tls.key go together", "");
  }
  if (!sv.tls.cert.empty() && sv.tls.ca.empty()) {
    p.add("services.tls.ca",
          "must name the CA that signed services.tls.cert (workers verify the trainer with it)",
          "");
  }
  if (sv.tls.mutual && (sv.tls.ca.empty() || sv.tls.cert.empty())) {
    p.add("services.tls.mutual", "needs services.tls.ca, cert and key", "true");
  }
}

void check_run(const RunConfig& run, Problems& p) {
  p.at_least("run.threads", run.threads, 0);
  {
    const std::string& d = run.device;
    const bool cuda_index =
        d.size() > 5 && d.rfind("cuda:", 0) == 0 &&
        std::all_of(d.begin() + 5, d.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (d != "cpu" && d != "cuda" && !cuda_index) {
      p.add("run.device", "must be cpu, cuda or cuda:<index>", d);
    }
  }
}

void check_model(const ExperimentConfig& config, Problems& p) {
  // Whether the tokenizer has the format's special tokens is known only once
  // it is loaded (rollout setup checks it, naming model.chat_template).
  if (config.model.chat_template == model::ChatTemplateChoice::kNone &&
      !config.model.system_prompt.empty()) {
    // A system message exists only in a chat format; ignoring it would
    // silently train on other prompts than the ones configured.
    p.add("model.system_prompt",
          "needs model.chat_template (chatml, llama3 or auto); without a chat format there "
          "is no system message",
          config.model.system_prompt);
  }
  const ModelInitConfig& init = config.model.init;
  p.at_least("model.init.head_dim", init.head_dim, 0);
  if (init.head_dim % 2 != 0) p.add("model.init.head_dim", "must be even (RoPE)", init.head_dim);
  if (init.arch == ModelArch::kQwen3Moe) {
    p.at_least("model.init.experts", init.experts, 1);
    p.at_least("model.init.experts_per_tok", init.experts_per_tok, 1);
    if (init.experts_per_tok > init.experts) {
      p.add("model.init.experts_per_tok",
            absl::StrCat("must be <= model.init.experts (", init.experts, ")"),
            init.experts_per_tok);
    }
    p.at_least("model.init.moe_ffn", init.moe_ffn, 0);
  }
  p.at_least("model.init.layers", init.layers, 1);
  p.at_least("model.init.hidden", init.hidden, 1);
  p.at_least("model.init.heads", init.heads, 1);
  p.at_least("model.init.kv_heads", init.kv_heads, 1);
  p.at_least("model.init.ffn", init.ffn, 1);
  p.at_least("model.init.vocab", init.vocab, 0);
  p.at_least("model.init.max_seq_len", init.max_seq_len, 1);
  if (init.heads >= 1 && init.kv_heads >= 1 && init.heads % init.kv_heads != 0) {
    p.add("model.init.kv_heads", absl::StrCat("must divide model.init.heads (", init.heads, ")"),
          init.kv_heads);
  }
  if (init.heads >= 1 && init.hidden >= 1 && init.head_dim == 0) {
    if (init.hidden % init.heads != 0) {
      p.add("model.init.hidden",
            absl::StrCat("must be divisible by model.init.heads (", init.heads, ")"), init.hidden);
    } else if ((init.hidden / init.heads) % 2 != 0) {
      p.add("model.init.hidden",
            absl::StrCat("must give an even head dim (hidden / model.init.heads) for RoPE, got ",
                         init.hidden, " / ", init.heads, " = ", init.hidden / init.heads));
    }
  }
  p.positive("model.init.rope_theta", init.rope_theta);
  p.positive("model.init.rms_norm_eps", init.rms_norm_eps);
}

}  // namespace

void check(const ExperimentConfig& config, Problems p) {
  check_experiment(config, p);
  check_services(config.services, p);
  check_run(config.run, p);
  check_model(config, p);
  // The run's lease dispenser bounds leases by the staleness: a run needs
  // one, where a trainer built in code may go without (-1).
  p.at_least("trainer.max_staleness", config.trainer.max_staleness, 0);
  check(config.rollout, p.at("rollout"));
  check(config.task, p.at("task"));
  // Who answers the model's tool calls: relay's environment, or the agents.
  const bool agents = !config.rollout.agent.listen.empty();
  const bool environment = config.task.environment != rollout::EnvironmentKind::kNone;
  if (agents && config.trainer.advantage.estimator == trainer::AdvantageEstimator::kRemax) {
    p.add("rollout.agent.listen",
          "agents play sampled episodes only, and trainer.advantage.estimator remax needs a "
          "greedy baseline per group; use another estimator (grpo, rloo, ...)");
  }
  if (config.task.name == rollout::TaskKind::kArithmetic &&
      config.task.arithmetic.format == rollout::ArithmeticFormat::kCalculator && !environment &&
      !agents) {
    p.add("task.arithmetic.format",
          "calculator's targets are tool calls: it needs task.environment calculator or remote, "
          "or agents (rollout.agent.listen), to answer them");
  }
  const int64_t overlong = config.trainer.overlong_buffer.length;
  if (overlong > 0 && (agents || environment)) {
    p.add("trainer.overlong_buffer.length",
          "DAPO's length penalty counts one response against rollout.max_new_tokens; episodes "
          "(task.environment, rollout.agent.listen) have a budget per turn",
          overlong);
  }
  if (overlong > 0 && overlong >= config.rollout.engine.max_new_tokens) {
    p.add("trainer.overlong_buffer.length",
          absl::StrCat("must be < rollout.max_new_tokens (", config.rollout.engine.max_new_tokens,
                       ")"),
          overlong);
  }
  // Distillation: the rollout side scores with the teacher, the trainer
  // weighs it by coef; one without the other is a mistake either way.
  const trainer::DistillOptions& distill = config.trainer.distill;
  if (distill.enabled() && distill.teacher.empty()) {
    p.add("trainer.distill.teacher",
          "trainer.distill.coef > 0 needs the teacher's model directory, which the rollout "
          "workers score every response with");
  }
  if (!distill.enabled() && !distill.teacher.empty()) {
    p.add("trainer.distill.coef",
          "must be > 0 with trainer.distill.teacher set (Thinking Machines' recipe uses 1)",
          distill.coef);
  }
  trainer::check(config.trainer, p.at("trainer"));
}

}  // namespace relay::config
