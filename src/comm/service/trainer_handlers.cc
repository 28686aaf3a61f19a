#include "relay/comm/service/trainer_handlers.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/comm/rpc/manifest_proto.h"
#include "relay/store/convert.h"
#include "relay/v1/admin.pb.h"
#include "relay/v1/worker.pb.h"

namespace relay::comm {
namespace {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void fill_lease(const store::Lease& l, const PromptContent& p, bool greedy_baseline,
                v1::PromptLease* out) {
  out->set_lease_id(l.id);
  out->set_group_id(p.group_id);
  out->set_prompt_index(l.prompt_index);
  out->mutable_prompt_tokens()->Add(p.prompt_tokens.begin(), p.prompt_tokens.end());
  out->mutable_target_tokens()->Add(p.target_tokens.begin(), p.target_tokens.end());
  out->set_k(l.k);
  out->set_seed(p.seed);
  out->set_greedy_baseline(greedy_baseline);
  out->set_leased_version(l.leased_version);
  out->set_deadline_unix_ms(l.deadline_unix_ms);
}

}  // namespace

TrainerHandlers::TrainerHandlers(TrainerServiceOptions options, store::RolloutStore* store,
                                 store::PromptDispenser* dispenser, WeightPublisher* publisher,
                                 PromptSource prompts, std::function<int64_t()> version)
    : options_(std::move(options)),
      store_(store),
      dispenser_(dispenser),
      publisher_(publisher),
      prompts_(std::move(prompts)),
      version_(std::move(version)) {
  if (!options_.now_ms) options_.now_ms = system_now_ms;
}

StatusOr<v1::RegisterWorkerResponse> TrainerHandlers::register_worker(
    const v1::RegisterWorkerRequest& req) {
  if (req.worker_name().empty()) return InvalidArgumentError("worker_name: empty");
  WorkerInfo w;
  w.worker_name = req.worker_name();
  w.device = req.capabilities().device();
  w.num_slots = req.capabilities().num_slots();
  w.weight_sync_group = req.capabilities().weight_sync_group();
  w.last_heartbeat_unix_ms = options_.now_ms();
  {
    std::lock_guard<std::mutex> lock(mu_);
    w.worker_id = absl::StrCat("w", next_worker_++, "-", req.worker_name());
    workers_[w.worker_id] = w;
    ++presence_.registrations;
    presence_.last_heard_unix_ms = w.last_heartbeat_unix_ms;
  }
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(w.worker_id);
  resp.set_version(version_());
  if (auto snap = publisher_->snapshot(-1); snap.ok()) {
    to_proto((*snap)->manifest, resp.mutable_manifest());
  }
  resp.set_weight_sync_endpoint(options_.weight_sync_endpoint);
  resp.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  resp.set_lease_timeout_ms(dispenser_->options().lease_timeout_ms);
  resp.set_k(dispenser_->options().k);
  return resp;
}

StatusOr<v1::HeartbeatResponse> TrainerHandlers::heartbeat(const v1::HeartbeatRequest& req) {
  if (finished_) return finished(req.worker_id());
  reap_silent_workers();
  v1::HeartbeatResponse resp;
  resp.set_latest_version(version_());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end()) {
    resp.set_reregister(true);
    return resp;
  }
  it->second.running_version = req.running_version();
  it->second.running_digest = req.running_digest();
  it->second.in_flight = req.in_flight();
  it->second.last_heartbeat_unix_ms = options_.now_ms();
  presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
  return resp;
}

StatusOr<v1::LeasePromptsResponse> TrainerHandlers::lease_prompts(
    const v1::LeasePromptsRequest& req) {
  if (finished_) return finished(req.worker_id());
  reap_silent_workers();
  RELAY_RETURN_IF_ERROR(known(req.worker_id()));
  if (req.max_prompts() < 1) {
    return InvalidArgumentError(absl::StrCat("max_prompts: must be >= 1, got ", req.max_prompts()));
  }
  const int64_t version = version_();
  RELAY_ASSIGN_OR_RETURN(std::vector<store::Lease> leases,
                         dispenser_->lease(req.worker_id(), req.max_prompts(), version));
  v1::LeasePromptsResponse resp;
  for (const store::Lease& l : leases) {
    StatusOr<PromptContent> p = prompts_(l);
    if (!p.ok()) {
      // The lease stays recorded and expires; say which prompt failed.
      return InternalError(
          absl::StrCat("prompt ", l.prompt_index, ": ", std::string(p.status().message())));
    }
    fill_lease(l, *p, options_.greedy_baseline, resp.add_leases());
  }
  if (leases.empty()) resp.set_wait_for_version(version + 1);
  resp.set_latest_version(version);
  return resp;
}

