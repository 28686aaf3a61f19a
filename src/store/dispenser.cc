#include "relay/store/dispenser.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "relay/v1/store.pb.h"

namespace relay::store {
namespace {

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void to_record(const Lease& l, v1::LeaseRecord* r) {
  r->set_id(l.id);
  r->set_prompt_index(l.prompt_index);
  r->set_worker_id(l.worker_id);
  r->set_k(l.k);
  r->set_leased_version(l.leased_version);
  r->set_deadline_unix_ms(l.deadline_unix_ms);
  r->set_attempt(l.attempt);
  r->set_occurrence(l.occurrence);
}

Lease from_record(const v1::LeaseRecord& r) {
  Lease l;
  l.id = r.id();
  l.prompt_index = r.prompt_index();
  l.worker_id = r.worker_id();
  l.k = r.k();
  l.leased_version = r.leased_version();
  l.deadline_unix_ms = r.deadline_unix_ms();
  l.attempt = r.attempt();
  // Records from before occurrences existed: the index was the position.
  l.occurrence = r.occurrence() != 0 ? r.occurrence() : r.prompt_index();
  return l;
}

}  // namespace

Status validate(const DispenserOptions& o) {
  auto bad = [](const char* field, const char* rule, int64_t got) {
    return InvalidArgumentError(
        absl::StrCat("dispenser.", field, ": must be ", rule, ", got ", got));
  };
  if (o.groups_per_step < 1) return bad("groups_per_step", ">= 1", o.groups_per_step);
  if (o.max_staleness < 0) return bad("max_staleness", ">= 0", o.max_staleness);
  if (o.k < 1) return bad("k", ">= 1", o.k);
  if (o.lease_timeout_ms < 1) return bad("lease_timeout_ms", ">= 1", o.lease_timeout_ms);
  if (o.num_prompts == 0) return bad("num_prompts", "> 0 (or < 0 for a stream)", 0);
  return OkStatus();
}

PromptDispenser::PromptDispenser(RolloutStore* store, DispenserOptions options, NowMs now_ms)
    : store_(store), options_(options), now_ms_(std::move(now_ms)) {}

StatusOr<std::unique_ptr<PromptDispenser>> PromptDispenser::open(RolloutStore* store,
                                                                 DispenserOptions options,
                                                                 NowMs now_ms) {
  if (store == nullptr) return InvalidArgumentError("dispenser: store is null");
  RELAY_RETURN_IF_ERROR(validate(options));
  if (!now_ms) now_ms = system_now_ms;
  std::unique_ptr<PromptDispenser> d(new PromptDispenser(store, options, std::move(now_ms)));
  // Nobody else sees `d` yet; the lock only keeps the rule "mu_ guards the
  // state" without exceptions.
  std::lock_guard<std::mutex> lock(d->mu_);
  RELAY_RETURN_IF_ERROR(d->load_locked());
  return d;
}

Status PromptDispenser::load_locked() {
  RELAY_ASSIGN_OR_RETURN(std::string bytes, store_->side_record());
  v1::DispenserState state;
  if (!state.ParseFromString(bytes)) {
    return DataLossError(
        absl::StrCat("dispenser: the state record in ", store_->path(), " does not parse"));
  }
  stats_.next_prompt = state.next_prompt();
  next_lease_id_ = std::max<uint64_t>(1, state.next_lease_id());
  leases_.clear();
  retry_.clear();
  for (const v1::LeaseRecord& r : state.leases()) leases_[r.id()] = from_record(r);
  for (const v1::LeaseRecord& r : state.retry()) retry_.push_back(from_record(r));
  stats_.accepted = static_cast<int64_t>(store_->appended());
  return OkStatus();
}

int64_t PromptDispenser::room_locked(int64_t version) const {
  // Accepted groups that expired (or were quarantined) in the store were
  // never trained on: they give their place back (AReaL counts them as
  // rejected). Without this, every group that arrives after its batch is full
  // would shrink the bound for good, and a synchronous run (max_staleness 0)
  // would stall.
  const int64_t live = stats_.accepted - static_cast<int64_t>(store_->expired_total()) -
                       static_cast<int64_t>(store_->rejected_total());
  const int64_t steps = std::max<int64_t>(0, version - options_.base_version);
  const int64_t bound = (options_.max_staleness + steps + 1) * options_.groups_per_step;
  return std::max<int64_t>(0, bound - live - static_cast<int64_t>(leases_.size()));
}

int64_t PromptDispenser::capacity(int64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  return room_locked(version);
}

namespace {

std::string encode_state(int64_t next_prompt, uint64_t next_lease_id,
                         const std::map<uint64_t, Lease>& leases, const std::deque<Lease>& retry) {
  v1::DispenserState state;
  state.set_next_prompt(next_prompt);
  state.set_next_lease_id(next_lease_id);
  for (const auto& [id, l] : leases) to_record(l, state.add_leases());
  for (const Lease& l : retry) to_record(l, state.add_retry());
  return state.SerializeAsString();
}

}  // namespace

int64_t PromptDispenser::expire_locked(int64_t now) {
  int64_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline_unix_ms > now) {
      ++it;
      continue;
    }
    Lease again = it->second;
    ++again.attempt;
    retry_.push_back(again);
    it = leases_.erase(it);
    ++n;
  }
  stats_.expired_leases += n;
  return n;
}

