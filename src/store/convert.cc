#include "relay/store/convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "relay/v1/trajectory.pb.h"

namespace relay::store {
namespace {

v1::FinishReason finish_to_proto(rollout::FinishReason r) {
  switch (r) {
    case rollout::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case rollout::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case rollout::FinishReason::kAborted:
      return v1::FINISH_REASON_ABORTED;
    case rollout::FinishReason::kToolBudget:
      return v1::FINISH_REASON_TOOL_BUDGET;
    case rollout::FinishReason::kEnvDone:
      return v1::FINISH_REASON_ENV_DONE;
    case rollout::FinishReason::kEnvError:
      return v1::FINISH_REASON_ENV_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::InterruptPolicy interrupt_to_proto(rollout::InterruptPolicy p) {
  switch (p) {
    case rollout::InterruptPolicy::kRecompute:
      return v1::INTERRUPT_POLICY_RECOMPUTE;
    case rollout::InterruptPolicy::kKeep:
      return v1::INTERRUPT_POLICY_KEEP;
    case rollout::InterruptPolicy::kFinish:
      return v1::INTERRUPT_POLICY_FINISH;
    case rollout::InterruptPolicy::kRestart:
      return v1::INTERRUPT_POLICY_RESTART;
  }
  return v1::INTERRUPT_POLICY_UNSPECIFIED;
}

template <typename To, typename From>
std::vector<To> vec(const google::protobuf::RepeatedField<From>& in) {
  return std::vector<To>(in.begin(), in.end());
}

}  // namespace

void to_proto(const rollout::Trajectory& t, v1::Trajectory* out) {
  out->Clear();
  out->mutable_prompt_tokens()->Add(t.prompt_tokens.begin(), t.prompt_tokens.end());
  out->mutable_response_tokens()->Add(t.response_tokens.begin(), t.response_tokens.end());
  out->mutable_behavior_logprobs()->Add(t.behavior_logprobs.begin(), t.behavior_logprobs.end());
  out->mutable_raw_logprobs()->Add(t.raw_logprobs.begin(), t.raw_logprobs.end());
  out->mutable_token_versions()->Add(t.token_versions.begin(), t.token_versions.end());
  out->mutable_proximal_logprobs()->Add(t.proximal_logprobs.begin(), t.proximal_logprobs.end());
  out->mutable_proximal_versions()->Add(t.proximal_versions.begin(), t.proximal_versions.end());
  for (uint8_t m : t.offpolicy_mask) out->add_offpolicy_mask(m != 0);
  out->set_finish_reason(finish_to_proto(t.finish_reason));
  out->set_interrupt_policy(interrupt_to_proto(t.interrupt_policy));
  out->set_interruptions(t.interruptions);
  out->set_stale_kv(t.stale_kv);
  out->set_restarts(t.restarts);
  out->set_prefix_ratio(t.prefix_ratio);
  for (const auto& [version, digest] : t.version_digests) {
    v1::VersionDigest* d = out->add_version_digests();
    d->set_version(version);
    d->set_digest(digest);
  }
  out->set_admitted_s(t.admitted_s);
  out->set_first_token_s(t.first_token_s);
  out->set_finished_s(t.finished_s);
  out->set_reward(t.reward);
  for (const auto& [name, value] : t.sub_scores) (*out->mutable_sub_scores())[name] = value;
  out->mutable_routed_experts()->Add(t.routed_experts.begin(), t.routed_experts.end());
  out->set_routing_layers(t.routing_layers);
  out->set_routing_top_k(t.routing_top_k);
  for (uint8_t m : t.env_mask) out->add_env_mask(m != 0);
  for (const rollout::EpisodeTurn& turn : t.turns) {
    v1::EpisodeTurn* o = out->add_turns();
    o->set_model_end(turn.model_end);
    o->set_env_end(turn.env_end);
    o->set_reward(turn.reward);
    o->set_tool_calls(turn.tool_calls);
    o->set_tool_errors(turn.tool_errors);
  }
  out->set_finish_detail(t.finish_detail);
  out->mutable_teacher_logprobs()->Add(t.teacher_logprobs.begin(), t.teacher_logprobs.end());
  out->set_teacher_digest(t.teacher_digest);
}

void to_proto(const rollout::TrajectoryGroup& g, v1::TrajectoryGroup* out) {
  out->Clear();
  out->set_group_id(g.group_id);
  for (const rollout::Trajectory& t : g.trajectories) to_proto(t, out->add_trajectories());
  if (g.baseline) to_proto(*g.baseline, out->mutable_baseline());
}

StatusOr<rollout::Trajectory> from_proto(const v1::Trajectory& in, bool check) {
  rollout::Trajectory t;
  t.prompt_tokens = vec<int64_t>(in.prompt_tokens());
  t.response_tokens = vec<int64_t>(in.response_tokens());
  t.behavior_logprobs = vec<float>(in.behavior_logprobs());
  t.raw_logprobs = vec<float>(in.raw_logprobs());
  t.token_versions = vec<int64_t>(in.token_versions());
  t.proximal_logprobs = vec<float>(in.proximal_logprobs());
  t.proximal_versions = vec<int64_t>(in.proximal_versions());
  t.teacher_logprobs = vec<float>(in.teacher_logprobs());
  t.teacher_digest = in.teacher_digest();
  for (bool m : in.offpolicy_mask()) t.offpolicy_mask.push_back(m ? 1 : 0);
  switch (in.finish_reason()) {
    case v1::FINISH_REASON_STOP:
      t.finish_reason = rollout::FinishReason::kStop;
      break;
    case v1::FINISH_REASON_LENGTH:
      t.finish_reason = rollout::FinishReason::kLength;
      break;
    case v1::FINISH_REASON_ABORTED:
      t.finish_reason = rollout::FinishReason::kAborted;
      break;
    case v1::FINISH_REASON_TOOL_BUDGET:
      t.finish_reason = rollout::FinishReason::kToolBudget;
      break;
    case v1::FINISH_REASON_ENV_DONE:
      t.finish_reason = rollout::FinishReason::kEnvDone;
      break;
    case v1::FINISH_REASON_ENV_ERROR:
      t.finish_reason = rollout::FinishReason::kEnvError;
      break;
    default:
      return InvalidArgumentError(
          absl::StrCat("finish_reason: ", static_cast<int>(in.finish_reason()),
                       " is not stop, length, aborted, tool_budget, env_done or env_error"));
  }
  switch (in.interrupt_policy()) {
    case v1::INTERRUPT_POLICY_RECOMPUTE:
      t.interrupt_policy = rollout::InterruptPolicy::kRecompute;
      break;
    case v1::INTERRUPT_POLICY_KEEP:
      t.interrupt_policy = rollout::InterruptPolicy::kKeep;
      break;
    case v1::INTERRUPT_POLICY_FINISH:
      t.interrupt_policy = rollout::InterruptPolicy::kFinish;
      break;
    case v1::INTERRUPT_POLICY_RESTART:
      t.interrupt_policy = rollout::InterruptPolicy::kRestart;
      break;
    default:
      return InvalidArgumentError(
          absl::StrCat("interrupt_policy: ", static_cast<int>(in.interrupt_policy()),
                       " is not recompute, keep, finish or restart"));
  }
  for (bool m : in.env_mask()) t.env_mask.push_back(m ? 1 : 0);
  for (const v1::EpisodeTurn& turn : in.turns()) {
    t.turns.push_back(
        {turn.model_end(), turn.env_end(), turn.reward(), turn.tool_calls(), turn.tool_errors()});
  }
  t.finish_detail = in.finish_detail();
  t.interruptions = in.interruptions();
  t.stale_kv = in.stale_kv();
  t.restarts = in.restarts();
  t.prefix_ratio = in.prefix_ratio();
  for (const v1::VersionDigest& d : in.version_digests()) {
    t.version_digests.emplace_back(d.version(), d.digest());
  }
  t.admitted_s = in.admitted_s();
  t.first_token_s = in.first_token_s();
  t.finished_s = in.finished_s();
  t.reward = in.reward();
  for (const auto& [name, value] : in.sub_scores()) t.sub_scores[name] = value;
  t.routed_experts = vec<int32_t>(in.routed_experts());
  t.routing_layers = in.routing_layers();
  t.routing_top_k = in.routing_top_k();
  if (check) RELAY_RETURN_IF_ERROR(rollout::check_trajectory(t));
  return t;
}

StatusOr<rollout::TrajectoryGroup> from_proto(const v1::TrajectoryGroup& in, bool check) {
  rollout::TrajectoryGroup g;
  g.group_id = in.group_id();
  for (int i = 0; i < in.trajectories_size(); ++i) {
    StatusOr<rollout::Trajectory> t = from_proto(in.trajectories(i), check);
    if (!t.ok()) {
      return InvalidArgumentError(absl::StrCat("group '", in.group_id(), "' trajectories[", i,
                                               "]: ", std::string(t.status().message())));
    }
    g.trajectories.push_back(*std::move(t));
  }
  if (in.has_baseline()) {
    StatusOr<rollout::Trajectory> t = from_proto(in.baseline(), check);
    if (!t.ok()) {
      return InvalidArgumentError(absl::StrCat("group '", in.group_id(),
                                               "' baseline: ", std::string(t.status().message())));
    }
    g.baseline = *std::move(t);
  }
  return g;
}

}  // namespace relay::store
