#include "relay/trainer/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "relay/common/file_io.h"
#include "relay/model/lora.h"
#include "relay/model/torch_error.h"
#include "trainer/critic.h"
#include "trainer/fully_sharded.h"
#include "trainer/optimizer.h"
#include "trainer/step_state.h"

namespace relay::trainer {

namespace {

// A LibTorch message that says memory ran out (CPU or CUDA allocators).
bool is_out_of_memory(const std::string& what) {
  return what.find("out of memory") != std::string::npos || what.find("alloc") != std::string::npos;
}

// Runs a step body; an exception out of it (c10::Error, std::bad_alloc, ...)
// goes to `on_exception` as its message and whether memory ran out.
StatusOr<StepMetrics> catching(
    const std::function<StatusOr<StepMetrics>()>& body,
    const std::function<Status(const std::string&, bool)>& on_exception) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return on_exception("std::bad_alloc", true);
  } catch (const std::exception& e) {
    return on_exception(model::exception_message(e), false);
  }
}

}  // namespace

Trainer::Trainer(model::Policy policy, TrainerOptions options, int64_t version,
                 model::Policy reference, DataParallel data_parallel)
    : policy_(std::move(policy)),
      options_(std::move(options)),
      dp_(std::move(data_parallel)),
      version_(version) {
  if (options_.needs_reference() && !reference && model::has_lora(*policy_)) {
    // LoRA: the base model is the reference; it is the policy with its
    // adapters off, so nothing is copied.
    reference_ = policy_;
    reference_is_base_ = true;
  } else if (options_.needs_reference()) {
    // The reference is the given policy or the policy as it is now, frozen,
    // in the compute dtype: under autocast its products run in that
    // precision anyway, so an fp32 copy would only double its memory.
    reference_ = reference ? reference : model::clone_policy(*policy_);
    if (options_.autocast) reference_->to(*options_.autocast);
    for (auto& p : reference_->parameters()) p.set_requires_grad(false);
    reference_->eval();
  }
  policy_->set_activation_checkpointing(options_.activation_checkpointing);
  reward_kl_ = std::make_unique<KlController>(options_.reward_kl.controller);
  entropy_ = std::make_unique<EntropyController>(options_.entropy);
}

Trainer::~Trainer() {
  // trainer.sharding: full: rank 0 gives its module back whole, as of the
  // last version (a half-updated step never reached the host copy), so
  // that another trainer (RL after the warm start) can take it. The other
  // ranks' modules stay empty: their weights come from rank 0.
  if (sharded_ && host_policy_) sharded_->restore_whole(*host_policy_);
}

namespace {

// A copy of `policy`'s weights on the host, in their dtype.
model::Policy host_copy(const model::PolicyImpl& policy) {
  model::Policy copy(policy.config());
  copy->to(policy.parameters().front().scalar_type());
  torch::NoGradGuard no_grad;
  const auto src = policy.named_parameters();
  for (auto& item : copy->named_parameters()) item.value().copy_(src[item.key()]);
  copy->eval();
  return copy;
}

}  // namespace

model::ValueModel Trainer::critic() const { return critic_ ? critic_->whole_model() : nullptr; }

