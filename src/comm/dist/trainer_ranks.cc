#include "relay/comm/dist/trainer_ranks.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/model/core_share.h"
#include "relay/model/lora.h"
#include "relay/store/convert.h"
#include "relay/v1/trainer_ranks.pb.h"

namespace relay::comm {
namespace {

// The store key rank 0 counts its commands under.
constexpr char kCommands[] = "rank/commands";
// How often a waiting follower looks at the counter: small against a step,
// cheap for the store. A poll rather than TCPStore::wait, which has a
// deadline (rank 0 may wait minutes for rollouts) and leaves its connection
// out of step when that passes (weight_sync.h, "Waiting"); a poll also
// notices at once that rank 0 and its store are gone.
constexpr auto kPoll = std::chrono::milliseconds(5);

// Rank 0's weights into every rank's, parameter by parameter.
Status broadcast_weights(trainer::Collectives& group, const torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    at::Tensor t = item.value().detach();
    Status st = group.broadcast(t, 0);
    if (!st.ok()) {
      return Status(st.code(), absl::StrCat("weights (", item.key(), "): ", st.message()));
    }
  }
  return OkStatus();
}

}  // namespace

trainer::DataParallel RankLeader::data_parallel(int64_t bucket_bytes) {
  trainer::DataParallel dp;
  dp.group = group_;
  dp.bucket_bytes = bucket_bytes;
  dp.lead = [this](const std::string& call,
                   const std::vector<rollout::TrajectoryGroup>& groups) -> Status {
    if (stopped_) {
      return FailedPreconditionError(absl::StrCat(call, ": the other trainer ranks were stopped"));
    }
    v1::RankCommand c;
    c.set_kind(call == "sft_step"     ? v1::RankCommand::SFT_STEP
               : call == "save_state" ? v1::RankCommand::SAVE_STATE
                                      : v1::RankCommand::STEP);
    for (const rollout::TrajectoryGroup& g : groups) store::to_proto(g, c.add_groups());
    return announce(c.SerializeAsString());
  };
  return dp;
}

Status RankLeader::start(const std::string& role, const model::PolicyImpl& policy, int64_t version,
                         const model::Policy& reference, const std::string& trainer_state,
                         const model::ValueModel& critic) {
  v1::RankCommand c;
  c.set_kind(v1::RankCommand::START);
  c.set_role(role);
  c.set_version(version);
  c.set_has_reference(static_cast<bool>(reference));
  c.set_trainer_state(trainer_state);
  c.set_has_critic(static_cast<bool>(critic));
  RELAY_RETURN_IF_ERROR(announce(c.SerializeAsString()));
  RELAY_RETURN_IF_ERROR(broadcast_weights(*group_, policy));
  if (reference) RELAY_RETURN_IF_ERROR(broadcast_weights(*group_, *reference));
  if (critic) RELAY_RETURN_IF_ERROR(broadcast_weights(*group_, *critic));
  return OkStatus();
}

Status RankLeader::stop() {
  if (stopped_) return OkStatus();
  v1::RankCommand c;
  c.set_kind(v1::RankCommand::STOP);
  stopped_ = true;
  return announce(c.SerializeAsString());
}

Status RankLeader::announce(const std::string& command) {
  RELAY_RETURN_IF_ERROR(group_->add_counter(kCommands, 1).status());
  std::string bytes = command;
  return trainer::broadcast_bytes(*group_, bytes, 0);
}