void PromptDispenser::enqueue_locked(Commit* c) {
  std::lock_guard<std::mutex> lock(commit_mu_);
  queued_.push_back(c);
}

std::string PromptDispenser::encode_state_locked() const {
  return encode_state(stats_.next_prompt, next_lease_id_, leases_, retry_);
}

Status PromptDispenser::commit(Commit* c) {
  std::unique_lock<std::mutex> lock(commit_mu_);
  while (!c->done) {
    if (writing_) {
      commit_cv_.wait(lock);
      continue;
    }
    // Lead: everything queued by now (c among it) goes in one write, with
    // the state after those changes and no other. A change is made and
    // queued under mu_, so with mu_ held the queue and the state agree.
    writing_ = true;
    lock.unlock();
    std::vector<Commit*> batch;
    std::string state;
    {
      std::lock_guard<std::mutex> state_lock(mu_);
      std::lock_guard<std::mutex> queue_lock(commit_mu_);
      batch.assign(queued_.begin(), queued_.end());
      queued_.clear();
      state = encode_state_locked();
    }
    std::vector<const RolloutStore::PreparedGroup*> groups;
    for (Commit* b : batch) {
      if (b->group) groups.push_back(&*b->group);
    }
    StatusOr<std::vector<uint64_t>> seqs = store_->append_prepared(groups, &state);
    if (!seqs.ok()) recover(seqs.status());  // before anyone can queue on the lost state
    lock.lock();
    size_t next = 0;
    for (Commit* b : batch) {
      b->status = seqs.status();
      if (seqs.ok() && b->group) b->seq = (*seqs)[next++];
      b->done = true;
    }
    writing_ = false;
    commit_cv_.notify_all();
  }
  return c->status;
}

void PromptDispenser::recover(const Status& why) {
  std::lock_guard<std::mutex> state_lock(mu_);
  {
    // Queued after the failed batch, so made on top of its lost changes.
    std::lock_guard<std::mutex> lock(commit_mu_);
    for (Commit* q : queued_) {
      q->status = why;
      q->done = true;
    }
    queued_.clear();
  }
  // When the store cannot be read either, the next write fails as well.
  (void)load_locked();
}

StatusOr<int64_t> PromptDispenser::expire_leases() {
  Commit c;
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = expire_locked(now_ms_());
    if (n == 0) return n;
    enqueue_locked(&c);
  }
  RELAY_RETURN_IF_ERROR(commit(&c));
  return n;
}