Status Trainer::shard_and_make_optimizer(model::ValueModel critic) {
  if (options_.advantage.estimator == AdvantageEstimator::kGae) {
    // Before the policy is sharded: the default critic copies its weights.
    if (!critic) critic = model::value_model_from_policy(*policy_, 0);
    critic->set_activation_checkpointing(options_.activation_checkpointing);
    RELAY_ASSIGN_OR_RETURN(critic_,
                           Critic::create(critic, options_.critic, options_.sharding, dp_));
  }
  if (options_.sharding != Sharding::kFull || !dp_.active()) {
    // Frozen parameters (a LoRA base) never reach the optimizer: no
    // gradients, moments or master copies for them, on any rank.
    std::vector<at::Tensor> trainable;
    for (const at::Tensor& p : policy_->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (trainable.empty()) {
      return InvalidArgumentError("Trainer: the policy has no trainable parameter");
    }
    RELAY_ASSIGN_OR_RETURN(optimizer_,
                           make_optimizer(trainable, options_.optimizer, options_.sharding, dp_));
    return OkStatus();
  }
  // Rank 0 keeps the whole weights on the host for whoever reads policy();
  // then every rank frees its whole copy for its shards.
  if (dp_.rank() == 0) host_policy_ = host_copy(*policy_);
  RELAY_ASSIGN_OR_RETURN(sharded_, FullyShardedModel::create(policy_, dp_, /*trainable=*/true));
  if (reference_) {
    RELAY_ASSIGN_OR_RETURN(sharded_reference_,
                           FullyShardedModel::create(reference_, dp_, /*trainable=*/false));
  }
  RELAY_ASSIGN_OR_RETURN(optimizer_, make_fully_sharded_adamw(*sharded_, options_.optimizer));
  return OkStatus();
}

Status Trainer::refresh_host_policy() {
  if (!sharded_) return OkStatus();
  return sharded_->gather_weights(host_policy_ ? host_policy_.get() : nullptr);
}

namespace {
at::Tensor scalar_tensor(double x) { return torch::tensor({x}, torch::kFloat64); }

// The torch archive in `bytes` (the file `path`).
Status load_archive(const std::string& bytes, const std::string& path,
                    torch::serialize::InputArchive& archive) {
  if (bytes.empty()) {
    return DataLossError(absl::StrCat(path, ": empty file (0 bytes), not a trainer state"));
  }
  // A file cut short (a full disk, a copy interrupted) loses the archive's
  // central directory at its end, so it fails here; that is said in words,
  // with LibTorch's message (not its stack trace) for the detail.
  try {
    std::istringstream in(bytes);
    archive.load_from(in);
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(
        path, ": truncated or corrupt (", bytes.size(),
        " bytes are not a readable torch archive: ", model::exception_message(e), ")"));
  }
  return OkStatus();
}

// The torch archive in the file `path`, read by the archive piece by piece
// (pread) as it loads: the tensors are the only copy in memory.
Status load_archive_file(const std::string& path, torch::serialize::InputArchive& archive) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::ErrnoToStatus(errno, path + ": cannot open");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, path + ": cannot stat");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    return DataLossError(absl::StrCat(path, ": empty file (0 bytes), not a trainer state"));
  }
  int read_errno = 0;
  auto read = [&](uint64_t pos, void* buf, size_t n) -> size_t {
    size_t done = 0;
    while (done < n) {
      const ssize_t r =
          ::pread(fd, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(pos + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) read_errno = errno;
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  };
  try {
    archive.load_from(read, [size]() -> size_t { return size; });
  } catch (const std::exception& e) {
    if (read_errno != 0) return absl::ErrnoToStatus(read_errno, path + ": read failed");
    return DataLossError(absl::StrCat(
        path, ": truncated or corrupt (", size,
        " bytes are not a readable torch archive: ", model::exception_message(e), ")"));
  }
  return OkStatus();
}
}  // namespace

Status Trainer::write_state(const std::function<size_t(const void*, size_t)>& write) const {
  // A half-updated policy must not become a checkpoint (see step()).
  RELAY_RETURN_IF_ERROR(broken_);
  if (optimizer_->save_is_collective()) {
    // Rank 0 tells the other ranks to take part; they gather into it.
    if (dp_.lead) RELAY_RETURN_IF_ERROR(dp_.lead("save_state", {}));
  }
  try {
    torch::serialize::OutputArchive archive;
    archive.write("format", scalar_tensor(1));
    archive.write("version", torch::tensor({version_}, torch::kInt64));
    archive.write("optimizer_steps", torch::tensor({optimizer_steps_}, torch::kInt64));
    archive.write("reward_kl_coef", scalar_tensor(reward_kl_->value()));
    archive.write("entropy_coef", scalar_tensor(entropy_->value()));
    RELAY_RETURN_IF_ERROR(optimizer_->save(archive));
    if (critic_) {
      torch::serialize::OutputArchive critic;
      RELAY_RETURN_IF_ERROR(critic_->save(critic));
      archive.write("critic", critic);
    }
    if (optimizer_->save_is_collective() && dp_.rank() != 0) return OkStatus();
    archive.save_to(write);
  } catch (const std::exception& e) {
    return InternalError(
        absl::StrCat("cannot serialize the trainer state: ", model::exception_message(e)));
  }
  return OkStatus();
}

StatusOr<std::string> Trainer::save_state() const {
  std::string out;
  RELAY_RETURN_IF_ERROR(write_state([&out](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  }));
  return out;
}

