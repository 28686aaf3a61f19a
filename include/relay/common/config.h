#pragma once

// Experiment configuration: what a YAML file (configs/*.yaml) turns into.
//
// YAML is parsed only in src/common/config.cc; components receive these plain
// structs. Every field has a default, so a config file names only what it
// changes. Loading rejects unknown keys (suggesting the nearest known one),
// wrong types and out-of-range values; every message names the file and the
// YAML path, e.g. "configs/grpo.yaml: rollout.n: must be >= 1, got 0".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "relay/common/status.h"

namespace relay {

// Per-process settings.
struct RunConfig {
  uint64_t seed = 0;               // seeds model init, sampling and data order
  int threads = 0;                 // intra-op threads for this process; 0 = all cores
  std::string log_level = "info";  // trace | debug | info | warn | error | off
  // Where the model lives: cpu | cuda (= cuda:$LOCAL_RANK) | cuda:<i>. cuda
  // needs a CUDA build (docs/cluster.md).
  std::string device = "cpu";
  // Forward passes under autocast: none | bfloat16 | float16 (matrix
  // products in that precision, softmax and losses in fp32).
  std::string autocast = "none";
};

// Architecture of a fresh model built from a seed (model.init). Ignored when
// model.path names a checkpoint directory.
struct ModelInitConfig {
  // llama | qwen2 (q/k/v projections with bias) | qwen3 (per-head q/k RMSNorm) |
  // qwen3_moe (qwen3 with a mixture of experts in every layer)
  std::string arch = "llama";
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int kv_heads = 2;         // grouped-query attention when < heads; must divide heads
  int head_dim = 0;         // per-head width; 0 = hidden / heads
  int ffn = 128;            // SwiGLU intermediate size
  int experts = 4;          // qwen3_moe: experts per layer
  int experts_per_tok = 2;  // qwen3_moe: experts each token is routed to
  int moe_ffn = 0;          // qwen3_moe: each expert's SwiGLU width; 0 = ffn
  int vocab = 0;            // 0 = the tokenizer's vocabulary size
  int max_seq_len = 256;    // max_position_embeddings
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = true;  // LM head shares the token embedding matrix
};

struct ModelConfig {
  std::string path;               // HF-layout directory (config.json + *.safetensors); empty = init
  std::string dtype = "float32";  // float32 | bfloat16 | float16: parameters in memory
  std::string tokenizer = "char";  // char (built-in tasks) | a tokenizer.json path (later)
  // Chat format prompts are rendered in (docs/model.md, "Chat templates"):
  // none (prompt text as written) | chatml (Qwen) | llama3 (Llama 3 Instruct) |
  // auto (chatml or llama3, from the tokenizer's special tokens; an error when
  // it has neither or both). chatml and llama3 need the tokenizer to have the
  // format's special tokens; the char tokenizer has none.
  std::string chat_template = "none";
  // With a chat template: a system message put before every prompt that has
  // none of its own. "" = no system message (relay adds no default one).
  std::string system_prompt;
  ModelInitConfig init;
};

// Prefix-guided (off-policy) sampling, as in LUFFY: some of a group's samples
// start from a forced prefix of the prompt's target solution. The prefix
// length is floor(ratio x target length), capped at max_len.
struct PrefixConfig {
  int n_prefix = 0;                 // samples per group given a prefix; -1 = all K; 0 = off
  std::string strategy = "random";  // random | linear | linear_max | reverse_linear | fixed
  double min_ratio = 0.0;           // ratios lie in [min_ratio, max_ratio] within [0, 1]
  double max_ratio = 0.8;
  int steps = 300;                  // training steps over which linear schedules move
  bool share_across_group = false;  // one ratio for all prefixed samples of a group
  int max_len = 8192;               // at most this many forced tokens
};

// Sampling and the generation engine for rollouts.
struct RolloutConfig {
  int n = 8;  // responses sampled per prompt (the group size K)
  int max_new_tokens = 32;
  double temperature = 1.0;       // > 0; sampling is greedy only through `relay generate --greedy`
  int top_k = 0;                  // 0 = off
  double top_p = 1.0;             // 1 = off; in (0, 1]
  std::vector<std::string> stop;  // extra stop strings, each one token; the task adds its own
  bool record_raw_logprobs = false;  // also keep log p(token) at temperature 1, untruncated
  int num_slots = 64;                // sequences decoding at once, at most
  // KV-cache memory of one worker, in GiB; 0 = kv_cache_fraction of the
  // memory free when the worker starts, and never more than num_slots full
  // sequences. Sequences are admitted while the budget can hold
  // prompt + max_new_tokens for each; the others wait.
  double kv_cache_gb = 0;
  double kv_cache_fraction =
      0.5;  // (0, 1]: share of free memory for the KV cache when kv_cache_gb is 0
  // What a weight update does to sequences in flight: recompute | keep | finish | restart.
  std::string interrupt = "recompute";
  int workers = 1;            // relay-rollout processes `relay run` starts on this machine
  int groups_in_flight = 16;  // prompt leases one worker holds at once
  PrefixConfig prefix;
};

struct ArithmeticTaskConfig {
  int min_operands = 2;
  int max_operands = 3;
  int min_digits = 1;  // digits per operand
  int max_digits = 1;
  std::string operators = "+";  // any of + - *
};

struct MathAnswerTaskConfig {
  double format_reward = 0.0;  // weight in [0, 1] of the "answer is in \boxed{}" sub-score
};

struct JsonlTaskConfig {
  std::string prompt_key = "prompt";
  std::string answer_key = "answer";
  std::string target_key = "target";  // optional field: a target solution for prefix guidance
  std::string match = "exact";  // exact | regex (the answer is a regex the response must match)
};

// Where prompts come from and how responses are scored.
struct TaskConfig {
  std::string name = "arithmetic";  // arithmetic | math_answer | jsonl
  std::string path;                 // JSONL file for math_answer and jsonl
  double verifier_timeout_s = 5.0;  // a verifier running longer scores 0 and counts an error
  ArithmeticTaskConfig arithmetic;
  MathAnswerTaskConfig math_answer;
  JsonlTaskConfig jsonl;
};

// How rewards become advantages (relay::trainer::AdvantageOptions).
struct AdvantageConfig {
  // grpo | dr_grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | opo |
  // grpo_passk | grpo_split | remax | gae
  std::string estimator = "grpo";
  bool norm_by_std = true;                  // GRPO family: divide by a std (dr_grpo forces false)
  std::string std_scale = "group";          // none | group | batch: which std when norm_by_std
  double epsilon = 1e-6;                    // > 0; added to the std before dividing
  double gamma = 1.0;                       // discount in [0, 1] (REINFORCE++, GAE)
  double lambda = 1.0;                      // GAE lambda in [0, 1]
  double prefix_reward_weight_alpha = 1.0;  // grpo_split: weight of forced-prefix tokens
  double prefix_reward_weight_beta = 1.0;   // grpo_split: weight of on-policy tokens
};

// The clipped surrogate (relay::trainer::PpoClipOptions).
struct PpoConfig {
  double clip_low = 0.2;            // ratio lower bound 1 - clip_low; in [0, 1)
  double clip_high = 0.2;           // ratio upper bound 1 + clip_high (DAPO: 0.28); >= 0
  double clip_c = 3.0;              // dual clip for A < 0; 0 = off, else > 1
  double clip_delta = 0;            // two-sided delta clip; 0 = off, else > 1 + clip_high
  double log_ratio_clamp = 20.0;    // |logp - anchor| clamp before exp(); 0 = none
  double behav_imp_weight_cap = 0;  // decoupled_ppo: drop tokens above it; 0 = off, else > 1
  // token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
  std::string agg_mode = "token-mean";
};

// AdamW and the learning-rate schedule (relay::trainer::OptimizerOptions).
struct OptimizerConfig {
  double weight_decay = 0.0;          // decoupled weight decay, >= 0
  double beta1 = 0.9;                 // in [0, 1)
  double beta2 = 0.999;               // in [0, 1)
  double eps = 1e-8;                  // > 0
  double max_grad_norm = 1.0;         // global L2 clip; <= 0 = off
  std::string schedule = "constant";  // constant | linear_warmup | cosine
  int warmup_steps = 0;               // linear warmup from 0 (linear_warmup, cosine)
  int total_steps = 0;                // cosine: optimizer steps to decay over; >= 1 there
  double min_lr_ratio = 0.0;          // cosine floor as a fraction of lr, in [0, 1]
  bool fp32_master_weights = true;    // bf16/fp16 parameters are stepped through fp32 copies
};

// Options of the other policy losses (relay::trainer::PolicyLossOptions); only
// the section of the selected trainer.loss is read.
struct GspoConfig {
  double clip_low = 3e-4;  // sequence ratio in [1 - clip_low, 1 + clip_high]; in [0, 1)
  double clip_high = 4e-4;
};
struct GmpoConfig {
  double clip_low = 0.4;  // token log-ratio clipped to [-clip_low, clip_high]; >= 0
  double clip_high = 0.4;
};
struct CispoConfig {
  double clip_low = 0.2;  // stop-gradient IS weight clipped to [1 - clip_low, 1 + clip_high]
  double clip_high = 0.2;
};
struct SapoConfig {
  double tau_pos = 1.0;   // sigmoid gate temperature for A > 0; > 0
  double tau_neg = 1.05;  // for A <= 0; > 0
};
struct ClipCovConfig {
  double ratio = 2e-4;  // fraction of tokens detached, in (0, 1]
  double lb = 1.0;      // covariance band of the candidates; lb < ub
  double ub = 5.0;
};
struct KlCovConfig {
  double ratio = 2e-4;  // fraction of tokens given the KL penalty, in (0, 1]
  double coef = 1.0;    // coefficient of |logp - old| on them; >= 0
};
// LUFFY: on-policy tokens use trainer.ppo's clip; forced prefix tokens are
// shaped f(pi_theta).
struct LuffyConfig {
  // p_div_p (p / (p + gamma)) | no_reshape | logp | p_logp | square_root | pow;
  // LUFFY's p_div_p_0.1 / _0.3 / _0.5 set gamma too.
  std::string off_policy_reshape = "p_div_p";
  double gamma = 0.1;             // p_div_p; > 0
  double reshape_weight = 1.0;    // logp, p_logp: weight of logp
  double reshape_pow_exp = 0.5;   // pow: exponent
  double off_max_clip = 0.0;      // f(p) <= this; 0 = off
  double off_min_clip = 0.0;      // f(p) >= this; 0 = off
  double clip_upper_bound = 0.0;  // on-policy upper ratio bound max(this, 1 + clip_high)
  bool loss_remove_clip = false;  // on-policy tokens use -A r, unclipped
  // Shaping of the on-policy ratio before its clip, same names (no_reshape = off).
  std::string on_policy_reshape = "no_reshape";
  double on_reshape_weight = 1.0;   // logp, p_logp
  double on_reshape_pow_exp = 0.5;  // pow
};

// Entropy bonus -coef x H; adaptive when target > 0 (the coefficient moves by
// delta per step toward holding the entropy at target, in [0, max_coef]).
struct EntropyConfig {
  double coef = 0.0;       // >= 0
  double target = 0.0;     // nats per token; 0 = fixed coefficient
  double delta = 1e-4;     // > 0 when adaptive
  double max_coef = 1e-2;  // >= coef when adaptive
};

// KL to the reference folded into the reward (r_t -= coef x kl_t).
struct RewardKlConfig {
  double coef = 0.0;                 // initial beta; 0 = off
  std::string controller = "fixed";  // fixed | adaptive
  double target_kl = 0.1;            // adaptive: KL to steer toward; > 0
  double horizon = 10000.0;          // adaptive: samples over which an error is corrected; > 0
  std::string estimator = "k1";      // any trainer.kl_estimator name
};

// Importance weights and rejection for the gap between the sampler (pi_behav)
// and the trainer's pre-update policy (pi_old), as verl's rollout_correction.
// Off by default: the PPO ratio is then taken against pi_behav directly.
struct RolloutCorrectionConfig {
  std::string is_level = "none";       // none | token | sequence | geometric
  std::string is_mode = "truncate";    // truncate (min(w, C)) | clip ([lower, C])
  double is_threshold = 2.0;           // C; > 1
  double is_threshold_lower = 0.0;     // clip's lower bound; 0 = 1 / C, else in (0, 1)
  bool is_batch_normalize = false;     // weights divided by their batch mean
  std::string rs_level = "none";       // rejection: none | token | sequence | geometric
  std::string rs_criterion = "ratio";  // ratio | k1 | k2 | k3
  double rs_threshold = 2.0;           // ratio: upper bound (> 1); k*: divergence bound (> 0)
  double rs_threshold_lower = 0.0;     // ratio only; 0 = 1 / rs_threshold
  double veto_threshold = 0.0;         // reject a sequence with any ratio below it; 0 = off
  bool bypass = false;                 // pi_old = pi_behav: no correction, no pre-update pass
  double log_clamp = 20.0;             // every exp() argument clamped to +-this; > 0
};

// The learner. The scoring temperature is rollout.temperature: behavior
// log-probs were taken at it, so there is deliberately no trainer temperature.
struct TrainerConfig {
  int max_staleness = 0;  // train on tokens of version >= v - max_staleness; 0 = synchronous
  double lr = 1e-5;       // learning rate, > 0
  // ppo | decoupled_ppo | gspo | gmpo | cispo | sapo | clip_cov | kl_cov | gpg |
  // reinforce | luffy
  std::string loss = "ppo";
  std::string proximal = "recorded";      // decoupled_ppo anchor: recorded | recompute | loglinear
  int micro_batch_tokens = 8192;          // padded tokens per forward/backward pass, >= 1
  int ppo_epochs = 1;                     // passes over each batch, >= 1
  int mini_batches = 1;                   // optimizer steps per epoch, >= 1
  bool allow_missing_logprobs = false;    // train tokens without behavior log-probs on-policy
  bool drop_equal_reward_groups = false;  // DAPO dynamic sampling
  bool mask_truncated = false;            // overlong filtering: no loss on truncated responses
  double kl_coef = 0.0;                   // > 0: KL to the frozen initial policy in the loss; >= 0
  // k1 | abs | k2 | k3 | k1+ | abs+ | k3+, or verl's kl | mse | low_var_kl (and their "+")
  std::string kl_estimator = "k3";
  double sft_coef = 0.0;           // > 0: + coef x NLL of forced-prefix tokens; >= 0
  double loss_scale_factor = 0.0;  // seq-mean-token-sum-norm's constant; 0 = response width
  // KL reference: an HF-layout model directory; empty = the initial policy, frozen.
  std::string reference;
  int max_reuse = 0;  // steps one trajectory may be trained in; 0 = no cap
  // With drop_equal_reward_groups: extra rollout batches collected per step to
  // refill the groups dropped (DAPO); 0 = train on what is left.
  int max_extra_batches = 0;
  // Data parallelism: world_size trainer ranks, one process each. Rank 0
  // serves workers and owns the store; each step's batch is split across the
  // ranks by tokens and gradients are summed over them (docs/cluster.md).
  int world_size = 1;
  // host:port of the c10d TCPStore rank 0 opens for the rendezvous; empty =
  // $MASTER_ADDR:$MASTER_PORT (torchrun / Slurm style).
  std::string rendezvous;
  int allreduce_bucket_mb = 25;       // gradients are all-reduced in buckets of this size
  double collective_timeout_s = 300;  // a collective (or a rank) silent this long fails the run
  // Recompute each decoder layer's activations in backward instead of keeping
  // them: less memory for long responses, about one more forward pass of time.
  bool activation_checkpointing = false;
  // MoE models: off | replay. replay routes each token to the experts the
  // rollout engine's router chose for it (recorded per token and layer) and
  // weights them by the trainer's own router (router replay, R3).
  std::string router_replay = "off";
  AdvantageConfig advantage;
  PpoConfig ppo;
  GspoConfig gspo;
  GmpoConfig gmpo;
  CispoConfig cispo;
  SapoConfig sapo;
  ClipCovConfig clip_cov;
  KlCovConfig kl_cov;
  LuffyConfig luffy;
  EntropyConfig entropy;
  RewardKlConfig reward_kl;
  RolloutCorrectionConfig rollout_correction;
  OptimizerConfig optimizer;
};

// A supervised warm start before RL: SFT on the task's target solutions.
struct WarmStartConfig {
  int sft_steps = 0;  // optimizer steps; 0 = none
  double sft_lr = 1e-3;
  int batch = 32;  // demonstrations per step
};

// The experiment as a job: where its outputs go and how long it trains.
// `relay run` and `relay-trainer` read it; command-line flags override it.
struct ExperimentSection {
  std::string name = "default";  // run directory is <output_dir>/<name>
  std::string output_dir = "runs";
  int steps = 100;            // RL optimizer steps (versions published)
  int groups_per_step = 8;    // prompt groups in one step's batch
  int checkpoint_every = 10;  // write a resumable checkpoint every N steps (and at the end)
  int keep_checkpoints = 2;   // newest checkpoints kept; older ones are deleted
  // Also keep the checkpoint with the best eval accuracy (checkpoints/best);
  // a step whose evaluation sets a new best is checkpointed.
  bool keep_best_checkpoint = true;
  WarmStartConfig warm_start;
};

// Held-out evaluation with the rollout engine: by the trainer (before RL,
// every N steps, at the end) and by `relay eval`. The last `prompts` prompts
// of a finite task are held out of training.
struct EvalConfig {
  int prompts = 0;  // held-out prompts; 0 = no evaluation
  int every = 0;    // also evaluate every N RL steps; 0 = only before and after
  // Samples per prompt for pass@k (k = 1, 2, 4, ... up to n) at
  // `temperature`; 0 = greedy accuracy only. Greedy accuracy is always reported.
  int n = 0;
  double temperature = 1.0;  // > 0; sampling temperature of the n samples
};

// How the trainer and its workers talk (docs/services.md).
struct TlsConfig {
  std::string cert;     // PEM certificate chain: the trainer's (and, with mutual, each worker's)
  std::string key;      // its private key
  std::string ca;       // CA that signed the certificates the other side presents
  bool mutual = false;  // the trainer also requires a client certificate signed by `ca`
};

struct ServicesConfig {
  std::string listen = "127.0.0.1:0";  // relay-trainer's gRPC address; port 0 = any free port
  // relay-trainer's HTTP endpoint (GET /metrics for Prometheus, /healthz);
  // port 0 = any free port, empty = off.
  std::string http_listen = "127.0.0.1:0";
  // File holding the shared bearer token (first line); empty = $RELAY_TOKEN,
  // and no token at all when that is unset too.
  std::string token_file;
  TlsConfig tls;                 // off when tls.cert is empty
  double lease_timeout_s = 600;  // a leased prompt not submitted by then is re-leased
  // The trainer gives up when no full batch arrives this long (sooner once
  // every worker that registered is gone: worker_timeout_s).
  double group_wait_s = 600;
  double rpc_timeout_s = 30;  // deadline of each worker call
  // A worker silent (no call at all) this long is taken for dead and its
  // leases go back to the queue at once; once every worker that registered
  // has been silent twice this long, the trainer stops waiting for groups
  // and fails. 0 = only lease deadlines.
  double worker_timeout_s = 30;
  // fetch: every worker downloads each version over gRPC; broadcast: workers
  // join the trainer's c10d group and receive versions by broadcast (fetching
  // only to join or recover); auto: broadcast when the worker can join, else fetch.
  std::string weight_sync = "fetch";
  int weight_sync_port = 0;           // the trainer's c10d TCPStore; 0 = any free port
  int weight_sync_bucket_mb = 64;     // flattened broadcast bucket size
  double weight_sync_timeout_s = 30;  // every collective and rendezvous
};

struct ExperimentConfig {
  ExperimentSection experiment;
  EvalConfig eval;
  RunConfig run;
  ModelConfig model;
  RolloutConfig rollout;
  TaskConfig task;
  TrainerConfig trainer;
  ServicesConfig services;
};

// Loads `path`, applies `overrides` ("key.path=value", YAML-typed value, e.g.
// "rollout.n=4" or "model.init.tie_embeddings=false") in order, then validates.
// Errors: NotFound (missing file), InvalidArgument (malformed YAML, unknown
// key, wrong type, bad value, malformed override). Never throws.
StatusOr<ExperimentConfig> load_config(const std::string& path,
                                       const std::vector<std::string>& overrides = {});

// Same as load_config, from YAML text; `source` names it in error messages.
StatusOr<ExperimentConfig> parse_config(const std::string& yaml_text, const std::string& source,
                                        const std::vector<std::string>& overrides = {});

// Checks value ranges and cross-field rules. Every error line is
// "<yaml.path>: <what>, got <value>"; all problems are reported, one per line.
Status validate(const ExperimentConfig& config);

// The fully resolved config (defaults filled in) as YAML that load_config
// accepts back unchanged.
std::string to_yaml(const ExperimentConfig& config);

// Every leaf key of `config` as a dotted YAML path with its value, in schema
// order: {"rollout.n", "8"}, {"trainer.lr", "1e-05"}, {"model.path", ""},
// {"rollout.stop", "[]"}. Scalars read as to_yaml writes them (unquoted); a
// list is its items joined as "[a, b]". With a default-constructed config
// these are the defaults docs/config.md documents
// (tests/unit/common/config_reference_test.cc checks it).
std::vector<std::pair<std::string, std::string>> config_fields(const ExperimentConfig& config);

}  // namespace relay
