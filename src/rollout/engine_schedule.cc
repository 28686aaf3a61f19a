// The engine's scheduling (engine_state.h): groups in, samples admitted to
// slots as the KV budget allows, weight updates between steps, finished
// sequences and groups out.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "relay/rollout/engine.h"
#include "rollout/engine_state.h"

namespace relay::rollout {

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
  // The engine's sampling with the group's own in place.
  SamplingOptions sampling = options_.sampling;
  if (req.sampling.temperature) sampling.temperature = *req.sampling.temperature;
  if (req.sampling.top_k) sampling.top_k = *req.sampling.top_k;
  if (req.sampling.top_p) sampling.top_p = *req.sampling.top_p;
  if (req.sampling.greedy) sampling.greedy = true;
  const int64_t max_new =
      req.sampling.max_new_tokens > 0 ? req.sampling.max_new_tokens : options_.max_new_tokens;
  for (int j = 0; j < req.k; ++j) {
    auto seq = std::make_unique<Sequence>();
    seq->group = group.get();
    seq->rng = SequenceRng(sequence_seed(req.seed, j));
    seq->sampling = sampling;
    seq->max_new_tokens = max_new;
    seq->prompt_len = static_cast<int64_t>(req.prompt.size());
    seq->episode = req.episode;
    seq->sample = j;
    int64_t n =
        prefix_length(ratios[j], static_cast<int64_t>(req.target.size()), options_.prefix.max_len);
    // Leave room for at least one sampled token, and stop at a stop token:
    // a forced stop token ends the response there.
    n = std::min({n, max_new - 1, capacity_ - seq->prompt_len - 1});
    for (int64_t i = 0; i < n; ++i) {
      seq->forced.push_back(req.target[i]);
      if (is_stop(*seq, req.target[i])) break;
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
    seq->sampling = sampling;
    seq->sampling.greedy = true;
    seq->max_new_tokens = max_new;
    seq->prompt_len = static_cast<int64_t>(req.prompt.size());
    seq->out.interrupt_policy = options_.interrupt;
    waiting_.push_back(seq.get());
    group->samples.push_back(std::move(seq));
  }
  groups_.push_back(std::move(group));
}

bool Engine::is_stop(const Sequence& seq, int64_t token) const {
  const std::vector<int64_t>& own = seq.group->request.sampling.stop_tokens;
  return std::find(options_.stop_tokens.begin(), options_.stop_tokens.end(), token) !=
             options_.stop_tokens.end() ||
         std::find(own.begin(), own.end(), token) != own.end();
}

int64_t Engine::response_budget(const Sequence& seq) const {
  return options_.response_budget(seq.episode, seq.max_new_tokens);
}

void Engine::apply_update(PendingUpdate& update) {
  // Every parameter, or with LoRA only the adapters (update_weights checked
  // the names).
  auto params = policy_->named_parameters();
  for (const auto& [name, t] : update.tensors) params[name].copy_(t);
  if (policy_->has_fp32_lm_head()) {
    // The version's own head, before its rounding to the engine's precision.
    auto head = update.tensors.find(policy_->lm_head_parameter_name());
    if (head != update.tensors.end()) policy_->set_fp32_lm_head(head->second);
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
        // Only parked episodes are in flight here: their next turn runs on
        // a cache rebuilt under the new weights.
        reset_cache(*seq);
        break;
      case InterruptPolicy::kRestart:
        reset_cache(*seq);
        if (!seq->parked) {  // a parked episode has no partial turn to drop
          ++seq->out.restarts;
          restart_turn(*seq);
        }
        break;
    }
  }
}

void Engine::reset_cache(Sequence& seq) {
  cache_.reset(seq.slot);
  seq.kv_len = 0;
  seq.kv_epoch = -1;
}

void Engine::restart_turn(Sequence& seq) {
  if (!seq.episode || seq.out.turns.empty()) {
    begin_response(seq);
    seq.routing.clear();  // everything is run again under the new weights
    return;
  }
  // Keep the prompt, the earlier turns and their observations.
  const auto keep = static_cast<size_t>(seq.turn_start - seq.prompt_len);
  Trajectory& t = seq.out;
  seq.tokens.resize(seq.turn_start);
  t.response_tokens.resize(keep);
  t.behavior_logprobs.resize(keep);
  if (!t.raw_logprobs.empty()) t.raw_logprobs.resize(keep);
  t.token_versions.resize(keep);
  t.proximal_logprobs.resize(keep);
  t.proximal_versions.resize(keep);
  t.offpolicy_mask.resize(keep);
  t.env_mask.resize(keep);
  seq.own_logprobs.resize(keep);
  if (routing_width_ > 0) {
    seq.routing.resize(std::min<size_t>(seq.routing.size(), seq.turn_start * routing_width_));
  }
  seq.score_from = static_cast<int64_t>(seq.tokens.size());
  seq.proximal_pass = false;
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
  t.env_mask.assign(seq.episode ? n : 0, 0);
  t.turns.clear();
  seq.turn_start = seq.prompt_len;
  seq.parked = false;
  seq.own_logprobs.assign(n, kNaN);
  seq.score_from = seq.prompt_len;  // forced tokens are scored; else only the next-token logits
  if (n == 0) seq.score_from = static_cast<int64_t>(seq.tokens.size());
  seq.proximal_pass = false;
}

