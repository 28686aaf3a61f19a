#include "relay/rollout/engine.h"

#include <torch/types.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "relay/model/core_share.h"
#include "relay/model/cpu_memory.h"
#include "relay/model/device.h"
#include "relay/model/lora.h"
#include "rollout/engine_state.h"

namespace relay::rollout {

Engine::Engine(model::Policy policy, EngineOptions options, const model::KVCacheOptions& cache,
               int64_t version, uint64_t digest)
    : policy_(std::move(policy)),
      options_(std::move(options)),
      cache_(policy_->config(), cache),
      capacity_(cache_.max_seq_len()),
      routing_width_(options_.record_routing ? policy_->config().num_moe_layers() *
                                                   policy_->config().num_experts_per_tok
                                             : 0),
      version_(version),
      slots_(options_.num_slots, nullptr),
      start_time_(std::chrono::steady_clock::now()) {
  digests_[version] = digest;
  staged_version_ = version;
  stats_.kv_capacity_positions = cache_.num_blocks() * cache_.block_size();
  stats_.kv_bytes_per_position = cache_.bytes_per_position();
  stats_snapshot_ = stats_;
  version_snapshot_ = version;
  if (model::has_lora(*policy_)) {
    auto params = policy_->named_parameters();
    for (const std::string& name : model::adapter_names(*policy_)) {
      param_shapes_.emplace(name, params[name].sizes().vec());
    }
    param_shapes_.emplace(model::kBaseDigestTensor, std::vector<int64_t>{1});
  } else {
    for (const auto& item : policy_->named_parameters()) {
      param_shapes_.emplace(item.key(), item.value().sizes().vec());
    }
  }
}

Engine::~Engine() = default;

namespace {

// Whether LibTorch multiplies matrices in `dtype` on `device`: LibTorch 1.13
// has no fp16 product on the CPU, so an engine asked for one would fail at
// its first prefill.
Status check_products_in(model::Precision precision, const c10::Device& device) {
  try {
    torch::NoGradGuard no_grad;
    const at::Tensor a = torch::ones(
        {2, 2}, torch::TensorOptions().dtype(model::scalar_type(precision)).device(device));
    (void)torch::mm(a, a);
  } catch (const c10::Error&) {
    return InvalidArgumentError(absl::StrCat(
        "dtype: ", model::kPrecisionNames.name(precision), " matrix products are not available on ",
        device.str(), " in LibTorch ", TORCH_VERSION, "; use bfloat16 or float32 there"));
  }
  return OkStatus();
}

// The KV budget: blocks of kv_block_size positions, as many as the bytes
// allow (rollout.kv_cache_gb), or as many as every slot at its capacity
// needs, within a fraction of the free memory.
StatusOr<model::KVCacheOptions> kv_cache_options(const model::PolicyImpl& policy,
                                                 const EngineOptions& options) {
  const model::PolicyConfig& pc = policy.config();
  const at::Tensor& weight = policy.model->embed_tokens->weight;
  model::KVCacheOptions kv;
  kv.num_slots = options.num_slots;
  kv.max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : pc.max_position_embeddings;
  kv.block_size = options.kv_block_size;
  kv.dtype = weight.scalar_type();
  kv.device = weight.device();
  const int64_t position_bytes = 2 * pc.num_hidden_layers * pc.num_key_value_heads *
                                 pc.resolved_head_dim() * c10::elementSize(kv.dtype);
  const int64_t block_bytes = position_bytes * kv.block_size;
  const int64_t blocks_per_seq = (kv.max_seq_len + kv.block_size - 1) / kv.block_size;
  int64_t budget = static_cast<int64_t>(options.kv_cache_gb * (1ull << 30));
  if (budget == 0) {
    budget = options.num_slots * blocks_per_seq * block_bytes;
    const int64_t free = model::free_memory_bytes(kv.device);
    if (free > 0) {
      budget = std::min<int64_t>(budget, static_cast<int64_t>(options.kv_cache_fraction * free));
    }
  }
  kv.num_blocks = budget / block_bytes;
  const int64_t smallest = std::min(kv.max_seq_len, 1 + options.max_new_tokens);
  const int64_t min_blocks = (smallest + kv.block_size - 1) / kv.block_size;
  if (kv.num_blocks < min_blocks) {
    return InvalidArgumentError(absl::StrFormat(
        "rollout.kv_cache_gb: a budget of %.4g GiB holds %d positions of this model (%d bytes "
        "each); one sequence of a 1-token prompt and max_new_tokens %d needs %d: set at least "
        "%.4g GiB%s",
        static_cast<double>(budget) / (1ull << 30), kv.num_blocks * kv.block_size, position_bytes,
        options.max_new_tokens, smallest,
        static_cast<double>(min_blocks * block_bytes) / (1ull << 30),
        options.kv_cache_gb == 0 ? " (it was kv_cache_fraction of the free memory)" : ""));
  }
  return kv;
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::create(model::Policy policy, EngineOptions options,
                                                 int64_t version, uint64_t digest) {
  if (!policy) return InvalidArgumentError("Engine: policy is null");
  RELAY_RETURN_IF_ERROR(check_options(options, ""));
  std::optional<uint64_t> base;
  if (model::has_lora(*policy)) {
    RELAY_ASSIGN_OR_RETURN(base, model::base_digest(*policy));
  }
  if (version < 0)
    return InvalidArgumentError(absl::StrCat("version: must be >= 0, got ", version));
  const int64_t vocab = policy->config().vocab_size;
  for (size_t i = 0; i < options.stop_tokens.size(); ++i) {
    if (options.stop_tokens[i] < 0 || options.stop_tokens[i] >= vocab) {
      return InvalidArgumentError(absl::StrCat("stop_tokens[", i, "]: token id ",
                                               options.stop_tokens[i],
                                               " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (options.vocab_limit > vocab) {
    return InvalidArgumentError(absl::StrCat("vocab_limit: must be in [0, ", vocab,
                                             "] (0 = the whole vocabulary), got ",
                                             options.vocab_limit));
  }
  const int64_t support = options.vocab_limit > 0 ? options.vocab_limit : vocab;
  for (size_t i = 0; i < options.stop_tokens.size(); ++i) {
    if (options.stop_tokens[i] >= support) {
      return InvalidArgumentError(
          absl::StrCat("stop_tokens[", i, "]: token id ", options.stop_tokens[i],
                       " can never be sampled: the tokenizer's vocabulary ends at ", support));
    }
  }

  // rollout.fp32_lm_head: the head taken before any conversion, so that it
  // keeps the fp32 values the engine was given.
  const std::optional<model::Precision> precision = engine_precision(options.dtype);
  const c10::ScalarType held = precision ? model::scalar_type(*precision)
                                         : policy->model->embed_tokens->weight.scalar_type();
  const bool fp32_head = options.fp32_lm_head && held != torch::kFloat32;
  if (fp32_head && options.autocast != model::Autocast::kNone) {
    return InvalidArgumentError(
        "rollout.fp32_lm_head: not with run.autocast, under which the head's product would run "
        "in the autocast precision; hold the weights in bf16 with rollout.dtype instead");
  }
  if (precision) {
    RELAY_RETURN_IF_ERROR(
        check_products_in(*precision, policy->model->embed_tokens->weight.device()));
  }
  // rollout.decode_graphs: auto takes them on a CUDA device where the model
  // allows; on takes them anywhere, and refuses a model that does not.
  bool graphs = false;
  if (options.decode_graphs != DecodeGraphMode::kOff) {
    std::string why;
    const bool supported = model::DecodeGraphs::supports(*policy, options.kv_block_size, &why);
    if (options.decode_graphs == DecodeGraphMode::kOn && !supported) {
      return InvalidArgumentError(absl::StrCat("decode_graphs: 'on' cannot run this model: ", why));
    }
    graphs = supported && (options.decode_graphs == DecodeGraphMode::kOn ||
                           policy->model->embed_tokens->weight.device().is_cuda());
  }
  // Every refusal is above: from here on the policy changes.
  if (fp32_head) {
    torch::NoGradGuard no_grad;
    policy->set_fp32_lm_head(policy->named_parameters()[policy->lm_head_parameter_name()]);
  }
  // rollout.dtype: the engine's copy in its own precision, before the KV
  // cache takes the weights' dtype. (The LoRA base digest above is the
  // trainer's weights', as published.)
  if (policy->model->embed_tokens->weight.scalar_type() != held) {
    torch::NoGradGuard no_grad;
    policy->to(held);
    // The weights in the old dtype, which nothing will reuse.
    model::release_free_cpu_memory();
  }
  RELAY_ASSIGN_OR_RETURN(const model::KVCacheOptions kv, kv_cache_options(*policy, options));
  policy->eval();
  std::unique_ptr<Engine> engine(
      new Engine(std::move(policy), std::move(options), kv, version, digest));
  engine->base_digest_ = base;
  if (graphs) engine->graphs_ = std::make_unique<model::DecodeGraphs>();
  return engine;
}

// ---------------------------------------------------------------------------
// Calls from any thread.

Status Engine::submit(PromptGroup group) {
  const std::string where = absl::StrCat("group '", group.group_id, "'");
  if (group.k < 1)
    return InvalidArgumentError(absl::StrCat(where, ": k: must be >= 1, got ", group.k));
  if (group.prompt.empty()) return InvalidArgumentError(absl::StrCat(where, ": prompt: empty"));
  if (group.episode && group.greedy_baseline) {
    return InvalidArgumentError(absl::StrCat(
        where, ": greedy_baseline: not with an episode (its turns need an environment)"));
  }
  // Prompts may hold any id of the model; forced target tokens are scored as
  // samples are, so they must lie in the sampling support.
  auto check_ids = [&](const std::vector<int64_t>& ids, const char* field,
                       int64_t vocab) -> Status {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        return InvalidArgumentError(absl::StrCat(where, ": ", field, "[", i, "]: token id ", ids[i],
                                                 " outside the vocabulary [0, ", vocab, ")"));
      }
    }
    return OkStatus();
  };
  const int64_t vocab = policy_->config().vocab_size;
  const int64_t support = options_.vocab_limit > 0 ? options_.vocab_limit : vocab;
  RELAY_RETURN_IF_ERROR(check_ids(group.prompt, "prompt", vocab));
  RELAY_RETURN_IF_ERROR(check_ids(group.target, "target", support));
  RELAY_RETURN_IF_ERROR(check_ids(group.sampling.stop_tokens, "sampling.stop_tokens", support));
  const GroupSampling& gs = group.sampling;
  if (gs.temperature && !(*gs.temperature > 0 && std::isfinite(*gs.temperature))) {
    return InvalidArgumentError(
        absl::StrCat(where, ": sampling.temperature: must be > 0, got ", *gs.temperature));
  }
  if (gs.top_k && *gs.top_k < 0) {
    return InvalidArgumentError(
        absl::StrCat(where, ": sampling.top_k: must be >= 0 (0 = off), got ", *gs.top_k));
  }
  if (gs.top_p && !(*gs.top_p > 0 && *gs.top_p <= 1)) {
    return InvalidArgumentError(
        absl::StrCat(where, ": sampling.top_p: must be in (0, 1], got ", *gs.top_p));
  }
  if (gs.max_new_tokens < 0) {
    return InvalidArgumentError(
        absl::StrCat(where, ": sampling.max_new_tokens: must be >= 0 (0 = the engine's), got ",
                     gs.max_new_tokens));
  }
  const auto prompt_len = static_cast<int64_t>(group.prompt.size());
  if (prompt_len >= capacity_) {
    return InvalidArgumentError(absl::StrCat(where, ": prompt: length ", prompt_len,
                                             " leaves no room in a sequence of ", capacity_,
                                             " positions"));
  }
  const int64_t budget = options_.response_budget(group.episode, gs.max_new_tokens);
  const int64_t need = std::min(capacity_, prompt_len + budget);
  if (cache_.blocks_for(need) > cache_.num_blocks()) {
    const double gib = static_cast<double>(cache_.blocks_for(need) * cache_.block_size() *
                                           cache_.bytes_per_position()) /
                       (1ull << 30);
    return InvalidArgumentError(absl::StrFormat(
        "%s: prompt of %d tokens + %s %d need %d KV positions; the budget holds %d "
        "(rollout.kv_cache_gb: at least %.4g GiB)",
        where, prompt_len, group.episode ? "the episode's token budget" : "max_new_tokens", budget,
        need, cache_.num_blocks() * cache_.block_size(), gib));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (group.episode && !turn_handler_) {
    return FailedPreconditionError(
        absl::StrCat(where, ": an episode needs a turn handler (set_turn_handler) first"));
  }
  if (group.stream_tokens && !token_handler_) {
    return FailedPreconditionError(
        absl::StrCat(where, ": stream_tokens needs a token handler (set_token_handler) first"));
  }
  if (!open_ids_.insert(group.group_id).second) {
    return InvalidArgumentError(absl::StrCat(where, ": group_id: already queued or in flight"));
  }
  if (group.prefix_step < 0) group.prefix_step = version_snapshot_;
  submitted_.push_back({std::move(group), seconds_since(start_time_)});
  input_cv_.notify_all();
  return OkStatus();
}

void Engine::set_turn_handler(TurnHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  turn_handler_ = std::move(handler);
}

void Engine::set_token_handler(TokenHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  token_handler_ = std::move(handler);
}

Status Engine::end_sample(const std::string& group_id, int sample, FinishReason reason) {
  if (reason != FinishReason::kStop && reason != FinishReason::kAborted) {
    return InvalidArgumentError(absl::StrCat("end_sample: group '", group_id,
                                             "': reason: must be stop or aborted, got ",
                                             finish_reason_name(reason)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ends_.push_back({group_id, sample, reason});
  input_cv_.notify_all();
  return OkStatus();
}

Status Engine::reply(const std::string& group_id, int sample, TurnReply reply) {
  const std::string where = absl::StrCat("reply to group '", group_id, "' sample ", sample);
  if (reply.end && *reply.end != FinishReason::kStop && *reply.end != FinishReason::kEnvDone &&
      *reply.end != FinishReason::kEnvError) {
    return InvalidArgumentError(absl::StrCat(
        where, ": end: must be stop, env_done or env_error, got ", finish_reason_name(*reply.end)));
  }
  if (!reply.end && reply.observation.empty()) {
    return InvalidArgumentError(
        absl::StrCat(where, ": observation: empty, but the episode goes on (set end to stop it)"));
  }
  const int64_t vocab = policy_->config().vocab_size;
  for (size_t i = 0; i < reply.observation.size(); ++i) {
    if (reply.observation[i] < 0 || reply.observation[i] >= vocab) {
      return InvalidArgumentError(absl::StrCat(where, ": observation[", i, "]: token id ",
                                               reply.observation[i], " outside the vocabulary [0, ",
                                               vocab, ")"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (awaiting_.erase({group_id, sample}) == 0) {
    return FailedPreconditionError(
        absl::StrCat(where, ": that sample is not waiting for an environment's answer"));
  }
  replies_.push_back({group_id, sample, std::move(reply)});
  input_cv_.notify_all();
  return OkStatus();
}

Status Engine::update_weights(int64_t version, uint64_t digest,
                              std::unordered_map<std::string, at::Tensor> tensors) {
  for (const auto& [name, shape] : param_shapes_) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return InvalidArgumentError(
          absl::StrCat("update_weights: version ", version, " is missing parameter '", name, "'"));
    }
    if (!it->second.defined() || it->second.sizes().vec() != shape) {
      return InvalidArgumentError(absl::StrCat(
          "update_weights: version ", version, ": parameter '", name, "' has shape [",
          it->second.defined() ? absl::StrJoin(it->second.sizes().vec(), ", ") : "undefined",
          "], expected [", absl::StrJoin(shape, ", "), "]"));
    }
  }
  for (const auto& [name, tensor] : tensors) {
    if (param_shapes_.count(name) == 0) {
      return InvalidArgumentError(
          absl::StrCat("update_weights: version ", version, ": unknown parameter '", name, "'"));
    }
  }
  if (base_digest_) {
    // LoRA: the adapters were trained on the trainer's base; on any other
    // they would sample from a model nobody trained.
    at::Tensor& theirs = tensors.at(model::kBaseDigestTensor);
    const auto digest_of = static_cast<uint64_t>(theirs.to(torch::kCPU).item<int64_t>());
    if (digest_of != *base_digest_) {
      return FailedPreconditionError(absl::StrFormat(
          "update_weights: version %d adapts base weights with digest %x, and this engine's base "
          "weights have digest %x: start the worker with the trainer's model directory",
          version, digest_of, *base_digest_));
    }
    tensors.erase(model::kBaseDigestTensor);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (version <= staged_version_) {
    return FailedPreconditionError(absl::StrCat("update_weights: version ", version,
                                                " is not newer than version ", staged_version_,
                                                " (held or staged)"));
  }
  staged_version_ = version;
  if (open_ids_.empty() || options_.interrupt == InterruptPolicy::kFinish) {
    // No group anywhere in the engine: no sequence can start on the staged
    // versions or need their proximal values, so only the newest is kept.
    // Otherwise an idle worker held one copy of the weights per version
    // published until its next lease. Under kFinish a staged version lands
    // only once nothing decodes and nothing is admitted until the newest is
    // in, so no token is ever sampled on an older staged one; and a turn is
    // one version, its proximal values its own. Keeping them all held one
    // copy of the weights per version published during a long response.
    updates_superseded_ += static_cast<int64_t>(updates_.size());
    updates_.clear();
  }
  updates_.push_back({version, digest, std::move(tensors)});
  input_cv_.notify_all();
  return OkStatus();
}

void Engine::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  abort_requested_ = true;
  input_cv_.notify_all();
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_ids_.empty();
}

int64_t Engine::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_snapshot_;
}

int64_t Engine::live_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_snapshot_;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_snapshot_;
  s.updates_superseded = updates_superseded_;
  return s;
}

double Engine::seconds_since(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// ---------------------------------------------------------------------------
// The engine thread.

StatusOr<std::vector<TrajectoryGroup>> Engine::run() {
  std::vector<TrajectoryGroup> all;
  while (!idle()) {
    RELAY_ASSIGN_OR_RETURN(std::vector<TrajectoryGroup> done, step());
    for (TrajectoryGroup& g : done) all.push_back(std::move(g));
  }
  return all;
}

StatusOr<std::vector<TrajectoryGroup>> Engine::step() {
  // A safe point: the machine's cores may have been re-divided (core_share.h).
  model::refresh_cores();
  torch::NoGradGuard no_grad;
  const model::AutocastGuard autocast(policy_->parameters().front().device().type(),
                                      model::autocast_type(options_.autocast));
  StepState s;
  take_inputs(s);
  for (Submission& sub : s.incoming) enqueue(std::move(sub));
  s.now = seconds_since(start_time_);
  if (s.abort) {
    abort_all(s.now);
  } else {
    RELAY_RETURN_IF_ERROR(advance(s));
    ++stats_.steps;
  }
  collect_done(s.done);
  publish(s);
  // Outside the lock: the handlers may answer at once (reply(), end_sample()).
  for (TurnEnd& end : s.turn_ends) turn_handler_(std::move(end));
  if (!s.sampled.empty()) token_handler_(std::move(s.sampled));
  return std::move(s.done);
}

void Engine::take_inputs(StepState& s) {
  // Sequences in the middle of a turn; parked ones wait for an environment.
  const int64_t live = std::count_if(slots_.begin(), slots_.end(),
                                     [](Sequence* q) { return q != nullptr && !q->parked; });
  const int64_t parked = std::count_if(slots_.begin(), slots_.end(),
                                       [](Sequence* q) { return q != nullptr && q->parked; });
  std::unique_lock<std::mutex> lock(mu_);
  if (live == 0 && parked > 0 && (waiting_.empty() || admission_blocked_)) {
    // Nothing can run until an environment answers (or something else
    // arrives): every sequence in a slot is parked, and no waiting sample
    // can take a slot. Bounded, so the caller's loop keeps its heartbeats.
    input_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] {
      return !replies_.empty() || !submitted_.empty() || !updates_.empty() || !ends_.empty() ||
             abort_requested_;
    });
  }
  s.incoming.swap(submitted_);
  s.replies.swap(replies_);
  s.ends.swap(ends_);
  s.abort = abort_requested_;
  abort_requested_ = false;
  if (updates_.empty()) return;
  // kFinish holds the update back until the sequences in flight are done.
  if (options_.interrupt != InterruptPolicy::kFinish || live == 0) {
    s.update = std::move(updates_.front());
    updates_.pop_front();
  }
  s.draining = options_.interrupt == InterruptPolicy::kFinish && !s.update;
  // Groups wait for the newest staged version: admitting them now would
  // start them on weights already superseded (one version per step).
  s.newer_pending = s.update.has_value() && !updates_.empty();
}

Status Engine::advance(StepState& s) {
  try {
    if (s.update) apply_update(*s.update);
    for (const PendingEnd& e : s.ends) apply_end(e, s.now);
    for (PendingReply& r : s.replies) apply_reply(r, s.now);
    for (Sequence* seq : slots_) stats_.parked_sequence_steps += seq != nullptr && seq->parked;
    if (!s.draining && !s.newer_pending) admit(s.now);
    run_model(s);
    sample_and_retire(s);
  } catch (const c10::Error& e) {
    return InternalError(absl::StrCat("rollout engine step ", stats_.steps,
                                      ": model error: ", e.what_without_backtrace()));
  }
  return OkStatus();
}

void Engine::publish(const StepState& s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const TrajectoryGroup& g : s.done) {
    open_ids_.erase(g.group_id);
    // An aborted episode's sample may still be listed as waiting.
    for (auto it = awaiting_.lower_bound({g.group_id, 0});
         it != awaiting_.end() && it->first == g.group_id;) {
      it = awaiting_.erase(it);
    }
  }
  for (const TurnEnd& end : s.turn_ends) awaiting_.insert({end.group_id, end.sample});
  version_snapshot_ = version_;
  live_snapshot_ = std::count_if(slots_.begin(), slots_.end(), [](Sequence* q) { return q; });
  stats_snapshot_ = stats_;
}

}  // namespace relay::rollout
