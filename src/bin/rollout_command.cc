// relay rollout CONFIG: samples rollout.n responses for each of a range of
// task prompts with the rollout engine, scores them with the task's
// verifier, and writes the groups as JSONL and/or appends them to a rollout
// store: the trainer's input, made by hand.

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/app/setup.h"
#include "relay/common/file_io.h"
#include "relay/rollout/engine.h"
#include "relay/rollout/task.h"
#include "relay/store/rollout_store.h"
#include "relay/store/trajectory_json.h"

namespace relay::cli {
namespace {

struct RolloutArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string model_dir;  // default: model.path
  int64_t prompts = 8;    // groups to sample: task prompts [start, start + prompts)
  int64_t start = 0;
  std::string out;    // JSONL, one trajectory group per line; empty = no file
  std::string store;  // rollout store directory to append the groups to; empty = none
};

using store::nullable_floats;

nlohmann::json trajectory_json(const rollout::Trajectory& t, const std::string& text,
                               const rollout::Score& score, const std::string& verifier_error) {
  nlohmann::json digests = nlohmann::json::array();
  for (const auto& [v, d] : t.version_digests) digests.push_back({v, d});
  nlohmann::json j = {
      {"response", text},
      {"response_tokens", t.response_tokens},
      {"behavior_logprobs", nullable_floats(t.behavior_logprobs)},
      {"token_versions", t.token_versions},
      {"proximal_logprobs", nullable_floats(t.proximal_logprobs)},
      {"proximal_versions", t.proximal_versions},
      {"offpolicy_mask", t.offpolicy_mask},
      {"finish_reason", rollout::finish_reason_name(t.finish_reason)},
      {"interrupt_policy", rollout::kInterruptPolicyNames.name(t.interrupt_policy)},
      {"interruptions", t.interruptions},
      {"prefix_ratio", t.prefix_ratio},
      {"version_digests", digests},
      {"reward", score.reward},
      {"sub_scores", score.sub_scores},
      {"seconds",
       {{"admitted", t.admitted_s}, {"first_token", t.first_token_s}, {"finished", t.finished_s}}}};
  if (!t.raw_logprobs.empty()) j["raw_logprobs"] = nullable_floats(t.raw_logprobs);
  if (!t.teacher_logprobs.empty()) {
    j["teacher_logprobs"] = nullable_floats(t.teacher_logprobs);
    j["teacher_digest"] = t.teacher_digest;
  }
  if (!verifier_error.empty()) j["verifier_error"] = verifier_error;
  if (!t.turns.empty()) {
    // An episode: `response` is the answer (the last model turn); the turns
    // say which tokens are the environment's.
    j["turns"] = store::episode_turns_json(t.turns);
    j["env_mask"] = t.env_mask;
    if (!t.finish_detail.empty()) j["finish_detail"] = t.finish_detail;
  }
  return j;
}

// What one `relay rollout` sampled, and how long the engine took.
struct Sampled {
  std::unique_ptr<rollout::Engine> engine;
  std::map<std::string, rollout::TaskPrompt> prompts;  // by group id
  std::vector<rollout::TrajectoryGroup> groups;
  double seconds = 0;
  std::optional<rollout::TeacherStats> teacher;  // trainer.distill's scoring, when on
};

// Task prompts [start, start + prompts) through one engine at version 0.
StatusOr<Sampled> sample(app::RolloutSetup& s, const RolloutArgs& args) {
  // Trajectories name the weights that sampled them by their manifest digest.
  RELAY_ASSIGN_OR_RETURN(uint64_t digest, app::weights_digest(*s.policy));
  Sampled out;
  RELAY_ASSIGN_OR_RETURN(out.engine,
                         rollout::Engine::create(s.policy, s.engine, /*version=*/0, digest));
  // task.environment answers episode turns while the engine runs.
  std::unique_ptr<rollout::EpisodeDriver> episodes = app::episode_driver(s, *out.engine);
  for (int64_t i = args.start; i < args.start + args.prompts; ++i) {
    RELAY_ASSIGN_OR_RETURN(rollout::TaskPrompt p, s.task->prompt(i));
    RELAY_ASSIGN_OR_RETURN(
        rollout::PromptGroup g,
        app::prompt_group(s, p, p.id, rollout::sequence_seed(s.config.run.seed, i)));
    if (episodes) episodes->begin_group(p.id, app::episode_start(p));
    RELAY_RETURN_IF_ERROR(out.engine->submit(std::move(g)));
    out.prompts.emplace(p.id, std::move(p));
  }
  const auto t0 = std::chrono::steady_clock::now();
  RELAY_ASSIGN_OR_RETURN(out.groups, out.engine->run());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // trainer.distill: the teacher scores the samples as a worker's would.
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<rollout::Teacher> teacher, app::load_teacher(s));
  if (teacher) {
    RELAY_RETURN_IF_ERROR(teacher->score(out.groups));
    out.teacher = teacher->stats();
  }
  return out;
}

// The scored groups as JSONL, and the totals the summary line prints.
struct Scored {
  std::string lines;
  double reward_sum = 0;
  int64_t trajectories = 0, tokens = 0;
};

