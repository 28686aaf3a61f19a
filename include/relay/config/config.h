#pragma once

// Experiment configuration: what a YAML file (configs/*.yaml) turns into.
//
// Each section is the typed options struct of the component that reads it:
// `trainer:` is relay::trainer::TrainerOptions, `rollout:` and `task:` are the
// rollout side's (relay/rollout/options.h); the process-level sections
// (experiment, eval, run, model, services) are declared here. Components state
// their rules once (their check() functions); this layer binds YAML keys to
// the structs (src/config/), prefixes the YAML path onto each problem and
// names the file or override that set it. Every field has a default, so a
// config file names only what it changes. Loading rejects unknown keys
// (suggesting the nearest known one), wrong types and out-of-range values;
// every message names the file and the YAML path, e.g.
// "configs/grpo.yaml: rollout.n: must be >= 1, got 0".

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "relay/comm/weight_sync/weight_sync_mode.h"
#include "relay/common/logging.h"
#include "relay/common/name_table.h"
#include "relay/common/status.h"
#include "relay/model/attention_implementation.h"
#include "relay/model/chat_template.h"
#include "relay/model/precision.h"
#include "relay/rollout/options.h"
#include "relay/trainer/options.h"

namespace relay {

// Per-process settings.
struct RunConfig {
  uint64_t seed = 0;  // seeds model init, sampling and data order
  int threads = 0;    // intra-op threads for this process; 0 = all cores
  // A file the processes of one machine share their cores through
  // (model/core_share.h): run.threads is then the cores they divide among
  // the busy ones. `relay run` sets it when run.threads is 0. Empty: off.
  std::string core_share;
  LogLevel log_level = LogLevel::kInfo;  // trace | debug | info | warn | error | off
  // Where the model lives: cpu | cuda (= cuda:$LOCAL_RANK) | cuda:<i>. cuda
  // needs a CUDA build (docs/cluster.md).
  std::string device = "cpu";
  // Forward passes under autocast: none | bfloat16 | float16 (matrix
  // products in that precision, softmax and losses in fp32).
  model::Autocast autocast = model::Autocast::kNone;
};

// The architecture of a fresh model, named as config.json's model_type.
enum class ModelArch {
  kLlama,
  kQwen2,     // q/k/v projections with bias
  kQwen3,     // per-head q/k RMSNorm
  kQwen3Moe,  // qwen3 with a mixture of experts in every layer
};
inline const NameTable<ModelArch> kModelArchNames{"architecture",
                                                  {{"llama", ModelArch::kLlama},
                                                   {"qwen2", ModelArch::kQwen2},
                                                   {"qwen3", ModelArch::kQwen3},
                                                   {"qwen3_moe", ModelArch::kQwen3Moe}}};

// Architecture of a fresh model built from a seed (model.init). Ignored when
// model.path names a checkpoint directory.
struct ModelInitConfig {
  ModelArch arch = ModelArch::kLlama;  // llama | qwen2 | qwen3 | qwen3_moe
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
  std::string path;  // HF-layout directory (config.json + *.safetensors); empty = init
  model::Precision dtype = model::Precision::kFloat32;  // float32 | bfloat16 | float16
  // A fresh model's (model.init) tokenizer: char (built-in tasks) or a
  // tokenizer.json file, saved with its checkpoints. A model directory
  // brings its own.
  std::string tokenizer = "char";
  // Chat format prompts are rendered in (docs/model.md, "Chat templates"):
  // none (prompt text as written) | chatml (Qwen) | llama3 (Llama 3 Instruct) |
  // auto (chatml or llama3, from the tokenizer's special tokens; an error when
  // it has neither or both). chatml and llama3 need the tokenizer to have the
  // format's special tokens; the char tokenizer has none.
  model::ChatTemplateChoice chat_template = model::ChatTemplateChoice::kNone;
  // With a chat template: a system message put before every prompt that has
  // none of its own. "" = no system message (relay adds no default one).
  std::string system_prompt;
  // How attention is computed (model/attention_implementation.h), by
  // transformers' names: auto (sdpa where LibTorch has it, 2.0+) | eager | sdpa.
  model::AttentionChoice attn_implementation = model::AttentionChoice::kAuto;
  ModelInitConfig init;
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
  comm::WeightSyncMode weight_sync = comm::WeightSyncMode::kFetch;
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
  trainer::TrainerOptions trainer;
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
