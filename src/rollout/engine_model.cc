// The engine's model pass and sampling (engine_state.h): caches filled and
// extended in batched calls, tokens scored, and one token drawn for every
// live sequence.

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "relay/rollout/engine.h"
#include "rollout/engine_state.h"

namespace relay::rollout {

// Extends each row's cache with tokens[kv_len : ends[b]) in one batched call.
at::Tensor Engine::extend_rows(const std::vector<Sequence*>& rows, const std::vector<int64_t>& ends,
                               model::ExtendLogits which) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 0, shortest = std::numeric_limits<int64_t>::max();
  for (int64_t b = 0; b < B; ++b) {
    T = std::max(T, ends[b] - rows[b]->kv_len);
    shortest = std::min(shortest, ends[b] - rows[b]->kv_len);
  }
  at::Tensor logits;
  // A decode step (one new position a row): in fixed shapes when
  // rollout.decode_graphs took them and the step fits their buckets.
  if (graphs_ && T == 1 && shortest == 1 && which == model::ExtendLogits::kLast &&
      routing_width_ == 0) {
    logits = decode_in_fixed_shapes(rows);
  }
  if (!logits.defined()) {
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
    logits = policy_->extend(ids, lens, slots, cache_, eo);
    if (routing.record) record_routing(rows, ends, T, routing);
  }
  for (int64_t b = 0; b < B; ++b) {
    if (rows[b]->kv_len == 0) rows[b]->kv_epoch = epoch_;
    rows[b]->kv_len = ends[b];
  }
  stats_.kv_peak_positions = cache_.peak_blocks_in_use() * cache_.block_size();
  return logits;
}

