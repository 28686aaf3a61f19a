#include "relay/rollout/engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "relay/model/device.h"

namespace relay::rollout {

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
}  // namespace

StatusOr<EngineOptions> engine_options(const RolloutConfig& config,
                                       std::vector<int64_t> stop_tokens) {
  EngineOptions o;
  if (config.num_slots < 1) {
    return InvalidArgumentError(
        absl::StrCat("rollout.num_slots: must be >= 1, got ", config.num_slots));
  }
  if (config.max_new_tokens < 1) {
    return InvalidArgumentError(
        absl::StrCat("rollout.max_new_tokens: must be >= 1, got ", config.max_new_tokens));
  }
  if (!(config.kv_cache_gb >= 0) || !std::isfinite(config.kv_cache_gb)) {
    return InvalidArgumentError(absl::StrCat(
        "rollout.kv_cache_gb: must be >= 0 (0 = kv_cache_fraction of free memory), got ",
        config.kv_cache_gb));
  }
  if (!(config.kv_cache_fraction > 0 && config.kv_cache_fraction <= 1)) {
    return InvalidArgumentError(absl::StrCat("rollout.kv_cache_fraction: must be in (0, 1], got ",
                                             config.kv_cache_fraction));
  }
  o.num_slots = config.num_slots;
  o.max_new_tokens = config.max_new_tokens;
  o.kv_cache_bytes = static_cast<int64_t>(config.kv_cache_gb * (1ull << 30));
  o.kv_cache_fraction = config.kv_cache_fraction;
  o.sampling.temperature = config.temperature;
  o.sampling.top_k = config.top_k;
  o.sampling.top_p = config.top_p;
  o.sampling.record_raw_logprobs = config.record_raw_logprobs;
  Status sampling = validate(o.sampling);
  if (!sampling.ok()) return InvalidArgumentError(absl::StrCat("rollout.", sampling.message()));
  o.stop_tokens = std::move(stop_tokens);
  RELAY_ASSIGN_OR_RETURN(o.interrupt, parse_interrupt_policy(config.interrupt));
  RELAY_ASSIGN_OR_RETURN(o.prefix, prefix_options(config.prefix));
  return o;
}

// One sample of a group (or its greedy baseline), from admission to finish.
struct Engine::Sequence {
  Group* group = nullptr;
  bool greedy = false;  // the group's greedy baseline: argmax, never forced, no draws
  SequenceRng rng{0};
  int64_t prompt_len = 0;
  std::vector<int64_t> forced;  // prefix tokens copied from the target
  std::vector<int64_t> tokens;  // prompt + response
  Trajectory out;               // response fields, filled as tokens arrive
  // Per response token: log-prob at the sampling temperature without
  // truncation under the weights that produced the token; becomes the
  // proximal value of tokens of the version held at finish.
  std::vector<float> own_logprobs;

  int64_t slot = -1;
  int64_t kv_len = 0;     // positions in the slot's cache
  int64_t kv_epoch = -1;  // weights epoch that computed the cache (-1 = empty)
  // First index into `tokens` whose log-prob the next pass must produce
  // (forced tokens, proximal recompute); tokens.size() = none.
  int64_t score_from = 0;
  bool proximal_pass = false;  // the next pass records proximal values
  bool done = false;
  // MoE routing of positions [0, routing.size() / width), first run wins.
  std::vector<int32_t> routing;

