#include "relay/app/trainer_ranks.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "relay/app/warm_start.h"
#include "relay/comm/dist/trainer_ranks.h"
#include "relay/model/weight_manifest.h"

namespace relay::app {
namespace {

std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

void print_weights_digest(const model::PolicyImpl& policy, int rank) {
  if (policy.parameters().front().numel() == 0) {
    // trainer.sharding: full: this rank held shards only.
    std::printf("trainer rank %d: weights sharded (rank 0 holds them whole)\n", rank);
    std::fflush(stdout);
    return;
  }
  StatusOr<model::WeightManifest> m = model::weight_manifest(policy, 0);
  if (!m.ok()) return;
  std::printf("trainer rank %d: weights digest %016llx\n", rank,
              static_cast<unsigned long long>(m->digest));
  std::fflush(stdout);
}

StatusOr<comm::TrainerRank> trainer_rank(const ExperimentConfig& config) {
  return comm::trainer_rank_from_env(config.trainer.data_parallel.world_size,
                                     config.trainer.data_parallel.rendezvous, process_env);
}

StatusOr<std::shared_ptr<trainer::Collectives>> join_trainer_ranks(const ExperimentConfig& config,
                                                                   const comm::TrainerRank& rank,
                                                                   const std::string& device) {
  if (rank.world_size <= 1) return std::shared_ptr<trainer::Collectives>();
  comm::TrainerGroupOptions o;
  o.rank = rank;
  o.device = device;
  o.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(config.trainer.data_parallel.collective_timeout_s * 1000));
  std::printf("trainer rank %d of %d: joining the group at %s:%d\n", rank.rank, rank.world_size,
              rank.host.c_str(), rank.port);
  std::fflush(stdout);
  return comm::join_trainer_group(o);
}

int run_follower_rank(const RolloutSetup& s, const trainer::TrainerOptions& rl_options,
                      const comm::TrainerRank& rank, std::shared_ptr<trainer::Collectives> group) {
  // Rank 0 decides when the run ends (it drains and checkpoints on SIGTERM,
  // then stops the others); a signal here must not cut a collective short.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  const WarmStart ws{s.config.experiment.warm_start.sft_steps,
                     s.config.experiment.warm_start.sft_lr, s.config.experiment.warm_start.batch};
  comm::FollowerOptions fo;
  fo.bucket_bytes = int64_t{s.config.trainer.data_parallel.allreduce_bucket_mb} << 20;
  fo.options = [&](const std::string& role) -> StatusOr<trainer::TrainerOptions> {
    if (role == "rl") return rl_options;
    if (role == "sft") return warm_start_options(rl_options, ws);
    return InvalidArgumentError(
        absl::StrCat("rank 0 asked for a trainer of unknown role '", role, "'"));
  };
  int64_t steps = 0, failed = 0;
  fo.on_step = [&](const std::string& call, const StatusOr<trainer::StepMetrics>& m) {
    if (call != "save_state") ++steps;
    if (!m.ok()) {
      ++failed;
      std::fprintf(stderr, "trainer rank %d: %s failed as on rank 0: %s\n", rank.rank, call.c_str(),
                   std::string(m.status().message()).c_str());
    }
  };
  const Status st = comm::follow_rank_leader(std::move(group), s.policy, fo);
  if (!st.ok()) {
    std::fprintf(stderr, "error: trainer rank %d: %s\n", rank.rank,
                 std::string(st.message()).c_str());
    return 1;
  }
  std::printf("trainer rank %d: stopped by rank 0 after %lld steps (%lld failed)\n", rank.rank,
              static_cast<long long>(steps), static_cast<long long>(failed));
  print_weights_digest(*s.policy, rank.rank);
  return 0;
}

}  // namespace relay::app