int64_t Engine::reserved_positions(const Sequence& seq) const {
  return std::min(capacity_, seq.prompt_len + response_budget(seq));
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
  // Samples left waiting have no slot or no KV room until a sequence leaves.
  admission_blocked_ = !waiting_.empty();
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
  // A sequence ended from outside (abort, end_sample) may hold forced tokens
  // never scored: drop them, so every per-token field stays complete. A
  // sequence that ended by itself has scored them all, and keeps everything.
  {
    int64_t keep = 0;
    while (keep < seq.response_len() && t.token_versions[keep] >= 0) ++keep;
    t.response_tokens.resize(keep);
    t.behavior_logprobs.resize(keep);
    if (!t.raw_logprobs.empty()) t.raw_logprobs.resize(keep);
    t.token_versions.resize(keep);
    t.proximal_logprobs.resize(keep);
    t.proximal_versions.resize(keep);
    t.offpolicy_mask.resize(keep);
    if (seq.episode) t.env_mask.resize(keep);
  }
  // An episode's last turn ends where the response does (cut short by a
  // limit, or aborted mid-turn: no observation follows it).
  const int64_t R = static_cast<int64_t>(t.response_tokens.size());
  if (seq.episode && (t.turns.empty() || t.turns.back().env_end < R)) {
    t.turns.push_back({R, R, std::numeric_limits<double>::quiet_NaN()});
  }
  seq.parked = false;
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

void Engine::end_turn(Sequence& seq, StepState& s) {
  Trajectory& t = seq.out;
  const int64_t R = seq.response_len();
  t.turns.push_back({R, R, std::numeric_limits<double>::quiet_NaN()});
  seq.parked = true;
  ++stats_.turns_ended;
  TurnEnd end;
  end.group_id = seq.group->request.group_id;
  end.sample = seq.sample;
  end.turn = static_cast<int>(t.turns.size()) - 1;
  end.context.assign(seq.tokens.begin(), seq.tokens.begin() + seq.turn_start);
  end.tokens.assign(seq.tokens.begin() + seq.turn_start, seq.tokens.end());
  end.version = version_;
  s.turn_ends.push_back(std::move(end));
}

void Engine::apply_reply(PendingReply& reply, double now) {
  Sequence* seq = nullptr;
  for (const auto& g : groups_) {
    if (g->request.group_id == reply.group_id &&
        reply.sample < static_cast<int>(g->samples.size())) {
      seq = g->samples[reply.sample].get();
    }
  }
  if (seq == nullptr || !seq->parked || seq->done) return;  // aborted meanwhile
  Trajectory& t = seq->out;
  TurnReply& r = reply.reply;
  t.turns.back().reward = r.reward;
  t.turns.back().tool_calls = r.tool_calls;
  t.turns.back().tool_errors = r.tool_errors;
  if (r.end) {
    t.finish_detail = std::move(r.detail);
    finish(*seq, *r.end, now);
    return;
  }
  // The environment asks for another turn.
  if (static_cast<int64_t>(t.turns.size()) >= options_.episode.max_turns) {
    finish(*seq, FinishReason::kToolBudget, now);
    return;
  }
  // Room for the observation and at least one model token after it.
  const auto n = static_cast<int64_t>(r.observation.size());
  if (seq->response_len() + n + 1 > response_budget(*seq) ||
      static_cast<int64_t>(seq->tokens.size()) + n + 1 > capacity_) {
    finish(*seq, FinishReason::kLength, now);
    return;
  }
  const int64_t old_size = static_cast<int64_t>(seq->tokens.size());
  for (int64_t token : r.observation) {
    seq->tokens.push_back(token);
    t.response_tokens.push_back(token);
    t.behavior_logprobs.push_back(kNaN);
    if (options_.sampling.record_raw_logprobs) t.raw_logprobs.push_back(kNaN);
    t.token_versions.push_back(version_);
    t.proximal_logprobs.push_back(kNaN);
    t.proximal_versions.push_back(-1);
    t.offpolicy_mask.push_back(0);
    t.env_mask.push_back(1);
    seq->own_logprobs.push_back(kNaN);
  }
  stats_.env_tokens += n;
  t.turns.back().env_end = seq->response_len();
  seq->turn_start = static_cast<int64_t>(seq->tokens.size());
  seq->parked = false;
  // The observation is context: cached up to its last token, which is run
  // by the decode call that samples the next turn's first token. A pending
  // proximal pass (an update landed while parked) starts earlier and stays.
  if (!seq->proximal_pass && seq->score_from >= old_size - 1) {
    seq->score_from = static_cast<int64_t>(seq->tokens.size());
  }
}

void Engine::apply_end(const PendingEnd& end, double now) {
  for (const auto& g : groups_) {
    if (g->request.group_id != end.group_id) continue;
    for (auto& seq : g->samples) {
      if (seq->done || (end.sample >= 0 && seq->sample != end.sample) ||
          (end.sample >= 0 && seq->greedy)) {
        continue;
      }
      if (seq->slot < 0) {  // still waiting for a slot
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq.get()));
        begin_response(*seq);
      }
      finish(*seq, end.reason, now);
    }
    return;
  }
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