StatusOr<std::vector<Lease>> PromptDispenser::lease(const std::string& worker_id, int64_t n,
                                                    int64_t version) {
  Commit c;
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t now = now_ms_();
  const int64_t expired = expire_locked(now);
  const int64_t room = room_locked(version);
  std::vector<Lease> out;
  for (int64_t i = 0; i < std::min(n, room); ++i) {
    Lease l;
    if (!retry_.empty()) {
      l = retry_.front();
      retry_.pop_front();
    } else {
      l.occurrence = stats_.next_prompt;
      l.prompt_index =
          options_.num_prompts > 0 ? stats_.next_prompt % options_.num_prompts : stats_.next_prompt;
      ++stats_.next_prompt;
      l.k = options_.k;
    }
    l.id = next_lease_id_++;
    l.worker_id = worker_id;
    l.leased_version = version;
    l.deadline_unix_ms = now + options_.lease_timeout_ms;
    leases_[l.id] = l;
    out.push_back(l);
  }
  if (out.empty() && expired == 0) return out;
  enqueue_locked(&c);
  lock.unlock();
  RELAY_RETURN_IF_ERROR(commit(&c));
  return out;
}

StatusOr<uint64_t> PromptDispenser::submit(uint64_t lease_id, const rollout::TrajectoryGroup& group,
                                           int64_t trainer_version) {
  RELAY_ASSIGN_OR_RETURN(std::unique_ptr<Submission> s,
                         begin_submit(lease_id, group, trainer_version));
  return s->wait();
}

StatusOr<std::unique_ptr<PromptDispenser::Submission>> PromptDispenser::begin_submit(
    uint64_t lease_id, const rollout::TrajectoryGroup& group, int64_t trainer_version) {
  // Checked and encoded before the lock, on the caller's thread: the
  // encoding is most of a submission's CPU here, and concurrent submitters
  // now do theirs in parallel instead of in turn under mu_ or in the one
  // thread that writes. Its error comes after the lease's, as before.
  StatusOr<RolloutStore::PreparedGroup> prepared = RolloutStore::prepare(group, trainer_version);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    ++stats_.rejected_late;
    return FailedPreconditionError(
        absl::StrCat("lease ", lease_id,
                     ": unknown or no longer held (expired and re-leased, or already "
                     "submitted); group '",
                     group.group_id, "' was not accepted"));
  }
  const Lease& l = it->second;
  if (l.deadline_unix_ms <= now_ms_()) {
    ++stats_.rejected_late;
    return FailedPreconditionError(absl::StrCat("lease ", lease_id, ": expired at ",
                                                l.deadline_unix_ms, " ms; group '", group.group_id,
                                                "' was not accepted"));
  }
  if (static_cast<int>(group.trajectories.size()) != l.k) {
    return InvalidArgumentError(absl::StrCat("group '", group.group_id,
                                             "': ", group.trajectories.size(),
                                             " trajectories for a lease of k = ", l.k));
  }
  // What the store would refuse is refused here, before anything changes.
  if (!prepared.ok()) return prepared.status();
  // Retired in memory now (a second submission on it is refused at once)
  // and durable with the group; a failed write reloads both.
  leases_.erase(it);
  ++stats_.accepted;
  std::unique_ptr<Submission> s(new Submission(this));
  s->commit_.group = *std::move(prepared);
  enqueue_locked(&s->commit_);
  return s;
}

PromptDispenser::Submission::~Submission() {
  if (!waited_) (void)dispenser_->commit(&commit_);
}

StatusOr<uint64_t> PromptDispenser::Submission::wait() {
  waited_ = true;
  RELAY_RETURN_IF_ERROR(dispenser_->commit(&commit_));
  return commit_.seq;
}

Status PromptDispenser::release(uint64_t lease_id) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return NotFoundError(absl::StrCat("lease ", lease_id, ": unknown or no longer held"));
  }
  Lease again = it->second;
  ++again.attempt;
  leases_.erase(it);
  retry_.push_back(again);
  ++stats_.released;
  Commit c;
  enqueue_locked(&c);
  lock.unlock();
  return commit(&c);
}

std::vector<Lease> PromptDispenser::leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Lease> out;
  for (const auto& [id, l] : leases_) out.push_back(l);
  return out;
}

StatusOr<Lease> PromptDispenser::find_lease(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    return NotFoundError(absl::StrCat("lease ", id, ": unknown or no longer held"));
  }
  return it->second;
}

DispenserStats PromptDispenser::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DispenserStats s = stats_;
  s.in_flight = static_cast<int64_t>(leases_.size());
  s.retry_queue = static_cast<int64_t>(retry_.size());
  return s;
}

}  // namespace relay::store