Status follow_rank_leader(std::shared_ptr<trainer::Collectives> group, model::Policy policy,
                          const FollowerOptions& options) {
  trainer::DataParallel dp;
  dp.group = group;
  dp.bucket_bytes = options.bucket_bytes;
  std::unique_ptr<trainer::Trainer> trainer;
  int64_t done = 0;  // commands carried out
  while (true) {
    StatusOr<int64_t> announced = group->add_counter(kCommands, 0);
    if (!announced.ok()) {
      return Status(announced.status().code(),
                    absl::StrCat("rank 0 is gone (", announced.status().message(), ")"));
    }
    if (*announced <= done) {
      // Nothing to train until rank 0 has its batch: the workers on this
      // machine may take its cores meanwhile (model/core_share.h).
      model::cores_busy(false);
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    model::cores_busy(true);
    std::string bytes;
    RELAY_RETURN_IF_ERROR(trainer::broadcast_bytes(*group, bytes, 0));
    ++done;
    v1::RankCommand c;
    if (!c.ParseFromString(bytes)) {
      return InternalError(absl::StrCat("rank 0's command ", done, " does not parse"));
    }
    switch (c.kind()) {
      case v1::RankCommand::STOP:
        return OkStatus();
      case v1::RankCommand::START: {
        trainer.reset();
        if (policy->parameters().front().numel() == 0) {
          // A fully sharded trainer (trainer.sharding: full) left this
          // module holding nothing; a new one of its architecture, device
          // and dtype receives rank 0's weights.
          const at::Tensor like = policy->parameters().front();
          model::Policy whole(policy->config());
          whole->to(like.device(), like.scalar_type());
          policy = whole;
        }
        RELAY_RETURN_IF_ERROR(broadcast_weights(*group, *policy));
        model::Policy reference{nullptr};
        if (c.has_reference()) {
          // Rank 0's reference has the model's architecture, without
          // adapters (a LoRA policy's own reference is its base, unsent).
          reference = model::has_lora(*policy) ? model::clone_policy(*model::base_policy(*policy))
                                               : model::clone_policy(*policy);
          RELAY_RETURN_IF_ERROR(broadcast_weights(*group, *reference));
        }
        model::ValueModel critic{nullptr};
        if (c.has_critic()) {
          // Of the policy's architecture, device and dtype; rank 0's values.
          critic = model::value_model_from_policy(*policy, 0);
          RELAY_RETURN_IF_ERROR(broadcast_weights(*group, *critic));
        }
        RELAY_ASSIGN_OR_RETURN(trainer::TrainerOptions to, options.options(c.role()));
        RELAY_ASSIGN_OR_RETURN(trainer, trainer::Trainer::create(policy, std::move(to), c.version(),
                                                                 reference, dp, critic));
        if (!c.trainer_state().empty()) {
          RELAY_RETURN_IF_ERROR(
              trainer->restore_state(c.trainer_state(), "rank 0's trainer state"));
        }
        break;
      }
      case v1::RankCommand::STEP:
      case v1::RankCommand::SFT_STEP: {
        if (!trainer) {
          return FailedPreconditionError(
              absl::StrCat("rank 0's command ", done, " is a step before any start"));
        }
        std::vector<rollout::TrajectoryGroup> groups;
        groups.reserve(c.groups_size());
        for (const v1::TrajectoryGroup& g : c.groups()) {
          RELAY_ASSIGN_OR_RETURN(rollout::TrajectoryGroup tg, store::from_proto(g, false));
          groups.push_back(std::move(tg));
        }
        const bool sft = c.kind() == v1::RankCommand::SFT_STEP;
        StatusOr<trainer::StepMetrics> m = sft ? trainer->sft_step(groups) : trainer->step(groups);
        if (options.on_step) options.on_step(sft ? "sft_step" : "step", m);
        break;
      }
      case v1::RankCommand::SAVE_STATE: {
        if (!trainer) {
          return FailedPreconditionError(
              absl::StrCat("rank 0's command ", done, " saves the state before any start"));
        }
        // This rank's part goes to rank 0; what stays here is nothing.
        StatusOr<std::string> saved = trainer->save_state();
        if (!saved.ok() && options.on_step) options.on_step("save_state", saved.status());
        break;
      }
      default:
        return InternalError(absl::StrCat("rank 0's command ", done, " has unknown kind ",
                                          static_cast<int>(c.kind())));
    }
  }
}

}  // namespace relay::comm