StatusOr<Scored> score_all(const app::RolloutSetup& s, rollout::SafeVerifier& verifier,
                           Sampled& sampled) {
  Scored out;
  for (rollout::TrajectoryGroup& g : sampled.groups) {
    const rollout::TaskPrompt& p = sampled.prompts.at(g.group_id);
    nlohmann::json line = {{"group_id", g.group_id},
                           {"prompt", p.prompt},
                           {"reference", p.reference},
                           {"prompt_tokens", g.trajectories.at(0).prompt_tokens}};
    nlohmann::json list = nlohmann::json::array();
    RELAY_RETURN_IF_ERROR(
        app::score_group(s, verifier, p, g,
                         [&](int64_t index, const rollout::Trajectory& t, const std::string& text,
                             const rollout::Score& score, const std::string& error) {
                           if (index < 0) {
                             line["baseline"] = trajectory_json(t, text, score, error);
                             return;
                           }
                           out.reward_sum += score.reward;
                           ++out.trajectories;
                           out.tokens += static_cast<int64_t>(t.response_tokens.size());
                           list.push_back(trajectory_json(t, text, score, error));
                         }));
    line["trajectories"] = std::move(list);
    // A byte-level BPE response can end inside a UTF-8 sequence (cut at
    // max_new_tokens) or sample bytes that form none: JSON shows those bytes
    // as U+FFFD rather than failing; response_tokens keep the exact ids.
    absl::StrAppend(&out.lines, line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "\n");
  }
  return out;
}

Status append_to_store(const std::string& path,
                       const std::vector<rollout::TrajectoryGroup>& groups) {
  store::StoreOptions so;
  so.path = path;
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<store::RolloutStore> db, store::RolloutStore::open(so));
  for (const rollout::TrajectoryGroup& g : groups) {
    RELAY_RETURN_IF_ERROR(db->append(g, /*trainer_version=*/0).status());
  }
  std::printf("appended %lld groups to %s\n", static_cast<long long>(groups.size()), path.c_str());
  return OkStatus();
}

int rollout(const RolloutArgs& args) {
  StatusOr<app::RolloutSetup> setup = app::setup_rollout(
      {args.config_file, args.overrides, args.model_dir, args.prompts, args.start});
  if (!setup.ok()) return fail("rollout", setup.status());
  app::RolloutSetup& s = *setup;
  StatusOr<Sampled> sampled = sample(s, args);
  if (!sampled.ok()) return fail("rollout", sampled.status());
  rollout::SafeVerifier verifier(s.task, std::chrono::milliseconds(static_cast<int64_t>(
                                             std::ceil(s.config.task.verifier_timeout_s * 1000))));
  StatusOr<Scored> scored = score_all(s, verifier, *sampled);
  if (!scored.ok()) return fail("rollout", scored.status());
  if (!args.out.empty()) {
    if (Status st = write_file_atomic(args.out, scored->lines); !st.ok())
      return fail("rollout", st);
  }
  if (!args.store.empty()) {
    if (Status st = append_to_store(args.store, sampled->groups); !st.ok()) {
      return fail("rollout", st);
    }
  }
  const rollout::EngineStats stats = sampled->engine->stats();
  const double seconds = sampled->seconds;
  const int64_t trajectories = scored->trajectories, tokens = scored->tokens;
  std::printf(
      "%lld groups, %lld trajectories, %lld response tokens in %.2f s (%.1f tokens/s); "
      "mean reward %.4f; verifier errors %lld, timeouts %lld; prefill shared %lld times\n",
      static_cast<long long>(sampled->groups.size()), static_cast<long long>(trajectories),
      static_cast<long long>(tokens), seconds, seconds > 0 ? tokens / seconds : 0.0,
      trajectories > 0 ? scored->reward_sum / trajectories : 0.0,
      static_cast<long long>(verifier.errors()), static_cast<long long>(verifier.timeouts()),
      static_cast<long long>(stats.shared_prefills));
  if (const std::optional<rollout::TeacherStats>& t = sampled->teacher) {
    // The cost of scoring where the samples are made (docs/BENCHMARKS.md).
    std::printf(
        "teacher: %lld responses, %lld tokens in %.2f s (%.1f tokens/s), %.2fx the "
        "sampling time\n",
        static_cast<long long>(t->responses), static_cast<long long>(t->tokens), t->seconds,
        t->seconds > 0 ? t->tokens / t->seconds : 0.0, seconds > 0 ? t->seconds / seconds : 0.0);
  }
  if (!args.out.empty()) std::printf("wrote %s\n", args.out.c_str());
  return 0;
}

}  // namespace

Command add_rollout_command(CLI::App& relay) {
  auto args = std::make_shared<RolloutArgs>();
  CLI::App* rollout = relay.add_subcommand(
      "rollout", "Sample K responses per task prompt with the rollout engine and score them");
  rollout->add_option("config", args->config_file, "YAML experiment config")->required();
  rollout->add_option("overrides", args->overrides, "key.path=value overrides");
  rollout->add_option("--model", args->model_dir,
                      "HF-layout model directory (default: model.path)");
  rollout->add_option("--prompts", args->prompts, "Number of task prompts (groups)");
  rollout->add_option("--start", args->start, "Index of the first task prompt");
  rollout->add_option("--out", args->out, "Write trajectory groups as JSONL here");
  rollout->add_option("--store", args->store, "Append the groups to this rollout store");
  return {rollout, [args] { return cli::rollout(*args); }};
}

}  // namespace relay::cli