Status Trainer::save_state_to_file(const std::string& path) const {
  if (optimizer_->save_is_collective() && dp_.rank() != 0) {
    return FailedPreconditionError(absl::StrCat(
        path, ": rank ", dp_.rank(), " cannot write the trainer state; rank 0 writes it"));
  }
  AtomicFile file(path);
  RELAY_RETURN_IF_ERROR(file.open());
  // The first write error is kept (a full disk, naming the file) and the
  // rest of the archive is taken and dropped: a short count would make the
  // archive throw, and LibTorch's writer can throw again from its
  // destructor and end the process (pytorch/pytorch#175248).
  // (A follower writes nothing: refused above.)
  Status written = OkStatus();
  const Status s = write_state([&](const void* data, size_t n) -> size_t {
    if (written.ok()) written = file.write(data, n);
    return n;
  });
  RELAY_RETURN_IF_ERROR(written);
  RELAY_RETURN_IF_ERROR(s);
  return file.commit();
}

Status Trainer::restore_state(const std::string& bytes, const std::string& path) {
  // A broken trainer's policy holds half-updated weights: a new trainer over
  // freshly loaded weights resumes, not this one.
  RELAY_RETURN_IF_ERROR(broken_);
  torch::serialize::InputArchive archive;
  RELAY_RETURN_IF_ERROR(load_archive(bytes, path, archive));
  return restore_archive(archive, path);
}

Status Trainer::restore_state_from_file(const std::string& path) {
  RELAY_RETURN_IF_ERROR(broken_);
  torch::serialize::InputArchive archive;
  RELAY_RETURN_IF_ERROR(load_archive_file(path, archive));
  return restore_archive(archive, path);
}

Status Trainer::restore_archive(torch::serialize::InputArchive& archive, const std::string& path) {
  double format = 0, kl_coef = 0, entropy_coef = 0;
  int64_t version = 0, steps = 0;
  // Scalars are taken out here too: item() of a damaged entry throws.
  try {
    auto scalar = [&](const char* key) {
      at::Tensor t;
      archive.read(key, t);
      return t;
    };
    format = scalar("format").item<double>();
    version = scalar("version").item<int64_t>();
    steps = scalar("optimizer_steps").item<int64_t>();
    kl_coef = scalar("reward_kl_coef").item<double>();
    entropy_coef = scalar("entropy_coef").item<double>();
  } catch (const std::exception& e) {
    return DataLossError(absl::StrCat(
        path, ": not a relay trainer state, or a corrupt one: ", model::exception_message(e)));
  }
  if (format != 1) {
    return DataLossError(absl::StrCat(path, ": unknown trainer state format ", format));
  }
  // Checks everything before it changes anything.
  torch::serialize::InputArchive critic;
  if (critic_) {
    try {
      archive.read("critic", critic);
    } catch (const std::exception& e) {
      return DataLossError(absl::StrCat(
          path,
          ": has no critic state, and this trainer trains a critic (advantage.estimator "
          "gae): it was written by a run without one"));
    }
  }
  // Both optimizers read before either changes: a critic state that does not
  // fit leaves the policy's optimizer as it was too.
  RELAY_ASSIGN_OR_RETURN(std::function<void()> install_policy,
                         optimizer_->read_state(archive, path));
  std::function<void()> install_critic;
  if (critic_) {
    RELAY_ASSIGN_OR_RETURN(install_critic, critic_->read_state(critic, path + " (critic)"));
  }
  install_policy();
  if (install_critic) install_critic();
  version_ = version;
  optimizer_steps_ = steps;
  reward_kl_->set_value(kl_coef);
  entropy_->set_value(entropy_coef);
  return OkStatus();
}