StatusOr<v1::ReleaseLeasesResponse> TrainerHandlers::release_leases(
    const v1::ReleaseLeasesRequest& req) {
  RELAY_RETURN_IF_ERROR(known(req.worker_id()));
  int32_t released = 0;
  for (uint64_t id : req.lease_ids()) {
    // Only the holder may give a lease back; one already retired (submitted,
    // expired) is skipped, not an error: the worker cannot know.
    StatusOr<store::Lease> l = dispenser_->find_lease(id);
    if (!l.ok() || l->worker_id != req.worker_id()) continue;
    if (dispenser_->release(id).ok()) ++released;
  }
  v1::ReleaseLeasesResponse resp;
  resp.set_released(released);
  return resp;
}

namespace {
void refuse(const Status& why, v1::SubmitGroupAck& ack) {
  ack.set_accepted(false);
  ack.set_error_code(static_cast<int32_t>(why.code()));
  ack.set_error_message(std::string(why.message()));
}
}  // namespace

v1::SubmitGroupAck TrainerHandlers::submit_group(const v1::SubmitGroupRequest& req) {
  PendingSubmit pending = begin_submit_group(req);
  return finish_submit_group(pending);
}

TrainerHandlers::PendingSubmit TrainerHandlers::begin_submit_group(
    const v1::SubmitGroupRequest& req) {
  PendingSubmit p;
  p.lease_id = req.lease_id();
  p.refused = begin_accept(req, p);  // the submission is set only when it is OK
  return p;
}

v1::SubmitGroupAck TrainerHandlers::finish_submit_group(PendingSubmit& p) {
  v1::SubmitGroupAck ack;
  ack.set_lease_id(p.lease_id);
  if (!p.refused.ok()) {
    refuse(p.refused, ack);
    return ack;
  }
  StatusOr<uint64_t> seq = p.submission->wait();
  if (!seq.ok()) {
    refuse(seq.status(), ack);
    return ack;
  }
  ack.set_accepted(true);
  ack.set_store_seq(*seq);
  return ack;
}

void TrainerHandlers::touch(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second.last_heartbeat_unix_ms = options_.now_ms();
  presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
}

Status TrainerHandlers::finished(const std::string& worker_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    told_.insert(worker_id);
  }
  told_cv_.notify_all();
  return OutOfRangeError("the run is finished");
}

// Also marks the worker alive.
Status TrainerHandlers::known(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end()) {
    it->second.last_heartbeat_unix_ms = options_.now_ms();
    presence_.last_heard_unix_ms = it->second.last_heartbeat_unix_ms;
    return OkStatus();
  }
  return FailedPreconditionError(
      absl::StrCat("worker_id '", worker_id, "': unknown; register first"));
}

// Validates one group and queues it for the store; the error otherwise.
// A group is bound to its lease: only the worker that holds the lease may
// submit on it, with the leased group id and prompt. A malformed group
// keeps the lease (the worker may correct and resubmit, or release it); a
// stale one releases it, since no resubmission can make it fresh.
Status TrainerHandlers::begin_accept(const v1::SubmitGroupRequest& req, PendingSubmit& p) {
  RELAY_RETURN_IF_ERROR(known(req.worker_id()));
  StatusOr<store::Lease> lease = dispenser_->find_lease(req.lease_id());
  if (!lease.ok()) {
    // An expired lease was re-leased to another worker: the group is late.
    return FailedPreconditionError(std::string(lease.status().message()));
  }
  if (lease->worker_id != req.worker_id()) {
    return absl::PermissionDeniedError(
        absl::StrCat("lease ", req.lease_id(), ": held by worker '", lease->worker_id, "', not '",
                     req.worker_id(), "'; group '", req.group().group_id(), "' was not accepted"));
  }
  StatusOr<rollout::TrajectoryGroup> group = store::from_proto(req.group(), /*check=*/false);
  if (!group.ok()) return group.status();
  RELAY_RETURN_IF_ERROR(check_leased(*lease, *group));
  const int64_t version = version_();
  SubmissionContext c;
  c.k = lease->k;
  c.trainer_version = version;
  c.oldest_version = std::max<int64_t>(0, version - options_.max_staleness);
  if (Status v = validate_submission(*group, c, options_.limits); !v.ok()) {
    return v.code() == absl::StatusCode::kFailedPrecondition ? release(req.lease_id(), v) : v;
  }
  normalize_submission(*group, options_.limits);
  RELAY_ASSIGN_OR_RETURN(p.submission, dispenser_->begin_submit(req.lease_id(), *group, version));
  return OkStatus();
}

