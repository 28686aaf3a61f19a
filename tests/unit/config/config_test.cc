#include "relay/config/config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace relay {
namespace {

// Writes `text` to `name` under the test's temp directory; returns the path.
std::string write_temp(const std::string& name, const std::string& text) {
  std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "relay_config_test";
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Field-by-field equality, so a failure names the field.
void expect_same(const ExperimentConfig& a, const ExperimentConfig& b) {
  EXPECT_EQ(a.experiment.name, b.experiment.name);
  EXPECT_EQ(a.experiment.output_dir, b.experiment.output_dir);
  EXPECT_EQ(a.experiment.steps, b.experiment.steps);
  EXPECT_EQ(a.experiment.warm_start.sft_lr, b.experiment.warm_start.sft_lr);
  EXPECT_EQ(a.services.listen, b.services.listen);
  EXPECT_EQ(a.services.weight_sync, b.services.weight_sync);
  EXPECT_EQ(a.services.tls.mutual, b.services.tls.mutual);
  EXPECT_EQ(a.rollout.workers, b.rollout.workers);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.threads, b.run.threads);
  EXPECT_EQ(a.run.log_level, b.run.log_level);
  EXPECT_EQ(a.model.path, b.model.path);
  EXPECT_EQ(a.model.dtype, b.model.dtype);
  EXPECT_EQ(a.model.tokenizer, b.model.tokenizer);
  EXPECT_EQ(a.model.chat_template, b.model.chat_template);
  EXPECT_EQ(a.model.system_prompt, b.model.system_prompt);
  const ModelInitConfig& ai = a.model.init;
  const ModelInitConfig& bi = b.model.init;
  EXPECT_EQ(ai.arch, bi.arch);
  EXPECT_EQ(ai.layers, bi.layers);
  EXPECT_EQ(ai.hidden, bi.hidden);
  EXPECT_EQ(ai.heads, bi.heads);
  EXPECT_EQ(ai.kv_heads, bi.kv_heads);
  EXPECT_EQ(ai.ffn, bi.ffn);
  EXPECT_EQ(ai.vocab, bi.vocab);
  EXPECT_EQ(ai.max_seq_len, bi.max_seq_len);
  EXPECT_EQ(ai.rope_theta, bi.rope_theta);  // exact: doubles must round-trip
  EXPECT_EQ(ai.rms_norm_eps, bi.rms_norm_eps);
  EXPECT_EQ(ai.tie_embeddings, bi.tie_embeddings);
  EXPECT_EQ(a.rollout.n, b.rollout.n);
  EXPECT_EQ(a.rollout.engine.max_new_tokens, b.rollout.engine.max_new_tokens);
  EXPECT_EQ(a.rollout.engine.sampling.temperature, b.rollout.engine.sampling.temperature);
  EXPECT_EQ(a.rollout.engine.sampling.top_k, b.rollout.engine.sampling.top_k);
  EXPECT_EQ(a.rollout.engine.sampling.top_p, b.rollout.engine.sampling.top_p);
  EXPECT_EQ(a.rollout.stop, b.rollout.stop);
  EXPECT_EQ(a.rollout.engine.sampling.record_raw_logprobs,
            b.rollout.engine.sampling.record_raw_logprobs);
  EXPECT_EQ(a.rollout.engine.num_slots, b.rollout.engine.num_slots);
  EXPECT_EQ(a.rollout.engine.interrupt, b.rollout.engine.interrupt);
  const rollout::PrefixOptions& ap = a.rollout.engine.prefix;
  const rollout::PrefixOptions& bp = b.rollout.engine.prefix;
  EXPECT_EQ(ap.n_prefix, bp.n_prefix);
  EXPECT_EQ(ap.strategy, bp.strategy);
  EXPECT_EQ(ap.min_ratio, bp.min_ratio);
  EXPECT_EQ(ap.max_ratio, bp.max_ratio);
  EXPECT_EQ(ap.steps, bp.steps);
  EXPECT_EQ(ap.share_across_group, bp.share_across_group);
  EXPECT_EQ(ap.max_len, bp.max_len);
  EXPECT_EQ(a.task.name, b.task.name);
  EXPECT_EQ(a.task.path, b.task.path);
  EXPECT_EQ(a.task.verifier_timeout_s, b.task.verifier_timeout_s);
  EXPECT_EQ(a.task.arithmetic.min_operands, b.task.arithmetic.min_operands);
  EXPECT_EQ(a.task.arithmetic.max_operands, b.task.arithmetic.max_operands);
  EXPECT_EQ(a.task.arithmetic.min_digits, b.task.arithmetic.min_digits);
  EXPECT_EQ(a.task.arithmetic.max_digits, b.task.arithmetic.max_digits);
  EXPECT_EQ(a.task.arithmetic.operators, b.task.arithmetic.operators);
  EXPECT_EQ(a.task.math_answer.format_reward, b.task.math_answer.format_reward);
  EXPECT_EQ(a.task.jsonl.prompt_key, b.task.jsonl.prompt_key);
  EXPECT_EQ(a.task.jsonl.answer_key, b.task.jsonl.answer_key);
  EXPECT_EQ(a.task.jsonl.target_key, b.task.jsonl.target_key);
  EXPECT_EQ(a.task.jsonl.match, b.task.jsonl.match);
  // The trainer's section, key by key, as the binding lists it.
  auto trainer_fields = [](const ExperimentConfig& c) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& field : config_fields(c)) {
      if (field.first.rfind("trainer.", 0) == 0) out.push_back(field);
    }
    return out;
  };
  EXPECT_EQ(trainer_fields(a), trainer_fields(b));
}

// Message of a failed parse_config, or "OK" so a wrong success shows plainly.
std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  StatusOr<ExperimentConfig> config = parse_config(yaml, "x.yaml", overrides);
  return config.ok() ? "OK" : std::string(config.status().message());
}

TEST(ConfigTest, LoadsFileWithExpectedValuesAndDefaults) {
  std::string path = write_temp("valid.yaml",
                                "experiment:\n"
                                "  name: grpo-1\n"
                                "run:\n"
                                "  seed: 42\n"
                                "model:\n"
                                "  dtype: bfloat16\n"
                                "  init:\n"
                                "    arch: qwen2\n"
                                "    layers: 4\n"
                                "    rms_norm_eps: 1e-5\n"
                                "    tie_embeddings: false\n"
                                "rollout:\n"
                                "  n: 16\n"
                                "  top_p: 0.9\n"
                                "trainer:\n"
                                "  lr: 3e-6\n");
  StatusOr<ExperimentConfig> config = load_config(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->experiment.name, "grpo-1");
  EXPECT_EQ(config->run.seed, 42u);
  EXPECT_EQ(config->model.dtype, model::Precision::kBFloat16);
  EXPECT_EQ(config->model.init.arch, ModelArch::kQwen2);
  EXPECT_EQ(config->model.init.layers, 4);
  EXPECT_EQ(config->model.init.rms_norm_eps, 1e-5);
  EXPECT_FALSE(config->model.init.tie_embeddings);
  EXPECT_EQ(config->rollout.n, 16);
  EXPECT_EQ(config->rollout.engine.sampling.top_p, 0.9);
  EXPECT_EQ(config->trainer.optimizer.lr, 3e-6);
  // Untouched fields keep their defaults.
  EXPECT_EQ(config->experiment.output_dir, "runs");
  EXPECT_EQ(config->run.log_level, LogLevel::kInfo);
  EXPECT_EQ(config->model.path, "");
  EXPECT_EQ(config->model.init.hidden, 64);
  EXPECT_EQ(config->model.init.rope_theta, 10000.0);
  EXPECT_EQ(config->rollout.engine.max_new_tokens, 32);
  EXPECT_EQ(config->rollout.engine.sampling.temperature, 1.0);
  EXPECT_EQ(config->trainer.max_staleness, 0);
}