  int64_t response_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

struct Engine::Group {
  PromptGroup request;
  double submitted_s = 0.0;
  // Sample j at index j, then the greedy baseline if the group asked for one.
  std::vector<std::unique_ptr<Sequence>> samples;
  int finished = 0;
};

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
  for (const auto& item : policy_->named_parameters()) {
    param_shapes_.emplace(item.key(), item.value().sizes().vec());
  }
}

Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::create(model::Policy policy, EngineOptions options,
                                                 int64_t version, uint64_t digest) {
  if (!policy) return InvalidArgumentError("Engine: policy is null");
  if (options.num_slots < 1) {
    return InvalidArgumentError(absl::StrCat("num_slots: must be >= 1, got ", options.num_slots));
  }
  if (options.max_new_tokens < 1) {
    return InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 1, got ", options.max_new_tokens));
  }
  if (options.max_seq_len < 0) {
    return InvalidArgumentError(
        absl::StrCat("max_seq_len: must be >= 0, got ", options.max_seq_len));
  }
  if (version < 0)
    return InvalidArgumentError(absl::StrCat("version: must be >= 0, got ", version));
  RELAY_RETURN_IF_ERROR(validate(options.sampling));
  const int64_t vocab = policy->config().vocab_size;
  for (size_t i = 0; i < options.stop_tokens.size(); ++i) {
    if (options.stop_tokens[i] < 0 || options.stop_tokens[i] >= vocab) {
      return InvalidArgumentError(absl::StrCat("stop_tokens[", i, "]: token id ",
                                               options.stop_tokens[i],
                                               " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const model::PolicyConfig& pc = policy->config();
  if (options.vocab_limit < 0 || options.vocab_limit > vocab) {
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
  if (options.kv_block_size < 1) {
    return InvalidArgumentError(
        absl::StrCat("kv_block_size: must be >= 1, got ", options.kv_block_size));
  }

  // The KV budget: blocks of kv_block_size positions, as many as the bytes
  // allow (rollout.kv_cache_gb), or as many as every slot at its capacity
  // needs, within a fraction of the free memory.
  const at::Tensor& weight = policy->model->embed_tokens->weight;
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
  int64_t budget = options.kv_cache_bytes;
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
        options.kv_cache_bytes == 0 ? " (it was kv_cache_fraction of the free memory)" : ""));
  }
  policy->eval();
  return std::unique_ptr<Engine>(
      new Engine(std::move(policy), std::move(options), kv, version, digest));
}

// ---------------------------------------------------------------------------
// Calls from any thread.

Status Engine::submit(PromptGroup group) {
  const std::string where = absl::StrCat("group '", group.group_id, "'");
  if (group.k < 1)
    return InvalidArgumentError(absl::StrCat(where, ": k: must be >= 1, got ", group.k));
  if (group.prompt.empty()) return InvalidArgumentError(absl::StrCat(where, ": prompt: empty"));
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
  RELAY_RETURN_IF_ERROR(check_ids(group.prompt, "prompt", vocab));
  RELAY_RETURN_IF_ERROR(
      check_ids(group.target, "target", options_.vocab_limit > 0 ? options_.vocab_limit : vocab));
  const auto prompt_len = static_cast<int64_t>(group.prompt.size());
  if (prompt_len >= capacity_) {
    return InvalidArgumentError(absl::StrCat(where, ": prompt: length ", prompt_len,
                                             " leaves no room in a sequence of ", capacity_,
                                             " positions"));
  }
  const int64_t need = std::min(capacity_, prompt_len + options_.max_new_tokens);
  if (cache_.blocks_for(need) > cache_.num_blocks()) {
    const double gib = static_cast<double>(cache_.blocks_for(need) * cache_.block_size() *
                                           cache_.bytes_per_position()) /
                       (1ull << 30);
    return InvalidArgumentError(absl::StrFormat(
        "%s: prompt of %d tokens + max_new_tokens %d need %d KV positions; the budget holds %d "
        "(rollout.kv_cache_gb: at least %.4g GiB)",
        where, prompt_len, options_.max_new_tokens, need, cache_.num_blocks() * cache_.block_size(),
        gib));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ids_.insert(group.group_id).second) {
    return InvalidArgumentError(absl::StrCat(where, ": group_id: already queued or in flight"));
  }
  if (group.prefix_step < 0) group.prefix_step = version_snapshot_;
  submitted_.push_back({std::move(group), seconds_since(start_time_)});
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
  std::lock_guard<std::mutex> lock(mu_);
  if (version <= staged_version_) {
    return FailedPreconditionError(absl::StrCat("update_weights: version ", version,
                                                " is not newer than version ", staged_version_,
                                                " (held or staged)"));
  }
  staged_version_ = version;
  updates_.push_back({version, digest, std::move(tensors)});
  return OkStatus();
}

void Engine::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  abort_requested_ = true;
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
  return stats_snapshot_;
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
  torch::NoGradGuard no_grad;
  const model::AutocastGuard autocast(policy_->parameters().front().device().type(),
                                      options_.autocast);
  std::deque<Submission> incoming;
  std::optional<PendingUpdate> update;
  bool abort_now = false;
  bool draining = false;
  bool newer_pending = false;
  const int64_t live = std::count_if(slots_.begin(), slots_.end(), [](Sequence* s) { return s; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(submitted_);
    abort_now = abort_requested_;
    abort_requested_ = false;
    if (!updates_.empty()) {
      // kFinish holds the update back until the sequences in flight are done.
      if (options_.interrupt != InterruptPolicy::kFinish || live == 0) {
        update = std::move(updates_.front());
        updates_.pop_front();
      }
      draining = options_.interrupt == InterruptPolicy::kFinish && !update;
      // Groups wait for the newest staged version: admitting them now would
      // start them on weights already superseded (one version per step).
      newer_pending = update.has_value() && !updates_.empty();
    }
  }
  for (Submission& s : incoming) enqueue(std::move(s));

  std::vector<TrajectoryGroup> done;
  const double now = seconds_since(start_time_);
  if (abort_now) {
    abort_all(now);
  } else {
    try {
      if (update) apply_update(*update);
      if (!draining && !newer_pending) admit(now);
      run_model();
      sample_and_retire(now);
    } catch (const c10::Error& e) {
      return InternalError(absl::StrCat("rollout engine step ", stats_.steps,
                                        ": model error: ", e.what_without_backtrace()));
    }
    ++stats_.steps;
  }
  collect_done(done);

  std::lock_guard<std::mutex> lock(mu_);
  for (const TrajectoryGroup& g : done) open_ids_.erase(g.group_id);
  version_snapshot_ = version_;
  live_snapshot_ = std::count_if(slots_.begin(), slots_.end(), [](Sequence* s) { return s; });
  stats_snapshot_ = stats_;
  return done;
}

void Engine::enqueue(Submission submission) {
  auto group = std::make_unique<Group>();
  group->request = std::move(submission.group);
  group->submitted_s = submission.at_s;
  const PromptGroup& req = group->request;
  std::vector<double> ratios(req.k, 0.0);
  if (!req.target.empty()) {
    // The schedule's own stream: a pure function of the group's seed.
    ratios = prefix_ratios(options_.prefix, req.k, req.prefix_step,
                           sequence_seed(req.seed, std::numeric_limits<uint64_t>::max()));
  }
  for (int j = 0; j < req.k; ++j) {
    auto seq = std::make_unique<Sequence>();
    seq->group = group.get();
    seq->rng = SequenceRng(sequence_seed(req.seed, j));
    seq->prompt_len = static_cast<int64_t>(req.prompt.size());
    int64_t n =
        prefix_length(ratios[j], static_cast<int64_t>(req.target.size()), options_.prefix.max_len);
    // Leave room for at least one sampled token, and stop at a stop token:
    // a forced stop token ends the response there.
    n = std::min({n, options_.max_new_tokens - 1, capacity_ - seq->prompt_len - 1});
    for (int64_t i = 0; i < n; ++i) {
      seq->forced.push_back(req.target[i]);
      if (is_stop(req.target[i])) break;
    }
    seq->out.prefix_ratio = seq->forced.empty() ? 0.0 : ratios[j];
    seq->out.interrupt_policy = options_.interrupt;
    waiting_.push_back(seq.get());
    group->samples.push_back(std::move(seq));
  }
  if (req.greedy_baseline) {
    // Queued right after the samples, so it is usually admitted with them and
    // shares their prefill; no forced prefix, no random stream.
    auto seq = std::make_unique<Sequence>();
    seq->group = group.get();
    seq->greedy = true;
    seq->prompt_len = static_cast<int64_t>(req.prompt.size());
    seq->out.interrupt_policy = options_.interrupt;
    waiting_.push_back(seq.get());
    group->samples.push_back(std::move(seq));
  }
  groups_.push_back(std::move(group));
}

bool Engine::is_stop(int64_t token) const {
  return std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(), token) !=
         options_.stop_tokens.end();
}

void Engine::apply_update(PendingUpdate& update) {
  for (auto& item : policy_->named_parameters()) {
    item.value().copy_(update.tensors.at(item.key()));
  }
  update.tensors.clear();  // the staged copy is no longer needed
  version_ = update.version;
  digests_[version_] = update.digest;
  ++epoch_;  // every cache built so far came from older weights
  ++stats_.updates_applied;

  for (Sequence* seq : slots_) {
    if (seq == nullptr) continue;
    ++seq->out.interruptions;
    switch (options_.interrupt) {
      case InterruptPolicy::kRecompute: {
        // Rebuild the cache under the new weights; the pass scores every
        // token of version_ - 1 for its proximal value (and any forced token
        // not scored yet).
        stats_.recomputed_tokens += seq->kv_len;
        reset_cache(*seq);
        int64_t from = static_cast<int64_t>(seq->tokens.size());
        for (int64_t r = 0; r < seq->response_len(); ++r) {
          if (seq->out.token_versions[r] == version_ - 1 || seq->out.token_versions[r] < 0) {
            from = seq->prompt_len + r;
            break;
          }
        }
        seq->score_from = from;
        seq->proximal_pass = true;
        break;
      }
      case InterruptPolicy::kKeep:
        seq->out.stale_kv = true;
        break;
      case InterruptPolicy::kFinish:
        break;  // not reached: kFinish applies updates with nothing in flight
      case InterruptPolicy::kRestart:
        ++seq->out.restarts;
        reset_cache(*seq);
        begin_response(*seq);
        seq->routing.clear();  // everything is run again under the new weights
        break;
    }
  }
}

void Engine::reset_cache(Sequence& seq) {
  cache_.reset(seq.slot);
  seq.kv_len = 0;
  seq.kv_epoch = -1;
}

// Sets the response to the forced prefix alone (not yet scored).
void Engine::begin_response(Sequence& seq) {
  const PromptGroup& req = seq.group->request;
  seq.tokens = req.prompt;
  seq.tokens.insert(seq.tokens.end(), seq.forced.begin(), seq.forced.end());
  Trajectory& t = seq.out;
  const size_t n = seq.forced.size();
  t.response_tokens = seq.forced;
  t.behavior_logprobs.assign(n, kNaN);
  if (options_.sampling.record_raw_logprobs) t.raw_logprobs.assign(n, kNaN);
  t.token_versions.assign(n, -1);  // set when the forced tokens are scored
  t.proximal_logprobs.assign(n, kNaN);
  t.proximal_versions.assign(n, -1);
  t.offpolicy_mask.assign(n, 1);
  seq.own_logprobs.assign(n, kNaN);
  seq.score_from = seq.prompt_len;  // forced tokens are scored; else only the next-token logits
  if (n == 0) seq.score_from = static_cast<int64_t>(seq.tokens.size());
  seq.proximal_pass = false;
}

int64_t Engine::reserved_positions(const Sequence& seq) const {
  return std::min(capacity_, seq.prompt_len + options_.max_new_tokens);
}

void Engine::admit(double now) {
  for (int64_t slot = 0; slot < options_.num_slots && !waiting_.empty(); ++slot) {
    if (slots_[slot] != nullptr) continue;
    Sequence* seq = waiting_.front();
    // In order: a sequence that does not fit yet waits for room, and those
    // behind it wait with it (no overtaking, so none waits forever).
    if (!cache_.reserve(slot, reserved_positions(*seq))) {
      ++stats_.admission_waits;
      break;
    }
    waiting_.pop_front();
    slots_[slot] = seq;
    seq->slot = slot;
    reset_cache(*seq);
    begin_response(*seq);
    seq->out.admitted_s = now - seq->group->submitted_s;
  }
}

// Extends each row's cache with tokens[kv_len : ends[b]) in one batched call.
at::Tensor Engine::extend_rows(const std::vector<Sequence*>& rows, const std::vector<int64_t>& ends,
                               model::ExtendLogits which) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0;
  for (int64_t b = 0; b < B; ++b) T = std::max(T, ends[b] - rows[b]->kv_len);
  at::Tensor ids = torch::zeros({B, T}, torch::kInt64);
  at::Tensor lens = torch::empty({B}, torch::kInt64);
  at::Tensor slots = torch::empty({B}, torch::kInt64);
  int64_t* ids_p = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const Sequence& s = *rows[b];
    std::copy(s.tokens.begin() + s.kv_len, s.tokens.begin() + ends[b], ids_p + b * T);
    lens.data_ptr<int64_t>()[b] = ends[b] - s.kv_len;
    slots.data_ptr<int64_t>()[b] = s.slot;
  }
  model::ExtendOptions eo;
  eo.which = which;
  eo.vocab_limit = options_.vocab_limit;
  model::MoeRouting routing;
  routing.record = routing_width_ > 0;
  if (routing.record) eo.routing = &routing;
  at::Tensor logits = policy_->extend(ids, lens, slots, cache_, eo);
  if (routing.record) record_routing(rows, ends, T, routing);
  for (int64_t b = 0; b < B; ++b) {
    if (rows[b]->kv_len == 0) rows[b]->kv_epoch = epoch_;
    rows[b]->kv_len = ends[b];
  }
  stats_.kv_peak_positions = cache_.peak_blocks_in_use() * cache_.block_size();
  return logits;
}