namespace {

// trainer.lora against the adapters the policy carries: a policy without
// them gets them; one with them must have the ones the options describe.
Status match_adapters(model::PolicyImpl& policy, const model::LoraConfig& want) {
  const std::optional<model::LoraConfig> has = model::lora_config(policy);
  if (!has) return want.enabled() ? model::attach_lora(policy, want, /*seed=*/0) : OkStatus();
  if (!want.enabled()) {
    return InvalidArgumentError(
        "trainer.lora: the policy carries LoRA adapters (it was loaded from a PEFT adapter "
        "directory), and trainer.lora.rank is 0; set trainer.lora to the adapter's options to "
        "train it");
  }
  model::LoraConfig expanded = want;
  if (std::find(want.targets.begin(), want.targets.end(), "all-linear") != want.targets.end()) {
    expanded.targets = model::kLoraProjections;
  }
  std::vector<std::string> a = expanded.targets, b = has->targets;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  if (has->rank != want.rank || std::abs(has->alpha - want.alpha) > 1e-9 * want.alpha || a != b) {
    return InvalidArgumentError(absl::StrCat(
        "trainer.lora: the policy's adapters have rank ", has->rank, ", alpha ", has->alpha,
        " on [", absl::StrJoin(has->targets, ", "), "]; trainer.lora asks for rank ", want.rank,
        ", alpha ", want.alpha, " on [", absl::StrJoin(want.targets, ", "), "]"));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Trainer>> Trainer::create(model::Policy policy, TrainerOptions options,
                                                   int64_t version, model::Policy reference,
                                                   DataParallel data_parallel,
                                                   model::ValueModel critic) {
  if (!policy) return InvalidArgumentError("Trainer: policy is null");
  RELAY_RETURN_IF_ERROR(validate(options));
  if (options.overlong_buffer.length > 0 && options.max_response_length <= 0) {
    return InvalidArgumentError(
        "trainer.overlong_buffer.length: needs the response budget L_max "
        "(TrainerOptions::max_response_length, which a run sets from rollout.max_new_tokens)");
  }
  if (data_parallel.bucket_bytes < 1) {
    return InvalidArgumentError(absl::StrCat("trainer.allreduce_bucket_mb: must be > 0, got ",
                                             data_parallel.bucket_bytes, " bytes"));
  }
  RELAY_RETURN_IF_ERROR(match_adapters(*policy, options.lora));
  if (reference && options.needs_reference()) {
    auto theirs = reference->named_parameters();
    const std::vector<std::string> adapters = model::adapter_names(*policy);
    for (const auto& item : policy->named_parameters()) {
      // A LoRA policy's reference is a model without its adapters.
      if (std::binary_search(adapters.begin(), adapters.end(), item.key())) continue;
      const at::Tensor* r = theirs.find(item.key());
      if (r == nullptr || r->sizes() != item.value().sizes()) {
        return InvalidArgumentError(
            absl::StrCat("trainer.reference: the reference policy has no parameter '", item.key(),
                         "' of shape [", absl::StrJoin(item.value().sizes(), ", "),
                         "]; it must have the policy's architecture"));
      }
    }
  }
  if (options.sharding == Sharding::kFull && data_parallel.active() && options.lora.enabled()) {
    return InvalidArgumentError(
        "trainer.sharding: full does not shard a LoRA policy; adapters are a small fraction of "
        "the weights: use trainer.sharding: optimizer or none with trainer.lora");
  }
  if (critic && options.advantage.estimator != AdvantageEstimator::kGae) {
    return InvalidArgumentError(
        "Trainer: a critic was given, and trainer.advantage.estimator is not gae (the only "
        "estimator that reads values)");
  }
  // The critic reads the policy's token ids, so it needs an embedding for
  // every one of them; its width and depth are its own (verl's critic may be
  // another size of the same family).
  if (critic && critic->config().vocab_size < policy->config().vocab_size) {
    return InvalidArgumentError(absl::StrCat(
        "trainer.critic: the value model's vocabulary has ", critic->config().vocab_size,
        " entries and the policy's ", policy->config().vocab_size,
        "; a critic embeds every token id the policy can produce (use a critic with the "
        "policy's tokenizer)"));
  }
  std::unique_ptr<Trainer> t(new Trainer(std::move(policy), std::move(options), version,
                                         std::move(reference), std::move(data_parallel)));
  RELAY_RETURN_IF_ERROR(t->shard_and_make_optimizer(std::move(critic)));
  return t;
}

double Trainer::reward_kl_coef() const { return reward_kl_->value(); }
double Trainer::entropy_coef() const { return entropy_->value(); }

// ---------------------------------------------------------------------------
// The steps: one exception boundary, then the phases in order.

StatusOr<StepMetrics> Trainer::step(const std::vector<rollout::TrajectoryGroup>& groups) {
  step_faults_.clear();
  RELAY_RETURN_IF_ERROR(broken_);
  StepState state;
  return guarded(state.updates, [&] { return step_unguarded(groups, state); });
}

StatusOr<StepMetrics> Trainer::sft_step(const std::vector<rollout::TrajectoryGroup>& groups) {
  step_faults_.clear();
  RELAY_RETURN_IF_ERROR(broken_);
  SftStepState state;
  return guarded(state.updates, [&] { return sft_step_unguarded(groups, state); });
}

StatusOr<StepMetrics> Trainer::guarded(const UpdateCount& updates,
                                       const std::function<StatusOr<StepMetrics>()>& body) {
  StatusOr<StepMetrics> result = catching(
      body, [this](const std::string& what, bool oom) { return step_exception(what, oom); });
  if (result.ok() || updates.applied == 0) return result;
  // Some of the step's updates are in the weights and no version describes
  // them: refuse everything from now on rather than publish or checkpoint
  // them (see step()).
  broken_ = absl::AbortedError(absl::StrCat(
      result.status().message(), "; it failed after ", updates.applied, " of ", updates.planned,
      " optimizer updates of the step, so the policy is half-updated: this trainer takes no "
      "more steps and writes no checkpoint; resume from the last checkpoint"));
  return broken_;
}

Status Trainer::step_exception(const std::string& what, bool out_of_memory) {
  // Gradients of the micro-batches before the throw must not leak into the
  // next step.
  drop_gradients();
  const std::string where = absl::StrCat("trainer step at version ", version_, ": ");
  if (out_of_memory || is_out_of_memory(what)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        where, "out of memory (", what,
        "); lower trainer.micro_batch_tokens, turn on trainer.activation_checkpointing, "
        "lower trainer.lm_head_keep_mb, or bound rollout.max_new_tokens"));
  }
  return InternalError(absl::StrCat(where, what));
}

void Trainer::drop_gradients() {
  optimizer_->zero_grad();
  if (critic_) critic_->zero_grad();
  if (sharded_reference_) sharded_reference_->drop_gradients();
}

StatusOr<StepMetrics> Trainer::step_unguarded(const std::vector<rollout::TrajectoryGroup>& groups,
                                              StepState& s) {
  if (dp_.lead) RELAY_RETURN_IF_ERROR(dp_.lead("step", groups));
  RELAY_RETURN_IF_ERROR(prepare_step(groups, s));
  RELAY_RETURN_IF_ERROR(score_step(s));
  RELAY_RETURN_IF_ERROR(correct_rollouts(s));
  RELAY_RETURN_IF_ERROR(compute_step_advantages(s));
  data_metrics(s, version_, s.metrics);
  // Entropy bonus coefficient for this step: 0 while an adaptive controller
  // sees enough entropy (without the pass: the last step's entropy).
  s.entropy_coef = entropy_->coef_for(s.skip_pass ? last_entropy_ : s.metrics.at("entropy"));
  s.metrics["entropy/coef"] = s.entropy_coef;
  RELAY_RETURN_IF_ERROR(check_derived(s));

  // Epochs x mini-batches x micro-batches. Before the first update nothing
  // has changed; after it, a failure breaks the trainer (guarded()).
  plan_updates(s);
  {
    const TrainingMode training(*policy_);
    for (int epoch = 0; epoch < options_.ppo_epochs; ++epoch) {
      for (int i = 0; i < s.mini_batches; ++i) RELAY_RETURN_IF_ERROR(update_minibatch(s, epoch, i));
    }
  }
  RELAY_RETURN_IF_ERROR(finish_step(s));
  RELAY_RETURN_IF_ERROR(refresh_host_policy());
  return std::move(s.metrics);
}

StatusOr<StepMetrics> Trainer::sft_step_unguarded(
    const std::vector<rollout::TrajectoryGroup>& groups, SftStepState& s) {
  if (dp_.lead) RELAY_RETURN_IF_ERROR(dp_.lead("sft_step", groups));
  RELAY_RETURN_IF_ERROR(prepare_sft(groups, s));
  {
    const TrainingMode training(*policy_);
    optimizer_->zero_grad();
    WholeRoot root(sharded_.get());
    RELAY_RETURN_IF_ERROR(root.acquire());
    backward_sft(s);
    RELAY_ASSIGN_OR_RETURN(s.grad_norm, apply_gradients(s.updates));
  }
  RELAY_RETURN_IF_ERROR(refresh_host_policy());
  if (dp_.active()) {
    std::map<std::string, double> sums{{"loss", s.loss_sum}};
    RELAY_RETURN_IF_ERROR(all_reduce_named_sums(*dp_.group, sums));
    s.loss_sum = sums["loss"];
  }
  ++version_;
  return StepMetrics{{"sft_loss", s.loss_sum},
                     {"grad_norm", s.grad_norm},
                     {"lr", lr_at(options_.optimizer, optimizer_steps_ - 1)},
                     {"batch/tokens", static_cast<double>(s.batch.num_tokens())},
                     {"version", static_cast<double>(version_)}};
}

}  // namespace relay::trainer