TEST(ConfigTest, EmptyDocumentGivesDefaults) {
  for (const char* yaml :
       {"", "\n", "# nothing here\n", "~\n", "rollout:\n", "model:\n  init:\n"}) {
    SCOPED_TRACE(yaml);
    StatusOr<ExperimentConfig> config = parse_config(yaml, "x.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    expect_same(*config, ExperimentConfig{});
  }
}

TEST(ConfigTest, ToYamlPrintsEveryFieldWithDefaults) {
  EXPECT_EQ(to_yaml(ExperimentConfig{}),
            "experiment:\n"
            "  name: default\n"
            "  output_dir: runs\n"
            "  steps: 100\n"
            "  groups_per_step: 8\n"
            "  checkpoint_every: 10\n"
            "  keep_checkpoints: 2\n"
            "  keep_best_checkpoint: true\n"
            "  warm_start:\n"
            "    sft_steps: 0\n"
            "    sft_lr: 0.001\n"
            "    batch: 32\n"
            "eval:\n"
            "  prompts: 0\n"
            "  every: 0\n"
            "  n: 0\n"
            "  temperature: 1.0\n"
            "run:\n"
            "  seed: 0\n"
            "  threads: 0\n"
            "  core_share: \"\"\n"
            "  log_level: info\n"
            "  device: cpu\n"
            "  autocast: none\n"
            "model:\n"
            "  path: \"\"\n"
            "  dtype: float32\n"
            "  tokenizer: char\n"
            "  chat_template: none\n"
            "  system_prompt: \"\"\n"
            "  attn_implementation: auto\n"
            "  init:\n"
            "    arch: llama\n"
            "    layers: 2\n"
            "    hidden: 64\n"
            "    heads: 4\n"
            "    kv_heads: 2\n"
            "    head_dim: 0\n"
            "    ffn: 128\n"
            "    experts: 4\n"
            "    experts_per_tok: 2\n"
            "    moe_ffn: 0\n"
            "    vocab: 0\n"
            "    max_seq_len: 256\n"
            "    rope_theta: 10000.0\n"
            "    rms_norm_eps: 1e-06\n"
            "    tie_embeddings: true\n"
            "rollout:\n"
            "  n: 8\n"
            "  max_new_tokens: 32\n"
            "  temperature: 1.0\n"
            "  top_k: 0\n"
            "  top_p: 1.0\n"
            "  stop: []\n"
            "  record_raw_logprobs: false\n"
            "  num_slots: 64\n"
            "  kv_cache_gb: 0.0\n"
            "  kv_cache_fraction: 0.5\n"
            "  interrupt: recompute\n"
            "  dtype: model\n"
            "  fp32_lm_head: false\n"
            "  decode_graphs: auto\n"
            "  workers: 1\n"
            "  groups_in_flight: 16\n"
            "  prefix:\n"
            "    n_prefix: 0\n"
            "    strategy: random\n"
            "    min_ratio: 0.0\n"
            "    max_ratio: 0.8\n"
            "    steps: 300\n"
            "    share_across_group: false\n"
            "    max_len: 8192\n"
            "  episode:\n"
            "    max_turns: 4\n"
            "    max_tokens: 0\n"
            "  agent:\n"
            "    listen: \"\"\n"
            "    command: []\n"
            "    episode_timeout_s: 600.0\n"
            "task:\n"
            "  name: arithmetic\n"
            "  path: \"\"\n"
            "  verifier_timeout_s: 5.0\n"
            "  environment: none\n"
            "  environment_address: \"\"\n"
            "  environment_timeout_s: 60.0\n"
            "  arithmetic:\n"
            "    format: brackets\n"
            "    min_operands: 2\n"
            "    max_operands: 3\n"
            "    min_digits: 1\n"
            "    max_digits: 1\n"
            "    operators: +\n"
            "  math_answer:\n"
            "    format_reward: 0.0\n"
            "  jsonl:\n"
            "    prompt_key: prompt\n"
            "    answer_key: answer\n"
            "    target_key: target\n"
            "    match: exact\n"
            "trainer:\n"
            "  max_staleness: 0\n"
            "  lr: 1e-05\n"
            "  loss: ppo\n"
            "  proximal: recorded\n"
            "  micro_batch_tokens: 8192\n"
            "  pack_sequences: false\n"
            "  ppo_epochs: 1\n"
            "  mini_batches: 1\n"
            "  allow_missing_logprobs: false\n"
            "  drop_equal_reward_groups: false\n"
            "  mask_truncated: false\n"
            "  overlong_buffer:\n"
            "    length: 0\n"
            "    penalty_factor: 1.0\n"
            "  kl_coef: 0.0\n"
            "  kl_estimator: k3\n"
            "  sft_coef: 0.0\n"
            "  loss_scale_factor: 0.0\n"
            "  reference: \"\"\n"
            "  max_reuse: 0\n"
            "  max_extra_batches: 0\n"
            "  world_size: 1\n"
            "  rendezvous: \"\"\n"
            "  allreduce_bucket_mb: 25\n"
            "  collective_timeout_s: 300.0\n"
            "  sharding: none\n"
            "  activation_checkpointing: false\n"
            "  lm_head_keep_mb: 256\n"
            "  router_replay: off\n"
            "  advantage:\n"
            "    estimator: grpo\n"
            "    norm_by_std: true\n"
            "    std_scale: group\n"
            "    epsilon: 1e-06\n"
            "    gamma: 1.0\n"
            "    lambda: 1.0\n"
            "    prefix_reward_weight_alpha: 1.0\n"
            "    prefix_reward_weight_beta: 1.0\n"
            "  ppo:\n"
            "    clip_low: 0.2\n"
            "    clip_high: 0.2\n"
            "    clip_c: 3.0\n"
            "    clip_delta: 0.0\n"
            "    log_ratio_clamp: 20.0\n"
            "    behav_imp_weight_cap: 0.0\n"
            "    agg_mode: token-mean\n"
            "  gspo:\n"
            "    clip_low: 3e-04\n"
            "    clip_high: 4e-04\n"
            "  gmpo:\n"
            "    clip_low: 0.4\n"
            "    clip_high: 0.4\n"
            "  cispo:\n"
            "    clip_low: 0.2\n"
            "    clip_high: 0.2\n"
            "  sapo:\n"
            "    tau_pos: 1.0\n"
            "    tau_neg: 1.05\n"
            "  clip_cov:\n"
            "    ratio: 2e-04\n"
            "    lb: 1.0\n"
            "    ub: 5.0\n"
            "  kl_cov:\n"
            "    ratio: 2e-04\n"
            "    coef: 1.0\n"
            "  luffy:\n"
            "    off_policy_reshape: p_div_p\n"
            "    gamma: 0.1\n"
            "    reshape_weight: 1.0\n"
            "    reshape_pow_exp: 0.5\n"
            "    off_max_clip: 0.0\n"
            "    off_min_clip: 0.0\n"
            "    clip_upper_bound: 0.0\n"
            "    loss_remove_clip: false\n"
            "    on_policy_reshape: no_reshape\n"
            "    on_reshape_weight: 1.0\n"
            "    on_reshape_pow_exp: 0.5\n"
            "  entropy:\n"
            "    coef: 0.0\n"
            "    target: 0.0\n"
            "    delta: 1e-04\n"
            "    max_coef: 0.01\n"
            "  reward_kl:\n"
            "    coef: 0.0\n"
            "    controller: fixed\n"
            "    target_kl: 0.1\n"
            "    horizon: 10000.0\n"
            "    estimator: k1\n"
            "  rollout_correction:\n"
            "    is_level: none\n"
            "    is_mode: truncate\n"
            "    is_threshold: 2.0\n"
            "    is_threshold_lower: 0.0\n"
            "    is_batch_normalize: false\n"
            "    rs_level: none\n"
            "    rs_criterion: ratio\n"
            "    rs_threshold: 2.0\n"
            "    rs_threshold_lower: 0.0\n"
            "    veto_threshold: 0.0\n"
            "    bypass: false\n"
            "    log_clamp: 20.0\n"
            "  optimizer:\n"
            "    weight_decay: 0.0\n"
            "    beta1: 0.9\n"
            "    beta2: 0.999\n"
            "    eps: 1e-08\n"
            "    max_grad_norm: 1.0\n"
            "    schedule: constant\n"
            "    warmup_steps: 0\n"
            "    total_steps: 0\n"
            "    min_lr_ratio: 0.0\n"
            "    fp32_master_weights: true\n"
            "  lora:\n"
            "    rank: 0\n"
            "    alpha: 8.0\n"
            "    dropout: 0.0\n"
            "    targets: [q_proj, v_proj]\n"
            "  critic:\n"
            "    path: \"\"\n"
            "    lr: 1e-05\n"
            "    clip_range: 0.5\n"
            "    agg_mode: token-mean\n"
            "    warmup_steps: 0\n"
            "    optimizer:\n"
            "      weight_decay: 0.0\n"
            "      beta1: 0.9\n"
            "      beta2: 0.999\n"
            "      eps: 1e-08\n"
            "      max_grad_norm: 1.0\n"
            "      schedule: constant\n"
            "      warmup_steps: 0\n"
            "      total_steps: 0\n"
            "      min_lr_ratio: 0.0\n"
            "      fp32_master_weights: true\n"
            "  distill:\n"
            "    teacher: \"\"\n"
            "    mode: advantage\n"
            "    coef: 0.0\n"
            "    discount: 0.0\n"
            "    estimator: k2\n"
            "services:\n"
            "  listen: 127.0.0.1:0\n"
            "  http_listen: 127.0.0.1:0\n"
            "  token_file: \"\"\n"
            "  tls:\n"
            "    cert: \"\"\n"
            "    key: \"\"\n"
            "    ca: \"\"\n"
            "    mutual: false\n"
            "  lease_timeout_s: 600.0\n"
            "  group_wait_s: 600.0\n"
            "  rpc_timeout_s: 30.0\n"
            "  worker_timeout_s: 30.0\n"
            "  weight_sync: fetch\n"
            "  weight_sync_port: 0\n"
            "  weight_sync_bucket_mb: 64\n"
            "  weight_sync_timeout_s: 30.0\n");
}

TEST(ConfigTest, ToYamlRoundTripsThroughParseConfig) {
  ExperimentConfig defaults;
  ExperimentConfig custom;
  custom.experiment.name = "run_2.b";
  custom.experiment.output_dir = "out dir/with: colon # and hash";
  custom.experiment.steps = 7;
  custom.experiment.warm_start.sft_lr = 0.25;
  custom.services.listen = "0.0.0.0:5555";
  custom.services.weight_sync = comm::WeightSyncMode::kAuto;
  custom.services.tls = {"c.pem", "k.pem", "ca.pem", true};
  custom.rollout.workers = 3;
  custom.run.seed = UINT64_MAX;
  custom.run.threads = 3;
  custom.run.log_level = LogLevel::kOff;
  custom.model.path = "~";  // must stay a string, not become null
  custom.model.dtype = model::Precision::kFloat16;
  custom.model.tokenizer = "true";  // must stay a string, not become a bool
  custom.model.chat_template = model::ChatTemplateChoice::kLlama3;
  // Quotes, a colon, a newline and YAML indicators must come back unchanged.
  custom.model.system_prompt = "You are: \"terse\".\n- # Answer in one line.";
  custom.model.init.arch = ModelArch::kQwen2;
  custom.model.init.hidden = 96;
  custom.model.init.heads = 6;
  custom.model.init.kv_heads = 3;
  custom.model.init.vocab = 151936;
  custom.model.init.rope_theta = 1000000.5;
  custom.model.init.rms_norm_eps = 1.0 / 3.0;
  custom.model.init.tie_embeddings = false;
  custom.rollout.engine.sampling.temperature = 0.1 + 0.2;  // 0.30000000000000004
  custom.rollout.engine.sampling.top_k = 50;
  custom.rollout.engine.sampling.top_p = 0.95;
  custom.rollout.stop = {"#", "- x", "*", "\n"};  // YAML indicators must come back as strings
  custom.rollout.engine.sampling.record_raw_logprobs = true;
  custom.rollout.engine.num_slots = 7;
  custom.rollout.engine.interrupt = rollout::InterruptPolicy::kKeep;
  custom.rollout.n = 4;
  custom.rollout.engine.prefix.n_prefix = -1;
  custom.rollout.engine.prefix.strategy = rollout::PrefixStrategy::kLinearMax;
  custom.rollout.engine.prefix.min_ratio = 0.1;
  custom.rollout.engine.prefix.max_ratio = 0.9;
  custom.rollout.engine.prefix.steps = 50;
  custom.rollout.engine.prefix.share_across_group = true;
  custom.rollout.engine.prefix.max_len = 12;
  custom.task.name = rollout::TaskKind::kJsonl;
  custom.task.path = "data/q.jsonl";
  custom.task.verifier_timeout_s = 0.25;
  custom.task.arithmetic.min_operands = 3;
  custom.task.arithmetic.max_operands = 5;
  custom.task.arithmetic.min_digits = 2;
  custom.task.arithmetic.max_digits = 3;
  custom.task.arithmetic.operators = "*-";
  custom.task.math_answer.format_reward = 0.1;
  custom.task.jsonl.prompt_key = "question";
  custom.task.jsonl.answer_key = "solution";
  custom.task.jsonl.target_key = "demo";
  custom.task.jsonl.match = rollout::AnswerMatch::kRegex;
  custom.trainer.max_staleness = 2;
  custom.trainer.optimizer.lr = 1e-300;
  custom.trainer.loss.kind = trainer::PolicyLossKind::kDecoupledPpo;
  custom.trainer.proximal = trainer::ProximalSource::kLoglinear;
  custom.trainer.micro_batch_tokens = 2048;
  custom.trainer.ppo_epochs = 2;
  custom.trainer.mini_batches = 4;
  custom.trainer.allow_missing_logprobs = true;
  custom.trainer.drop_equal_reward_groups = true;
  custom.trainer.mask_truncated = true;
  custom.trainer.kl_coef = 0.001;
  custom.trainer.kl_estimator = trainer::KlEstimator::kK3Plus;  // "k3+": '+' stays in the name
  custom.trainer.sft_coef = 0.1;
  custom.trainer.loss_scale_factor = 4096;
  custom.trainer.advantage.estimator = trainer::AdvantageEstimator::kGrpoSplit;
  custom.trainer.advantage.norm_by_std = false;
  custom.trainer.advantage.std_scale = trainer::StdScale::kBatch;
  custom.trainer.advantage.epsilon = 1e-8;
  custom.trainer.advantage.gamma = 0.99;
  custom.trainer.advantage.lambda = 0.95;
  custom.trainer.advantage.prefix_reward_weight_alpha = -0.5;
  custom.trainer.advantage.prefix_reward_weight_beta = 2;
  custom.trainer.loss.ppo.clip_low = 0.1;
  custom.trainer.loss.ppo.clip_high = 0.28;
  custom.trainer.loss.ppo.clip_c = 0;
  custom.trainer.loss.ppo.clip_delta = 1.5;
  custom.trainer.loss.ppo.log_ratio_clamp = 0;
  custom.trainer.loss.ppo.behav_imp_weight_cap = 10;
  custom.trainer.loss.ppo.agg_mode = trainer::LossAggMode::kSeqMeanTokenSumNorm;
  custom.trainer.optimizer.weight_decay = 0.01;
  custom.trainer.optimizer.beta1 = 0.8;
  custom.trainer.optimizer.beta2 = 0.95;
  custom.trainer.optimizer.eps = 1e-6;
  custom.trainer.optimizer.max_grad_norm = -1;
  custom.trainer.optimizer.schedule = trainer::LrSchedule::kCosine;
  custom.trainer.optimizer.warmup_steps = 10;
  custom.trainer.optimizer.total_steps = 1000;
  custom.trainer.optimizer.min_lr_ratio = 0.1;
  custom.trainer.optimizer.fp32_master_weights = false;
  custom.trainer.reference = "/models/ref";
  custom.trainer.max_reuse = 3;
  custom.trainer.max_extra_batches = 2;
  custom.trainer.loss.gspo = {1e-3, 2e-3};
  custom.trainer.loss.gmpo = {0.3, 0.5};
  custom.trainer.loss.cispo.clip_low = 0.9;
  custom.trainer.loss.cispo.clip_high = 4.0;
  custom.trainer.loss.sapo.tau_pos = 0.5;
  custom.trainer.loss.sapo.tau_neg = 2.0;
  custom.trainer.loss.clip_cov.clip_cov_ratio = 1e-3;
  custom.trainer.loss.clip_cov.clip_cov_lb = 0.5;
  custom.trainer.loss.clip_cov.clip_cov_ub = 4.0;
  custom.trainer.loss.kl_cov.kl_cov_ratio = 1e-3;
  custom.trainer.loss.kl_cov.ppo_kl_coef = 2.0;
  custom.trainer.loss.luffy.shaping = trainer::OffPolicyShaping::kPDivP03;
  custom.trainer.loss.luffy.gamma = 0.3;
  custom.trainer.loss.luffy.shaping_weight = 0.2;
  custom.trainer.loss.luffy.pow_exponent = 0.7;
  custom.trainer.loss.luffy.off_max_clip = 0.9;
  custom.trainer.loss.luffy.off_min_clip = 0.05;
  custom.trainer.loss.luffy.clip_upper_bound = 2.0;
  custom.trainer.loss.luffy.loss_remove_clip = true;
  custom.trainer.loss.luffy.on_policy_shaping = trainer::OffPolicyShaping::kPLogp;
  custom.trainer.loss.luffy.on_policy_shaping_weight = 0.3;
  custom.trainer.loss.luffy.on_policy_pow_exponent = 0.8;
  custom.trainer.entropy = {1e-3, 0.5, 2e-4, 5e-3};
  custom.trainer.reward_kl.controller.kl_coef = 0.05;
  custom.trainer.reward_kl.controller.type = trainer::KlControllerType::kAdaptive;
  custom.trainer.reward_kl.controller.target_kl = 0.2;
  custom.trainer.reward_kl.controller.horizon = 500;
  custom.trainer.reward_kl.estimator = trainer::KlEstimator::kK3Plus;
  custom.trainer.rollout_correction.is_level = trainer::CorrectionLevel::kGeometric;
  custom.trainer.rollout_correction.is_mode = trainer::IsWeightMode::kClip;
  custom.trainer.rollout_correction.is_threshold = 3;
  custom.trainer.rollout_correction.is_threshold_lower = 0.5;
  custom.trainer.rollout_correction.is_batch_normalize = true;
  custom.trainer.rollout_correction.rs_level = trainer::CorrectionLevel::kSequence;
  custom.trainer.rollout_correction.rs_criterion = trainer::RejectionCriterion::kK3;
  custom.trainer.rollout_correction.rs_threshold = 0.01;
  custom.trainer.rollout_correction.veto_threshold = 1e-4;
  custom.trainer.rollout_correction.bypass = true;
  custom.trainer.rollout_correction.log_clamp = 10;
  for (const ExperimentConfig* config : {&defaults, &custom}) {
    std::string yaml = to_yaml(*config);
    SCOPED_TRACE(yaml);
    StatusOr<ExperimentConfig> parsed = parse_config(yaml, "resolved.yaml");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    expect_same(*parsed, *config);
    EXPECT_EQ(to_yaml(*parsed), yaml);
  }
}

struct ErrorCase {
  const char* name;
  const char* yaml;
  const char* message;
};

TEST(ConfigTest, ParseErrorsNameSourceLineAndPath) {
  const ErrorCase cases[] = {
      // Unknown keys, with the nearest known key of that section.
      {"top-level typo", "rolout:\n  n: 4\n",
       "x.yaml:1: rolout: unknown key; did you mean 'rollout'?"},
      {"nested typo", "model:\n  init:\n    hiden: 64\n",
       "x.yaml:3: model.init.hiden: unknown key; did you mean 'hidden'?"},
      {"rollout typo", "rollout:\n  n: 4\n  temprature: 0.7\n",
       "x.yaml:3: rollout.temprature: unknown key; did you mean 'temperature'?"},
      {"no close key", "rollout:\n  beam_width: 4\n",
       "x.yaml:2: rollout.beam_width: unknown key; known keys: n, max_new_tokens, temperature, "
       "top_k, top_p, stop, record_raw_logprobs, num_slots, kv_cache_gb, kv_cache_fraction, "
       "interrupt, dtype, fp32_lm_head, decode_graphs, workers, groups_in_flight, prefix, episode, "
       "agent"},
      {"unknown section", "optimizer:\n  lr: 1\n",
       "x.yaml:1: optimizer: unknown key; known keys: experiment, eval, run, model, rollout, task, "
       "trainer, "
       "services"},
      {"trainer temperature", "trainer:\n  temperature: 0.7\n",
       "x.yaml:2: trainer.temperature: unknown key; known keys: max_staleness, lr, loss, proximal, "
       "micro_batch_tokens, pack_sequences, ppo_epochs, mini_batches, allow_missing_logprobs, "
       "drop_equal_reward_groups, mask_truncated, overlong_buffer, kl_coef, kl_estimator, "
       "sft_coef, "
       "loss_scale_factor, reference, max_reuse, max_extra_batches, world_size, rendezvous, "
       "allreduce_bucket_mb, "
       "collective_timeout_s, sharding, activation_checkpointing, lm_head_keep_mb, router_replay, "
       "advantage, ppo, "
       "gspo, gmpo, "
       "cispo, sapo, clip_cov, kl_cov, luffy, entropy, reward_kl, rollout_correction, "
       "optimizer, lora, critic, distill"},
      {"trainer nested typo", "trainer:\n  advantage:\n    estimater: rloo\n",
       "x.yaml:3: trainer.advantage.estimater: unknown key; did you mean 'estimator'?"},
      {"trainer section type", "trainer:\n  optimizer: adamw\n",
       "x.yaml:2: trainer.optimizer: expected a map, got 'adamw'"},
      {"duplicate key", "rollout:\n  n: 4\n  n: 5\n", "x.yaml:3: rollout.n: duplicate key"},
      {"non-string key", "rollout:\n  ? [n]\n  : 4\n",
       "x.yaml:2: rollout: keys must be strings, got a sequence"},
      // Wrong types.
      {"int as word", "model:\n  init:\n    layers: two\n",
       "x.yaml:3: model.init.layers: expected an integer, got 'two'"},
      {"int as float", "rollout:\n  n: 4.0\n",
       "x.yaml:2: rollout.n: expected an integer, got '4.0'"},
      {"int overflow", "rollout:\n  n: 3000000000\n",
       "x.yaml:2: rollout.n: expected an integer in [-2147483648, 2147483647], got "
       "'3000000000'"},
      {"negative seed", "run:\n  seed: -1\n",
       "x.yaml:2: run.seed: expected an integer in [0, 18446744073709551615], got '-1'"},
      {"bool as yes", "model:\n  init:\n    tie_embeddings: yes\n",
       "x.yaml:3: model.init.tie_embeddings: expected true or false, got 'yes'"},
      {"double as word", "trainer:\n  lr: fast\n",
       "x.yaml:2: trainer.lr: expected a number, got 'fast'"},
      {"double infinite", "rollout:\n  temperature: inf\n",
       "x.yaml:2: rollout.temperature: expected a number, got 'inf'"},
      {"null scalar", "rollout:\n  n:\n", "x.yaml:2: rollout.n: expected an integer, got null"},
      {"section as scalar", "rollout: 4\n", "x.yaml:1: rollout: expected a map, got '4'"},
      {"section as sequence", "model:\n  init: [2, 64]\n",
       "x.yaml:2: model.init: expected a map, got a sequence"},
      {"scalar as map", "rollout:\n  n:\n    value: 4\n",
       "x.yaml:3: rollout.n: expected an integer, got a map"},
      {"string as sequence", "experiment:\n  name: [a, b]\n",
       "x.yaml:2: experiment.name: expected a string, got a sequence"},
      // Top level.
      {"top-level sequence", "- run\n- model\n",
       "x.yaml:1: expected a map at the top level, got a sequence"},
      {"top-level scalar", "hello\n", "x.yaml:1: expected a map at the top level, got 'hello'"},
      {"two documents", "run: {}\n---\nrollout: {}\n", "x.yaml: expected one YAML document, got 2"},
      // yaml-cpp's LoadAll returned empty documents without end for this
      // (tests/fuzz); counting stops.
      {"stray comma", ",", "x.yaml: expected one YAML document, got more than 16"},
      {"malformed", "rollout:\n  n: [4\n",
       "x.yaml:3:1: malformed YAML: end of sequence flow not found"},
      // Values checked by validate(), prefixed with the source.
      {"bad value", "rollout:\n  n: 0\n", "x.yaml: rollout.n: must be >= 1, got 0"},
      {"cross-field", "model:\n  init:\n    heads: 4\n    kv_heads: 3\n",
       "x.yaml: model.init.kv_heads: must divide model.init.heads (4), got 3"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<ExperimentConfig> config = parse_config(c.yaml, "x.yaml");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(config.status().message()), c.message);
  }
}

TEST(ConfigTest, DecodeErrorsAreAllReported) {
  EXPECT_EQ(parse_error("rollout:\n"
                        "  n: four\n"
                        "  top_kk: 5\n"
                        "trainer:\n"
                        "  lr: [1]\n"),
            "x.yaml:2: rollout.n: expected an integer, got 'four'\n"
            "x.yaml:3: rollout.top_kk: unknown key; did you mean 'top_k'?\n"
            "x.yaml:5: trainer.lr: expected a number, got a sequence");
}

// task.environment_address goes with environment 'remote', and only with it.
TEST(ConfigTest, EnvironmentAddressGoesWithRemote) {
  EXPECT_EQ(parse_error("task:\n  environment: remote\n"),
            "x.yaml: task.environment_address: must name the environment server (host:port) for "
            "environment 'remote', got ''");
  EXPECT_EQ(parse_error("task:\n  environment: calculator\n  environment_address: h:1\n"),
            "x.yaml: task.environment_address: is only read with environment 'remote', and "
            "environment is 'calculator', got 'h:1'");
  EXPECT_EQ(parse_error("task:\n  environment: remote\n  environment_address: 127.0.0.1:9\n"),
            "OK");
}

// rollout.agent: a listen address every worker can bind, a command only with
// an endpoint to play through; agents answer a calculator task's tool calls.
TEST(ConfigTest, AgentsNeedAnAddressEveryWorkerCanListenOn) {
  EXPECT_EQ(parse_error("rollout:\n  agent:\n    listen: 127.0.0.1:0\n"), "OK");
  EXPECT_EQ(parse_error("rollout:\n  agent:\n    listen: localhost\n"),
            "x.yaml: rollout.agent.listen: must be host:port (port 0 = any free one), got "
            "'localhost'");
  EXPECT_EQ(parse_error("rollout:\n  workers: 2\n  agent:\n    listen: 127.0.0.1:8100\n"),
            "x.yaml: rollout.agent.listen: names port 8100, which the 2 workers of "
            "rollout.workers cannot all listen on; use port 0, got '127.0.0.1:8100'");
  EXPECT_EQ(parse_error("rollout:\n  agent:\n    command: [python3, agent.py]\n"),
            "x.yaml: rollout.agent.command: needs rollout.agent.listen: the endpoint the agent "
            "plays through, got 'python3'");
  EXPECT_EQ(parse_error("rollout:\n  agent:\n    listen: 127.0.0.1:0\n"
                        "trainer:\n  advantage:\n    estimator: remax\n"),
            "x.yaml: rollout.agent.listen: agents play sampled episodes only, and "
            "trainer.advantage.estimator remax needs a greedy baseline per group; use another "
            "estimator (grpo, rloo, ...)");
  EXPECT_EQ(parse_error("rollout:\n  agent:\n    episode_timeout_s: 0\n"),
            "x.yaml: rollout.agent.episode_timeout_s: must be > 0, got 0");
  const std::string calculator =
      "model:\n  chat_template: chatml\ntask:\n  arithmetic:\n    format: calculator\n";
  EXPECT_NE(parse_error(calculator)
                .find("task.arithmetic.format: calculator's targets are tool "
                      "calls"),
            std::string::npos);
  EXPECT_EQ(parse_error(calculator + "rollout:\n  agent:\n    listen: 127.0.0.1:0\n"), "OK");
}

// trainer.overlong_buffer (DAPO's length penalty) counts one response
// against rollout.max_new_tokens: shorter than it, and not for episodes.
TEST(ConfigTest, OverlongBufferFitsInTheResponseBudget) {
  EXPECT_EQ(parse_error("rollout:\n  max_new_tokens: 32\n"
                        "trainer:\n  overlong_buffer:\n    length: 8\n"),
            "OK");
  EXPECT_EQ(
      parse_error("rollout:\n  max_new_tokens: 32\n"
                  "trainer:\n  overlong_buffer:\n    length: 32\n"),
      "x.yaml: trainer.overlong_buffer.length: must be < rollout.max_new_tokens (32), got 32");
  EXPECT_EQ(parse_error("rollout:\n  max_new_tokens: 32\n"
                        "trainer:\n  overlong_buffer:\n    length: 8\n    penalty_factor: 0\n"),
            "x.yaml: trainer.overlong_buffer.penalty_factor: must be > 0, got 0");
  EXPECT_EQ(parse_error("rollout:\n  max_new_tokens: 32\n  agent:\n    listen: 127.0.0.1:0\n"
                        "trainer:\n  overlong_buffer:\n    length: 8\n"),
            "x.yaml: trainer.overlong_buffer.length: DAPO's length penalty counts one response "
            "against rollout.max_new_tokens; episodes (task.environment, rollout.agent.listen) "
            "have a budget per turn, got 8");
}

// trainer.distill: the teacher and its weight go together; the mode and
// estimator are named.
TEST(ConfigTest, DistillNeedsATeacherAndACoefficient) {
  EXPECT_EQ(parse_error("trainer:\n  distill:\n    teacher: runs/t/checkpoints/best\n"
                        "    coef: 1\n    mode: loss\n    estimator: low_var_kl\n"),
            "OK");
  EXPECT_EQ(parse_error("trainer:\n  distill:\n    coef: 1\n"),
            "x.yaml: trainer.distill.teacher: trainer.distill.coef > 0 needs the teacher's model "
            "directory, which the rollout workers score every response with");
  EXPECT_EQ(parse_error("trainer:\n  distill:\n    teacher: t\n"),
            "x.yaml: trainer.distill.coef: must be > 0 with trainer.distill.teacher set "
            "(Thinking Machines' recipe uses 1), got 0");
  EXPECT_EQ(parse_error("trainer:\n  distill:\n    teacher: t\n    coef: 1\n    discount: 2\n"),
            "x.yaml: trainer.distill.discount: must be in [0, 1], got 2");
  EXPECT_NE(parse_error("trainer:\n  distill:\n    mode: reward\n").find("trainer.distill.mode"),
            std::string::npos);
}

TEST(ConfigTest, ValidationProblemsAreAllReported) {
  EXPECT_EQ(parse_error("experiment:\n"
                        "  name: ''\n"
                        "run:\n"
                        "  threads: -1\n"
                        "model:\n"
                        "  init:\n"
                        "    heads: 4\n"
                        "    kv_heads: 3\n"
                        "rollout:\n"
                        "  n: 0\n"
                        "  top_p: 0\n"),
            "x.yaml: experiment.name: must be non-empty, got ''\n"
            "x.yaml: run.threads: must be >= 0, got -1\n"
            "x.yaml: model.init.kv_heads: must divide model.init.heads (4), got 3\n"
            "x.yaml: rollout.n: must be >= 1, got 0\n"
            "x.yaml: rollout.top_p: must be in (0, 1], got 0");
}

struct RuleCase {
  const char* name;
  std::function<void(ExperimentConfig&)> change;
  const char* message;
};

TEST(ConfigTest, ValidateChecksEachRule) {
  const RuleCase cases[] = {
      {"name chars", [](ExperimentConfig& c) { c.experiment.name = "my run"; },
       "experiment.name: must contain only [A-Za-z0-9._-], got 'my run'"},
      {"name dotdot", [](ExperimentConfig& c) { c.experiment.name = ".."; },
       "experiment.name: must not be '.' or '..', got '..'"},
      {"groups per step", [](ExperimentConfig& c) { c.experiment.groups_per_step = 0; },
       "experiment.groups_per_step: must be >= 1, got 0"},
      {"sft lr", [](ExperimentConfig& c) { c.experiment.warm_start.sft_lr = 0; },
       "experiment.warm_start.sft_lr: must be > 0, got 0"},
      {"listen", [](ExperimentConfig& c) { c.services.listen = "localhost"; },
       "services.listen: must be host:port, got 'localhost'"},
      {"tls key alone", [](ExperimentConfig& c) { c.services.tls.key = "k.pem"; },
       "services.tls.cert: services.tls.cert and services.tls.key go together, got ''"},
      {"mutual without ca", [](ExperimentConfig& c) { c.services.tls.mutual = true; },
       "services.tls.mutual: needs services.tls.ca, cert and key, got 'true'"},
      {"workers", [](ExperimentConfig& c) { c.rollout.workers = 0; },
       "rollout.workers: must be >= 1, got 0"},
      {"threads", [](ExperimentConfig& c) { c.run.threads = -1; },
       "run.threads: must be >= 0, got -1"},
      {"device", [](ExperimentConfig& c) { c.run.device = "gpu0"; },
       "run.device: must be cpu, cuda or cuda:<index>, got 'gpu0'"},
      {"device index", [](ExperimentConfig& c) { c.run.device = "cuda:"; },
       "run.device: must be cpu, cuda or cuda:<index>, got 'cuda:'"},
      {"system prompt without template",
       [](ExperimentConfig& c) { c.model.system_prompt = "Be brief."; },
       "model.system_prompt: needs model.chat_template (chatml, llama3 or auto); without a chat "
       "format there is no system message, got 'Be brief.'"},
      {"layers", [](ExperimentConfig& c) { c.model.init.layers = 0; },
       "model.init.layers: must be >= 1, got 0"},
      {"ffn", [](ExperimentConfig& c) { c.model.init.ffn = -4; },
       "model.init.ffn: must be >= 1, got -4"},
      {"vocab", [](ExperimentConfig& c) { c.model.init.vocab = -1; },
       "model.init.vocab: must be >= 0, got -1"},
      {"max_seq_len", [](ExperimentConfig& c) { c.model.init.max_seq_len = 0; },
       "model.init.max_seq_len: must be >= 1, got 0"},
      {"hidden divisible", [](ExperimentConfig& c) { c.model.init.hidden = 66; },
       "model.init.hidden: must be divisible by model.init.heads (4), got 66"},
      {"odd head dim", [](ExperimentConfig& c) { c.model.init.hidden = 36; },
       "model.init.hidden: must give an even head dim (hidden / model.init.heads) for RoPE, got "
       "36 / 4 = 9"},
      {"zero heads", [](ExperimentConfig& c) { c.model.init.heads = 0; },
       "model.init.heads: must be >= 1, got 0"},
      {"rope_theta", [](ExperimentConfig& c) { c.model.init.rope_theta = 0; },
       "model.init.rope_theta: must be > 0, got 0"},
      {"rms_norm_eps", [](ExperimentConfig& c) { c.model.init.rms_norm_eps = -1e-6; },
       "model.init.rms_norm_eps: must be > 0, got -1e-06"},
      {"max_new_tokens", [](ExperimentConfig& c) { c.rollout.engine.max_new_tokens = 0; },
       "rollout.max_new_tokens: must be >= 1, got 0"},
      {"temperature", [](ExperimentConfig& c) { c.rollout.engine.sampling.temperature = 0; },
       "rollout.temperature: must be > 0, got 0"},
      {"top_k", [](ExperimentConfig& c) { c.rollout.engine.sampling.top_k = -1; },
       "rollout.top_k: must be >= 0, got -1"},
      {"top_p above 1", [](ExperimentConfig& c) { c.rollout.engine.sampling.top_p = 1.5; },
       "rollout.top_p: must be in (0, 1], got 1.5"},
      {"num_slots", [](ExperimentConfig& c) { c.rollout.engine.num_slots = 0; },
       "rollout.num_slots: must be >= 1, got 0"},
      {"kv_cache_gb", [](ExperimentConfig& c) { c.rollout.engine.kv_cache_gb = -1; },
       "rollout.kv_cache_gb: must be >= 0 (0 = kv_cache_fraction of free memory), got -1"},
      {"kv_cache_fraction", [](ExperimentConfig& c) { c.rollout.engine.kv_cache_fraction = 1.5; },
       "rollout.kv_cache_fraction: must be in (0, 1], got 1.5"},
      {"init experts_per_tok",
       [](ExperimentConfig& c) {
         c.model.init.arch = ModelArch::kQwen3Moe;
         c.model.init.experts_per_tok = 5;
       },
       "model.init.experts_per_tok: must be <= model.init.experts (4), got 5"},
      {"empty stop",
       [](ExperimentConfig& c) {
         c.rollout.stop = {"#", ""};
       },
       "rollout.stop[1]: must be non-empty, got ''"},
      {"n_prefix below -1", [](ExperimentConfig& c) { c.rollout.engine.prefix.n_prefix = -2; },
       "rollout.prefix.n_prefix: must be >= -1, got -2"},
      {"n_prefix above n", [](ExperimentConfig& c) { c.rollout.engine.prefix.n_prefix = 9; },
       "rollout.prefix.n_prefix: must be <= rollout.n (8), got 9"},
      {"ratio range", [](ExperimentConfig& c) { c.rollout.engine.prefix.min_ratio = 1.5; },
       "rollout.prefix.min_ratio: must be in [0, 1], got 1.5"},
      {"ratio order", [](ExperimentConfig& c) { c.rollout.engine.prefix.min_ratio = 0.9; },
       "rollout.prefix.max_ratio: must be >= rollout.prefix.min_ratio (0.9), got 0.8"},
      {"fixed shared",
       [](ExperimentConfig& c) {
         c.rollout.engine.prefix.strategy = rollout::PrefixStrategy::kFixed;
         c.rollout.engine.prefix.share_across_group = true;
       },
       "rollout.prefix.share_across_group: must be false with strategy 'fixed', got true"},
      {"task path", [](ExperimentConfig& c) { c.task.name = rollout::TaskKind::kMathAnswer; },
       "task.path: must name a JSONL file for task 'math_answer', got ''"},
      {"verifier timeout", [](ExperimentConfig& c) { c.task.verifier_timeout_s = 0; },
       "task.verifier_timeout_s: must be > 0, got 0"},
      {"operand order", [](ExperimentConfig& c) { c.task.arithmetic.max_operands = 1; },
       "task.arithmetic.max_operands: must be >= task.arithmetic.min_operands (2), got 1"},
      {"digits", [](ExperimentConfig& c) { c.task.arithmetic.max_digits = 19; },
       "task.arithmetic.max_digits: must be <= 18, got 19"},
      {"overflow",
       [](ExperimentConfig& c) {
         c.task.arithmetic.max_digits = 10;
         c.task.arithmetic.operators = "*";
       },
       "task.arithmetic.max_operands: with operators '*' and up to 10 digits per operand, "
       "results can overflow 64-bit integers, got 3"},
      {"operators", [](ExperimentConfig& c) { c.task.arithmetic.operators = "+/"; },
       "task.arithmetic.operators: must be a non-empty string of + - *, got '+/'"},
      {"format reward", [](ExperimentConfig& c) { c.task.math_answer.format_reward = 2; },
       "task.math_answer.format_reward: must be in [0, 1], got 2"},
  };
  EXPECT_TRUE(validate(ExperimentConfig{}).ok());
  for (const RuleCase& c : cases) {
    SCOPED_TRACE(c.name);
    ExperimentConfig config;
    c.change(config);
    Status status = validate(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(status.message()), c.message);
  }
}

TEST(ConfigTest, MissingFileIsNotFound) {
  std::string path = ::testing::TempDir() + "/relay_config_test_no_such_file.yaml";
  StatusOr<ExperimentConfig> config = load_config(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(config.status().message(), "config file not found: " + path);
}

TEST(ConfigTest, FileErrorsNameThePath) {
  std::string path = write_temp("bad.yaml", "rollout:\n  n: 0\n");
  StatusOr<ExperimentConfig> config = load_config(path);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), path + ": rollout.n: must be >= 1, got 0");

  std::string dir = std::filesystem::path(path).parent_path().string();
  config = load_config(dir);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(), dir + ": is a directory, expected a YAML file");
}