void Engine::record_routing(const std::vector<Sequence*>& rows, const std::vector<int64_t>& ends,
                            int64_t T, model::MoeRouting& routing) {
  // [B * T, layers, k] on the host, as int32.
  at::Tensor all = torch::stack(routing.chosen, 1).to(torch::kCPU, torch::kInt32).contiguous();
  const int32_t* p = all.data_ptr<int32_t>();
  for (size_t b = 0; b < rows.size(); ++b) {
    Sequence& seq = *rows[b];
    // Row b ran positions kv_len .. ends[b] - 1; positions already recorded
    // keep their first run. A gap (positions never recorded) stays a gap,
    // and such a sequence finishes without routing.
    const int64_t start = seq.kv_len;
    const auto have = static_cast<int64_t>(seq.routing.size()) / routing_width_;
    if (have < start) continue;
    for (int64_t pos = have; pos < ends[b]; ++pos) {
      const int32_t* at = p + (static_cast<int64_t>(b) * T + (pos - start)) * routing_width_;
      seq.routing.insert(seq.routing.end(), at, at + routing_width_);
    }
  }
}

void Engine::share_routing(const Sequence& donor, Sequence& seq, int64_t positions) {
  if (routing_width_ == 0) return;
  const auto have = static_cast<int64_t>(seq.routing.size()) / routing_width_;
  const int64_t upto =
      std::min<int64_t>(positions, static_cast<int64_t>(donor.routing.size()) / routing_width_);
  if (have < upto) {
    seq.routing.insert(seq.routing.end(), donor.routing.begin() + have * routing_width_,
                       donor.routing.begin() + upto * routing_width_);
  }
}