at::Tensor Engine::decode_in_fixed_shapes(const std::vector<Sequence*>& rows) {
  std::vector<int64_t> ids, slots;
  ids.reserve(rows.size());
  slots.reserve(rows.size());
  for (const Sequence* row : rows) {
    ids.push_back(row->tokens[row->kv_len]);
    slots.push_back(row->slot);
  }
  at::Tensor logits = graphs_->step(*policy_, cache_, ids, slots, options_.vocab_limit);
  stats_.graph_steps = graphs_->stats().steps;
  stats_.graph_replays = graphs_->stats().replays;
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

void Engine::run_model(StepState& s) {
  // Phase 1, context: fill each cache up to score_from - 1, so the next pass
  // starts at the first position whose logits are needed. A fresh cache takes
  // its prompt context (P - 1 positions) from a sibling when one holds it
  // under the current weights, or shares it with a sibling computing it now.
  ContextPass ctx;
  ctx.leader_of.assign(static_cast<size_t>(options_.num_slots), nullptr);
  for (Sequence* seq : slots_) {
    if (seq != nullptr && !seq->parked) place_context(*seq, ctx);
  }
  run_context(ctx);
  // Phase 2: every live sequence runs its remaining tokens.
  run_new_tokens(s);
}

void Engine::place_context(Sequence& seq, ContextPass& ctx) {
  const int64_t target = seq.score_from - 1;
  if (seq.kv_len >= target) return;
  const int64_t P1 = seq.prompt_len - 1;
  if (seq.kv_len == 0 && P1 > 0 && target >= P1) {
    if (const Sequence* donor = ready_donor(seq)) {
      copy_prompt_context(*donor, seq);
      if (seq.kv_len < target) ctx.followers.push_back(&seq);  // rest of its context below
      return;
    }
    // A sibling computing its context in this same call can lend it after.
    for (Sequence* row : ctx.rows) {
      if (row->group == seq.group && row->kv_len == 0) {
        ctx.leader_of[seq.slot] = row;
        ctx.followers.push_back(&seq);
        return;
      }
    }
  }
  ctx.rows.push_back(&seq);
  ctx.ends.push_back(target);
}

Engine::Sequence* Engine::ready_donor(const Sequence& seq) const {
  for (const auto& sib : seq.group->samples) {
    Sequence* s = sib.get();
    if (s == &seq || s->slot < 0 || s->done || s->kv_epoch != epoch_) continue;
    if (s->kv_len >= seq.prompt_len - 1) return s;
  }
  return nullptr;
}

void Engine::copy_prompt_context(const Sequence& from, Sequence& seq) {
  const int64_t P1 = seq.prompt_len - 1;
  cache_.copy_prefix(from.slot, seq.slot, P1);
  share_routing(from, seq, P1);
  seq.kv_len = P1;
  seq.kv_epoch = epoch_;
  ++stats_.shared_prefills;
}

void Engine::run_context(ContextPass& ctx) {
  if (!ctx.rows.empty()) {
    for (size_t i = 0; i < ctx.rows.size(); ++i) {
      stats_.context_tokens += ctx.ends[i] - ctx.rows[i]->kv_len;
    }
    extend_rows(ctx.rows, ctx.ends, model::ExtendLogits::kNone);
  }
  // Followers copy the prompt context from their leader, then compute what
  // remains of their own context (a re-prefilled response, if any).
  std::vector<Sequence*> rest_rows;
  std::vector<int64_t> rest_ends;
  for (Sequence* seq : ctx.followers) {
    if (const Sequence* leader = ctx.leader_of[seq->slot]) copy_prompt_context(*leader, *seq);
    if (seq->kv_len < seq->score_from - 1) {
      rest_rows.push_back(seq);
      rest_ends.push_back(seq->score_from - 1);
      stats_.context_tokens += seq->score_from - 1 - seq->kv_len;
    }
  }
  if (!rest_rows.empty()) extend_rows(rest_rows, rest_ends, model::ExtendLogits::kNone);
}

// One new token is a plain decode step; more means tokens to score, so all
// positions' logits.
void Engine::run_new_tokens(StepState& s) {
  std::vector<Sequence*> decode_rows, score_rows;
  std::vector<int64_t> decode_ends, score_ends;
  for (Sequence* seq : slots_) {
    if (seq == nullptr || seq->parked) continue;  // waiting for its environment
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
      s.next_logits.emplace_back(decode_rows[b], logits[b]);
    }
  }
  if (!score_rows.empty()) {
    std::vector<int64_t> starts;
    for (Sequence* seq : score_rows) starts.push_back(seq->kv_len);
    at::Tensor logits = extend_rows(score_rows, score_ends, model::ExtendLogits::kAll);
    for (size_t b = 0; b < score_rows.size(); ++b) {
      const int64_t n = score_ends[b] - starts[b];
      record_scores(*score_rows[b], logits[b].narrow(0, 0, n), starts[b]);
      s.next_logits.emplace_back(score_rows[b], logits[b][n - 1]);
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
    at::Tensor lp =
        tempered_logprobs(rows, targets, seq.sampling.temperature).to(torch::kCPU).contiguous();
    at::Tensor raw;
    if (options_.sampling.record_raw_logprobs) {
      raw = tempered_logprobs(rows, targets, 1.0).to(torch::kCPU).contiguous();
    }
    const float* lp_p = lp.data_ptr<float>();
    Trajectory& t = seq.out;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = from + i - seq.prompt_len;
      if (t.is_env_token(static_cast<size_t>(r))) continue;  // context, never the model's
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

namespace {

// One sampler call's results, on the device.
struct Draws {
  std::vector<at::Tensor> tokens, logprobs, own, raw;
};

// The rows as one [n, V] tensor: a view when they are consecutive rows of
// one matrix (the LM head's output in slot order, the usual case), else a
// stacked copy (at Qwen's vocabulary and batch 64, 39 MB a step).
at::Tensor as_matrix(const std::vector<at::Tensor>& rows) {
  const at::Tensor& first = rows.front();
  if (first.dim() != 1 || first.stride(0) != 1) return torch::stack(rows);
  const int64_t V = first.size(0);
  for (size_t i = 1; i < rows.size(); ++i) {
    const at::Tensor& r = rows[i];
    const bool next_row =
        r.dim() == 1 && r.size(0) == V && r.stride(0) == 1 &&
        r.scalar_type() == first.scalar_type() && r.device() == first.device() &&
        r.storage().unsafeGetStorageImpl() == first.storage().unsafeGetStorageImpl() &&
        r.storage_offset() == first.storage_offset() + static_cast<int64_t>(i) * V;
    if (!next_row) return torch::stack(rows);
  }
  return first.as_strided({static_cast<int64_t>(rows.size()), V}, {V, 1});
}

// Samples one token from each of `logits` with `uniforms`, into `out`. `own`
// is the token's log-prob at the temperature without truncation.
void draw(const std::vector<at::Tensor>& logits_rows, const std::vector<double>& uniforms,
          const SamplingOptions& o, Draws& out) {
  if (logits_rows.empty()) return;
  const at::Tensor logits = as_matrix(logits_rows);
  SampleResult s = sample(logits, torch::tensor(uniforms, torch::kFloat64), o);
  // sample() records truncated log-probs, or under greedy the log-prob at
  // temperature 1: then the temperature's own is computed here.
  const bool own_differs = o.greedy || truncates(o, logits.size(1));
  at::Tensor own = own_differs ? tempered_logprobs(logits, s.tokens, o.temperature) : s.logprobs;
  out.tokens.push_back(s.tokens.to(torch::kInt64));
  out.logprobs.push_back(s.logprobs.to(torch::kFloat32));
  out.own.push_back(own.to(torch::kFloat32));
  if (o.record_raw_logprobs) out.raw.push_back(s.raw_logprobs.to(torch::kFloat32));
}

bool same_sampling(const SamplingOptions& a, const SamplingOptions& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
         a.greedy == b.greedy && a.record_raw_logprobs == b.record_raw_logprobs;
}

// The parts of all sampler calls, joined on the device and read back.
at::Tensor to_host(const std::vector<at::Tensor>& parts) {
  return (parts.size() == 1 ? parts[0] : torch::cat(parts)).to(torch::kCPU).contiguous();
}

}  // namespace

void Engine::sample_and_retire(StepState& s) {
  // A sequence whose forced prefix ended in a stop token is complete without
  // sampling (an episode's first turn is).
  std::vector<std::pair<Sequence*, at::Tensor>> rows;
  for (auto& [seq, logits] : s.next_logits) {
    if (!seq->forced.empty() && seq->response_len() == static_cast<int64_t>(seq->forced.size()) &&
        is_stop(*seq, seq->forced.back())) {
      if (seq->episode) {
        end_turn(*seq, s);
      } else {
        finish(*seq, FinishReason::kStop, s.now);
      }
    } else {
      rows.emplace_back(seq, logits);
    }
  }
  if (rows.empty()) return;

  // One sampler call per distinct sampling option set (the engine's, a
  // group's own, argmax for greedy baselines), in order of first appearance,
  // joined on the device so the results still come back in one read. A
  // baseline row draws no uniform, so no sample's stream depends on it.
  std::vector<const SamplingOptions*> kinds;
  std::vector<size_t> kind_of(rows.size());
  for (size_t b = 0; b < rows.size(); ++b) {
    const SamplingOptions& o = rows[b].first->sampling;
    size_t k = 0;
    while (k < kinds.size() && !same_sampling(*kinds[k], o)) ++k;
    if (k == kinds.size()) kinds.push_back(&o);
    kind_of[b] = k;
  }
  std::vector<std::pair<Sequence*, at::Tensor>> ordered;
  ordered.reserve(rows.size());
  Draws d;
  for (size_t k = 0; k < kinds.size(); ++k) {
    std::vector<at::Tensor> logits;
    std::vector<double> uniforms;
    for (size_t b = 0; b < rows.size(); ++b) {
      if (kind_of[b] != k) continue;
      Sequence* seq = rows[b].first;
      logits.push_back(rows[b].second);
      uniforms.push_back(seq->greedy ? 0.5 : seq->rng.uniform());
      ordered.push_back(std::move(rows[b]));
    }
    draw(logits, uniforms, *kinds[k], d);
  }
  rows = std::move(ordered);
  const SamplingOptions& so = options_.sampling;

  // The step's one read back to the host.
  const at::Tensor tokens = to_host(d.tokens), logprobs = to_host(d.logprobs);
  const at::Tensor own = to_host(d.own);
  const at::Tensor raw = so.record_raw_logprobs ? to_host(d.raw) : at::Tensor();
  for (size_t b = 0; b < rows.size(); ++b) {
    append_token(*rows[b].first, static_cast<int64_t>(b), tokens, logprobs, own, raw, s);
  }
}

void Engine::append_token(Sequence& seq, int64_t b, const at::Tensor& tokens,
                          const at::Tensor& logprobs, const at::Tensor& own, const at::Tensor& raw,
                          StepState& s) {
  const double now = s.now;
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
  if (seq.episode) t.env_mask.push_back(0);
  seq.own_logprobs.push_back(own.data_ptr<float>()[b]);
  if (t.first_token_s == 0.0) t.first_token_s = now - seq.group->submitted_s;
  ++stats_.sampled_tokens;
  if (seq.greedy) ++stats_.baseline_tokens;
  if (seq.group->request.stream_tokens && !seq.greedy) {
    s.sampled.push_back(
        {seq.group->request.group_id, seq.sample, token, t.behavior_logprobs.back(), version_});
  }

  if (is_stop(seq, token)) {
    if (seq.episode) {
      end_turn(seq, s);  // the environment answers; the budget is checked then
    } else {
      finish(seq, FinishReason::kStop, now);
    }
  } else if (seq.turn_len() >= seq.max_new_tokens || seq.response_len() >= response_budget(seq) ||
             static_cast<int64_t>(seq.tokens.size()) >= capacity_) {
    finish(seq, FinishReason::kLength, now);
  }
}

}  // namespace relay::rollout