struct OverrideCase {
  const char* name;
  std::vector<std::string> overrides;
  std::function<void(ExperimentConfig&)> expected_change;  // applied to the base config
};

TEST(ConfigTest, OverridesApplyInOrder) {
  const char* base = "model:\n  dtype: bfloat16\nrollout:\n  top_k: 7\n";
  const OverrideCase cases[] = {
      {"int", {"rollout.n=4"}, [](ExperimentConfig& c) { c.rollout.n = 4; }},
      {"bool",
       {"model.init.tie_embeddings=false"},
       [](ExperimentConfig& c) { c.model.init.tie_embeddings = false; }},
      {"string", {"experiment.name=abc"}, [](ExperimentConfig& c) { c.experiment.name = "abc"; }},
      {"empty string", {"model.path="}, [](ExperimentConfig& c) { c.model.path = ""; }},
      {"double", {"trainer.lr=2e-6"}, [](ExperimentConfig& c) { c.trainer.optimizer.lr = 2e-6; }},
      {"nested, creating maps",
       {"model.init.layers=3", "trainer.max_staleness=1"},
       [](ExperimentConfig& c) {
         c.model.init.layers = 3;
         c.trainer.max_staleness = 1;
       }},
      {"keeps sibling keys",
       {"model.tokenizer=bpe.json", "rollout.n=5"},
       [](ExperimentConfig& c) {
         c.model.tokenizer = "bpe.json";
         c.rollout.n = 5;
       }},
      {"later wins", {"rollout.n=2", "rollout.n=6"}, [](ExperimentConfig& c) { c.rollout.n = 6; }},
      {"whole section",
       {"rollout={n: 3, top_p: 0.5}"},
       [](ExperimentConfig& c) {
         c.rollout.engine.sampling.top_k = 0;  // the file's rollout map is replaced, not merged
         c.rollout.n = 3;
         c.rollout.engine.sampling.top_p = 0.5;
       }},
      {"fixes a bad file value",
       {"rollout.n=0", "rollout.n=1"},
       [](ExperimentConfig& c) { c.rollout.n = 1; }},
  };
  for (const OverrideCase& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<ExperimentConfig> config = parse_config(base, "x.yaml", c.overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    ExperimentConfig expected;
    expected.model.dtype = model::Precision::kBFloat16;  // from the file
    expected.rollout.engine.sampling.top_k = 7;
    c.expected_change(expected);
    expect_same(*config, expected);
  }
}

// Every choice is an enum: the reader rejects a name its table lacks, with
// the YAML path and every accepted name, before any rule runs.
TEST(ConfigTest, ChoicesAcceptOnlyTheirNames) {
  const std::pair<const char*, const char*> cases[] = {
      {"services.weight_sync=nccl",
       "services.weight_sync: must be one of fetch, broadcast, auto, got 'nccl'"},
      {"run.log_level=verbose",
       "run.log_level: must be one of trace, debug, info, warn, error, off, got 'verbose'"},
      {"run.autocast=bf16", "run.autocast: must be one of none, bfloat16, float16, got 'bf16'"},
      {"model.dtype=fp8", "model.dtype: must be one of float32, bfloat16, float16, got 'fp8'"},
      {"model.chat_template=qwen",
       "model.chat_template: must be one of none, chatml, llama3, auto, got 'qwen'"},
      {"model.init.arch=gpt2",
       "model.init.arch: must be one of llama, qwen2, qwen3, qwen3_moe, got 'gpt2'"},
      {"rollout.interrupt=drop",
       "rollout.interrupt: must be one of recompute, keep, finish, restart, got 'drop'"},
      {"rollout.dtype=bf16",
       "rollout.dtype: must be one of model, float32, bfloat16, float16, got 'bf16'"},
      {"rollout.prefix.strategy=cosine",
       "rollout.prefix.strategy: must be one of random, linear, linear_max, reverse_linear, "
       "fixed, got 'cosine'"},
      {"task.name=chess", "task.name: must be one of arithmetic, math_answer, jsonl, got 'chess'"},
      {"task.jsonl.match=fuzzy", "task.jsonl.match: must be one of exact, regex, got 'fuzzy'"},
      // Names are exact: no case folding.
      {"rollout.interrupt=Keep",
       "rollout.interrupt: must be one of recompute, keep, finish, restart, got 'Keep'"},
  };
  for (const auto& [override_text, message] : cases) {
    SCOPED_TRACE(override_text);
    EXPECT_EQ(parse_error("", {override_text}),
              absl::StrCat("override '", override_text, "': ", message));
  }
  // Each name reads back as its value.
  StatusOr<ExperimentConfig> config = parse_config(
      "", "x.yaml",
      {"services.weight_sync=broadcast", "run.autocast=float16", "model.chat_template=auto",
       "model.init.arch=qwen3_moe", "rollout.interrupt=restart",
       "rollout.prefix.strategy=reverse_linear", "task.jsonl.match=regex", "run.log_level=error"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->services.weight_sync, comm::WeightSyncMode::kBroadcast);
  EXPECT_EQ(config->run.autocast, model::Autocast::kFloat16);
  EXPECT_EQ(config->model.chat_template, model::ChatTemplateChoice::kAuto);
  EXPECT_EQ(config->model.init.arch, ModelArch::kQwen3Moe);
  EXPECT_EQ(config->rollout.engine.interrupt, rollout::InterruptPolicy::kRestart);
  EXPECT_EQ(config->rollout.engine.prefix.strategy, rollout::PrefixStrategy::kReverseLinear);
  EXPECT_EQ(config->task.jsonl.match, rollout::AnswerMatch::kRegex);
  EXPECT_EQ(config->run.log_level, LogLevel::kError);
}

TEST(ConfigTest, OverrideErrorsNameTheOverride) {
  const ErrorCase cases[] = {
      {"unknown key", "rollout.temprature=2",
       "override 'rollout.temprature=2': rollout.temprature: unknown key; did you mean "
       "'temperature'?"},
      {"unknown section", "rollot.n=2",
       "override 'rollot.n=2': rollot: unknown key; did you mean 'rollout'?"},
      {"wrong type", "rollout.n=four",
       "override 'rollout.n=four': rollout.n: expected an integer, got 'four'"},
      {"bool spelled yes", "model.init.tie_embeddings=yes",
       "override 'model.init.tie_embeddings=yes': model.init.tie_embeddings: expected true or "
       "false, got 'yes'"},
      {"below a scalar", "rollout.n.x=1",
       "override 'rollout.n.x=1': rollout.n: expected an integer, got a map"},
      {"bad value", "rollout.n=0", "override 'rollout.n=0': rollout.n: must be >= 1, got 0"},
      {"no equals sign", "rollout.n", "override 'rollout.n': expected key.path=value"},
      {"empty key", "=4", "override '=4': empty key"},
      {"empty component", "rollout..n=4",
       "override 'rollout..n=4': empty component in key 'rollout..n'"},
      {"malformed value", "rollout.n=[4",
       "override 'rollout.n=[4': malformed value: end of sequence flow not found"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<ExperimentConfig> config = parse_config("", "x.yaml", {c.yaml});
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(config.status().message()), c.message);
  }
}

TEST(ConfigTest, ErrorsNameFileOrOverride) {
  // The file is decoded before any override is applied.
  EXPECT_EQ(parse_error("rollout:\n  n: x\n", {"rollout.n=4"}),
            "x.yaml:2: rollout.n: expected an integer, got 'x'");
  // A validation problem names whichever of file or override set the value.
  EXPECT_EQ(parse_error("rollout:\n  top_k: -1\n", {"trainer.lr=0"}),
            "x.yaml: rollout.top_k: must be >= 0, got -1\n"
            "override 'trainer.lr=0': trainer.lr: must be > 0, got 0");
}

TEST(ConfigTest, LoadConfigAppliesOverridesToFile) {
  std::string path = write_temp("overrides.yaml", "rollout:\n  n: 8\n  max_new_tokens: 10\n");
  StatusOr<ExperimentConfig> config = load_config(path, {"rollout.n=2", "experiment.name=x"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rollout.n, 2);
  EXPECT_EQ(config->rollout.engine.max_new_tokens, 10);
  EXPECT_EQ(config->experiment.name, "x");
}

TEST(ConfigTest, TinyConfigLoadsAndValidates) {
  StatusOr<ExperimentConfig> config = load_config(RELAY_SOURCE_DIR "/configs/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(validate(*config).ok());
  EXPECT_EQ(config->experiment.name, "tiny");
  EXPECT_EQ(config->model.path, "");
  const ModelInitConfig& init = config->model.init;
  EXPECT_EQ(init.layers, 2);
  EXPECT_EQ(init.hidden, 64);
  EXPECT_EQ(init.heads, 4);
  EXPECT_EQ(init.kv_heads, 2);
  EXPECT_EQ(init.ffn, 128);
  EXPECT_EQ(init.max_seq_len, 128);
  EXPECT_TRUE(init.tie_embeddings);
  EXPECT_EQ(config->rollout.n, 4);
  EXPECT_EQ(config->rollout.engine.max_new_tokens, 16);
}

}  // namespace
}  // namespace relay