void Engine::run_model() {
  last_logits_.clear();
  // Phase 1, context: fill each cache up to score_from - 1, so the next pass
  // starts at the first position whose logits are needed. A fresh cache takes
  // its prompt context (P - 1 positions) from a sibling when one holds it
  // under the current weights, or shares it with a sibling computing it now.
  std::vector<Sequence*> ctx_rows, followers;
  std::vector<int64_t> ctx_ends;
  std::vector<Sequence*> leader_of(options_.num_slots, nullptr);
  for (Sequence* seq : slots_) {
    if (seq == nullptr) continue;
    const int64_t target = seq->score_from - 1;
    if (seq->kv_len >= target) continue;
    const int64_t P1 = seq->prompt_len - 1;
    if (seq->kv_len == 0 && P1 > 0 && target >= P1) {
      Sequence* donor = nullptr;
      bool donor_ready = false;
      for (const auto& sib : seq->group->samples) {
        Sequence* s = sib.get();
        if (s == seq || s->slot < 0 || s->done || s->kv_epoch != epoch_) continue;
        if (s->kv_len >= P1) {
          donor = s;
          donor_ready = true;
          break;
        }
      }
      if (donor == nullptr) {
        // A sibling computing its context in this same call can lend it after.
        for (Sequence* row : ctx_rows) {
          if (row->group == seq->group && row->kv_len == 0) {
            donor = row;
            break;
          }
        }
      }
      if (donor_ready) {
        cache_.copy_prefix(donor->slot, seq->slot, P1);
        share_routing(*donor, *seq, P1);
        seq->kv_len = P1;
        seq->kv_epoch = epoch_;
        ++stats_.shared_prefills;
        if (seq->kv_len < target) followers.push_back(seq);  // rest of its context below
        continue;
      }
      if (donor != nullptr) {
        leader_of[seq->slot] = donor;
        followers.push_back(seq);
        continue;
      }
    }
    ctx_rows.push_back(seq);
    ctx_ends.push_back(target);
  }
  if (!ctx_rows.empty()) {
    for (size_t i = 0; i < ctx_rows.size(); ++i) {
      stats_.context_tokens += ctx_ends[i] - ctx_rows[i]->kv_len;
    }
    extend_rows(ctx_rows, ctx_ends, model::ExtendLogits::kNone);
  }
  // Followers copy the prompt context from their leader, then compute what
  // remains of their own context (a re-prefilled response, if any).
  std::vector<Sequence*> rest_rows;
  std::vector<int64_t> rest_ends;
  for (Sequence* seq : followers) {
    if (Sequence* leader = leader_of[seq->slot]) {
      cache_.copy_prefix(leader->slot, seq->slot, seq->prompt_len - 1);
      share_routing(*leader, *seq, seq->prompt_len - 1);
      seq->kv_len = seq->prompt_len - 1;
      seq->kv_epoch = epoch_;
      ++stats_.shared_prefills;
    }
    if (seq->kv_len < seq->score_from - 1) {
      rest_rows.push_back(seq);
      rest_ends.push_back(seq->score_from - 1);
      stats_.context_tokens += seq->score_from - 1 - seq->kv_len;
    }
  }
  if (!rest_rows.empty()) extend_rows(rest_rows, rest_ends, model::ExtendLogits::kNone);

  // Phase 2: every live sequence runs its remaining tokens. One new token is
  // a plain decode step; more means tokens to score, so all positions' logits.
  std::vector<Sequence*> decode_rows, score_rows;
  std::vector<int64_t> decode_ends, score_ends;
  for (Sequence* seq : slots_) {
    if (seq == nullptr) continue;
    const auto end = static_cast<int64_t>(seq->tokens.size());
    if (end - seq->kv_len == 1) {
      decode_rows.push_back(seq);
      decode_ends.push_back(end);
    } else {
      score_rows.push_back(seq);
      score_ends.push_back(end);
    }
  }
  if (!decode_rows.empty()) {
    at::Tensor logits = extend_rows(decode_rows, decode_ends, model::ExtendLogits::kLast);
    for (size_t b = 0; b < decode_rows.size(); ++b) {
      decode_rows[b]->score_from = decode_ends[b];
      decode_rows[b]->proximal_pass = false;  // nothing of version_ - 1 left to score
      last_logits_.emplace_back(decode_rows[b], logits[b]);
    }
  }
  if (!score_rows.empty()) {
    std::vector<int64_t> starts;
    for (Sequence* seq : score_rows) starts.push_back(seq->kv_len);
    at::Tensor logits = extend_rows(score_rows, score_ends, model::ExtendLogits::kAll);
    for (size_t b = 0; b < score_rows.size(); ++b) {
      const int64_t n = score_ends[b] - starts[b];
      record_scores(*score_rows[b], logits[b].narrow(0, 0, n), starts[b]);
      last_logits_.emplace_back(score_rows[b], logits[b][n - 1]);
    }
  }
}