// The group answers `lease`: the leased group id, and (unless agents chose
// the prompt) the leased prompt in every trajectory (and the baseline). The prompt is derived again
// from the lease (the same function LeasePrompts used), so this holds across a trainer restart
// without remembering what was sent.
Status TrainerHandlers::check_leased(const store::Lease& lease,
                                     const rollout::TrajectoryGroup& group) const {
  StatusOr<PromptContent> leased = prompts_(lease);
  if (!leased.ok()) {
    return InternalError(absl::StrCat("lease ", lease.id,
                                      ": cannot derive its prompt: ", leased.status().message()));
  }
  if (group.group_id != leased->group_id) {
    return InvalidArgumentError(absl::StrCat("group_id: '", group.group_id, "', but lease ",
                                             lease.id, " is for group '", leased->group_id, "'"));
  }
  if (options_.agent_prompts) return OkStatus();
  auto check = [&](const rollout::Trajectory& t, const std::string& where) -> Status {
    const std::vector<int64_t>& want = leased->prompt_tokens;
    if (t.prompt_tokens == want) return OkStatus();
    size_t j = 0;
    while (j < t.prompt_tokens.size() && j < want.size() && t.prompt_tokens[j] == want[j]) ++j;
    return InvalidArgumentError(
        absl::StrCat("group '", group.group_id, "' ", where, ".prompt_tokens: differ from lease ",
                     lease.id, "'s prompt (", t.prompt_tokens.size(), " tokens vs ", want.size(),
                     " leased; first ", "difference at position ", j, ")"));
  };
  for (size_t i = 0; i < group.trajectories.size(); ++i) {
    RELAY_RETURN_IF_ERROR(check(group.trajectories[i], absl::StrCat("trajectories[", i, "]")));
  }
  if (group.baseline) RELAY_RETURN_IF_ERROR(check(*group.baseline, "baseline"));
  return OkStatus();
}

// Releases the lease of a group that can never be accepted (stale), so its
// prompt is leased again at once rather than at the deadline.
Status TrainerHandlers::release(uint64_t lease_id, const Status& why) {
  if (Status r = dispenser_->release(lease_id); !r.ok()) {
    return Status(why.code(), absl::StrCat(why.message(), " (and releasing lease ", lease_id,
                                           " failed: ", r.message(), ")"));
  }
  return why;
}

v1::HealthResponse TrainerHandlers::health() const {
  v1::HealthResponse resp;
  resp.set_serving(true);
  resp.set_version(version_());
  return resp;
}

StatusOr<v1::StatsResponse> TrainerHandlers::stats() const {
  v1::StatsResponse resp;
  const int64_t version = version_();
  resp.set_version(version);
  RELAY_ASSIGN_OR_RETURN(store::StoreStats st, store_->stats());
  resp.set_store_ready(st.ready);
  resp.set_store_consumed(st.consumed);
  resp.set_store_expired(st.expired);
  const store::DispenserStats d = dispenser_->stats();
  resp.set_accepted(d.accepted);
  resp.set_in_flight(d.in_flight);
  resp.set_retry_queue(d.retry_queue);
  resp.set_capacity(dispenser_->capacity(version));
  for (const WorkerInfo& w : workers()) {
    v1::WorkerState* out = resp.add_workers();
    out->set_worker_id(w.worker_id);
    out->set_worker_name(w.worker_name);
    out->set_running_version(w.running_version);
    out->set_running_digest(w.running_digest);
    out->set_in_flight(w.in_flight);
    out->set_last_heartbeat_unix_ms(w.last_heartbeat_unix_ms);
    out->set_in_weight_sync_group(w.weight_sync_group);
  }
  return resp;
}

bool TrainerHandlers::all_workers_told() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_told_locked();
}

bool TrainerHandlers::all_told_locked() const {
  // A worker silent for two heartbeat intervals is probably gone: not
  // waited for.
  const int64_t quiet_ms = options_.now_ms() - 2 * options_.heartbeat_interval_ms - 1000;
  for (const auto& [id, w] : workers_) {
    if (told_.count(id) == 0 && w.last_heartbeat_unix_ms > quiet_ms) return false;
  }
  return true;
}

bool TrainerHandlers::wait_for_workers_told(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto look_again =
      std::chrono::milliseconds(std::max<int64_t>(1, options_.heartbeat_interval_ms));
  std::unique_lock<std::mutex> lock(mu_);
  while (!all_told_locked()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    told_cv_.wait_until(lock, std::min(deadline, now + look_again));
  }
  return true;
}

int TrainerHandlers::reap_silent_workers() {
  if (options_.worker_timeout_ms <= 0) return 0;
  const int64_t now = options_.now_ms();
  std::set<std::string> silent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (now - it->second.last_heartbeat_unix_ms > options_.worker_timeout_ms) {
        silent.insert(it->first);
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (silent.empty()) return 0;
  int64_t released = 0;
  for (const store::Lease& l : dispenser_->leases()) {
    if (silent.count(l.worker_id) > 0 && dispenser_->release(l.id).ok()) ++released;
  }
  spdlog::warn("trainer: {} worker(s) silent for over {} ms ({}); {} leases go back to the queue",
               silent.size(), options_.worker_timeout_ms, absl::StrJoin(silent, ", "), released);
  return static_cast<int>(silent.size());
}

WorkerPresence TrainerHandlers::presence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return presence_;
}

Status TrainerHandlers::check_workers_present() const {
  return check_worker_presence(presence(), options_.now_ms(), options_.worker_timeout_ms);
}

std::vector<WorkerInfo> TrainerHandlers::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

}  // namespace relay::comm