// `logits` [n, V] are positions start .. start + n - 1 of seq.tokens; the one
// at position p scores token p + 1.
void Engine::record_scores(Sequence& seq, const at::Tensor& logits, int64_t start) {
  const int64_t end = static_cast<int64_t>(seq.tokens.size());
  const int64_t from = seq.score_from;
  if (from < end) {
    const int64_t count = end - from;
    at::Tensor rows = logits.narrow(0, from - 1 - start, count);
    at::Tensor targets =
        torch::tensor(std::vector<int64_t>(seq.tokens.begin() + from, seq.tokens.end()));
    at::Tensor lp = tempered_logprobs(rows, targets, options_.sampling.temperature)
                        .to(torch::kCPU)
                        .contiguous();
    at::Tensor raw;
    if (options_.sampling.record_raw_logprobs) {
      raw = tempered_logprobs(rows, targets, 1.0).to(torch::kCPU).contiguous();
    }
    const float* lp_p = lp.data_ptr<float>();
    Trajectory& t = seq.out;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = from + i - seq.prompt_len;
      if (t.offpolicy_mask[r] && t.token_versions[r] < 0) {
        // A forced token, scored for the first time: the current policy's
        // log-prob, recorded as its behavior value.
        t.behavior_logprobs[r] = lp_p[i];
        if (raw.defined()) t.raw_logprobs[r] = raw.data_ptr<float>()[i];
        t.token_versions[r] = version_;
        seq.own_logprobs[r] = lp_p[i];
        ++stats_.forced_tokens;
      } else if (seq.proximal_pass && t.token_versions[r] == version_ - 1) {
        t.proximal_logprobs[r] = lp_p[i];
        t.proximal_versions[r] = version_;
      }
    }
  }
  seq.proximal_pass = false;
  seq.score_from = end;
}

void Engine::sample_and_retire(double now) {
  // A sequence whose forced prefix ended in a stop token is complete without
  // sampling.
  std::vector<std::pair<Sequence*, at::Tensor>> rows;
  for (auto& [seq, logits] : last_logits_) {
    if (!seq->forced.empty() && seq->response_len() == static_cast<int64_t>(seq->forced.size()) &&
        is_stop(seq->forced.back())) {
      finish(*seq, FinishReason::kStop, now);
    } else {
      rows.emplace_back(seq, logits);
    }
  }
  last_logits_.clear();
  if (rows.empty()) return;

  // Sampled rows first, then greedy baselines: one sampler call for each kind
  // present, joined on the device so the results still come back in one read.
  // A baseline row draws no uniform, so no sample's stream depends on it.
  const int64_t n_sampled = std::stable_partition(rows.begin(), rows.end(),
                                                  [](const auto& r) { return !r.first->greedy; }) -
                            rows.begin();
  const int64_t B = static_cast<int64_t>(rows.size());
  const SamplingOptions& so = options_.sampling;
  std::vector<at::Tensor> token_parts, logprob_parts, own_parts, raw_parts;
  auto draw = [&](int64_t begin, int64_t end, const SamplingOptions& o) {
    if (begin == end) return;
    std::vector<at::Tensor> parts;
    std::vector<double> uniforms;
    for (int64_t b = begin; b < end; ++b) {
      parts.push_back(rows[b].second);
      uniforms.push_back(rows[b].first->greedy ? 0.5 : rows[b].first->rng.uniform());
    }
    at::Tensor logits = torch::stack(parts);
    SampleResult s = sample(logits, torch::tensor(uniforms, torch::kFloat64), o);
    const bool truncated = o.greedy || (o.top_k > 0 && o.top_k < logits.size(1)) || o.top_p < 1.0;
    at::Tensor own = truncated ? tempered_logprobs(logits, s.tokens, o.temperature) : s.logprobs;
    token_parts.push_back(s.tokens.to(torch::kInt64));
    logprob_parts.push_back(s.logprobs.to(torch::kFloat32));
    own_parts.push_back(own.to(torch::kFloat32));
    if (o.record_raw_logprobs) raw_parts.push_back(s.raw_logprobs.to(torch::kFloat32));
  };
  draw(0, n_sampled, so);
  SamplingOptions greedy = so;
  greedy.greedy = true;
  draw(n_sampled, B, greedy);
  auto joined = [](const std::vector<at::Tensor>& p) {
    return p.size() == 1 ? p[0] : torch::cat(p);
  };

  // The step's one read back to the host.
  at::Tensor tokens = joined(token_parts).to(torch::kCPU).contiguous();
  at::Tensor logprobs = joined(logprob_parts).to(torch::kCPU).contiguous();
  at::Tensor own_cpu = joined(own_parts).to(torch::kCPU).contiguous();
  at::Tensor raw;
  if (so.record_raw_logprobs) raw = joined(raw_parts).to(torch::kCPU).contiguous();

  for (int64_t b = 0; b < B; ++b) {
    Sequence& seq = *rows[b].first;
    const int64_t token = tokens.data_ptr<int64_t>()[b];
    Trajectory& t = seq.out;
    seq.tokens.push_back(token);
    t.response_tokens.push_back(token);
    t.behavior_logprobs.push_back(logprobs.data_ptr<float>()[b]);
    if (raw.defined()) t.raw_logprobs.push_back(raw.data_ptr<float>()[b]);
    t.token_versions.push_back(version_);
    t.proximal_logprobs.push_back(kNaN);
    t.proximal_versions.push_back(-1);
    t.offpolicy_mask.push_back(0);
    seq.own_logprobs.push_back(own_cpu.data_ptr<float>()[b]);
    if (t.first_token_s == 0.0) t.first_token_s = now - seq.group->submitted_s;
    ++stats_.sampled_tokens;
    if (seq.greedy) ++stats_.baseline_tokens;

    if (is_stop(token)) {
      finish(seq, FinishReason::kStop, now);
    } else if (seq.response_len() >= options_.max_new_tokens ||
               static_cast<int64_t>(seq.tokens.size()) >= capacity_) {
      finish(seq, FinishReason::kLength, now);
    }
  }
}

void Engine::finish(Sequence& seq, FinishReason reason, double now) {
  Trajectory& t = seq.out;
  t.finish_reason = reason;
  t.finished_s = now - seq.group->submitted_s;
  t.prompt_tokens = seq.group->request.prompt;
  // Tokens of the version held now: their proximal policy is this one if the
  // trainer is still at it (trajectory.h). Not after `keep`, whose logits
  // came partly from a cache of older weights.
  if (!t.stale_kv) {
    for (int64_t r = 0; r < seq.response_len(); ++r) {
      if (t.token_versions[r] == version_ && std::isnan(t.proximal_logprobs[r]) &&
          !std::isnan(seq.own_logprobs[r])) {
        t.proximal_logprobs[r] = seq.own_logprobs[r];
        t.proximal_versions[r] = version_;
      }
    }
  }
  // An aborted sequence may hold forced tokens never scored: drop them, so
  // every per-token field stays complete.
  if (reason == FinishReason::kAborted) {
    int64_t keep = 0;
    while (keep < seq.response_len() && t.token_versions[keep] >= 0) ++keep;
    t.response_tokens.resize(keep);
    t.behavior_logprobs.resize(keep);
    if (!t.raw_logprobs.empty()) t.raw_logprobs.resize(keep);
    t.token_versions.resize(keep);
    t.proximal_logprobs.resize(keep);
    t.proximal_versions.resize(keep);
    t.offpolicy_mask.resize(keep);
  }
  // Routing of every position run, prompt + response - 1 (the last response
  // token is never run); a sequence cut short of that carries none.
  const int64_t positions = seq.prompt_len + static_cast<int64_t>(t.response_tokens.size()) - 1;
  if (routing_width_ > 0 && positions > 0 &&
      static_cast<int64_t>(seq.routing.size()) >= positions * routing_width_) {
    t.routed_experts.assign(seq.routing.begin(), seq.routing.begin() + positions * routing_width_);
    t.routing_layers = static_cast<int32_t>(policy_->config().num_moe_layers());
    t.routing_top_k = static_cast<int32_t>(policy_->config().num_experts_per_tok);
  }
  seq.routing.clear();
  std::set<int64_t> used(t.token_versions.begin(), t.token_versions.end());
  for (int64_t v : t.proximal_versions) {
    if (v >= 0) used.insert(v);
  }
  t.version_digests.clear();
  for (int64_t v : used) t.version_digests.emplace_back(v, digests_.at(v));

  seq.done = true;
  if (seq.slot >= 0) {
    cache_.release(seq.slot);
    slots_[seq.slot] = nullptr;
    seq.slot = -1;
  }
  ++seq.group->finished;
  if (seq.greedy) ++stats_.baseline_sequences;
}

void Engine::abort_all(double now) {
  for (Sequence* seq : slots_) {
    if (seq != nullptr) finish(*seq, FinishReason::kAborted, now);
  }
  for (Sequence* seq : waiting_) {
    begin_response(*seq);
    finish(*seq, FinishReason::kAborted, now);
  }
  waiting_.clear();
}

void Engine::collect_done(std::vector<TrajectoryGroup>& done) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& g = **it;
    if (g.finished < static_cast<int>(g.samples.size())) {
      ++it;
      continue;
    }
    TrajectoryGroup out;
    out.group_id = g.request.group_id;
    for (auto& seq : g.samples) {
      if (seq->greedy) {
        out.baseline = std::move(seq->out);
      } else {
        out.trajectories.push_back(std::move(seq->out));
      }
    }
    done.push_back(std::move(out));
    ++stats_.groups_completed;
    it = groups_.erase(it);
  }
}

}  // namespace relay::rollout
