#pragma once

// The process-level sections' YAML keys (experiment, eval, run, model,
// services) and the top-level layout. The components' sections bring their
// own keys (relay/trainer/option_keys.h, relay/rollout/option_keys.h).

#include "relay/config/config.h"
#include "relay/rollout/option_keys.h"
#include "relay/trainer/option_keys.h"

namespace relay {

template <class V>
void visit_fields(V& v, WarmStartConfig& c) {
  v.field("sft_steps", c.sft_steps);
  v.field("sft_lr", c.sft_lr);
  v.field("batch", c.batch);
}

template <class V>
void visit_fields(V& v, ExperimentSection& c) {
  v.field("name", c.name);
  v.field("output_dir", c.output_dir);
  v.field("steps", c.steps);
  v.field("groups_per_step", c.groups_per_step);
  v.field("checkpoint_every", c.checkpoint_every);
  v.field("keep_checkpoints", c.keep_checkpoints);
  v.field("keep_best_checkpoint", c.keep_best_checkpoint);
  v.section("warm_start", c.warm_start);
}

template <class V>
void visit_fields(V& v, EvalConfig& c) {
  v.field("prompts", c.prompts);
  v.field("every", c.every);
  v.field("n", c.n);
  v.field("temperature", c.temperature);
}

template <class V>
void visit_fields(V& v, TlsConfig& c) {
  v.field("cert", c.cert);
  v.field("key", c.key);
  v.field("ca", c.ca);
  v.field("mutual", c.mutual);
}

template <class V>
void visit_fields(V& v, ServicesConfig& c) {
  v.field("listen", c.listen);
  v.field("http_listen", c.http_listen);
  v.field("token_file", c.token_file);
  v.section("tls", c.tls);
  v.field("lease_timeout_s", c.lease_timeout_s);
  v.field("group_wait_s", c.group_wait_s);
  v.field("rpc_timeout_s", c.rpc_timeout_s);
  v.field("worker_timeout_s", c.worker_timeout_s);
  v.field("weight_sync", c.weight_sync, comm::kWeightSyncModeNames);
  v.field("weight_sync_port", c.weight_sync_port);
  v.field("weight_sync_bucket_mb", c.weight_sync_bucket_mb);
  v.field("weight_sync_timeout_s", c.weight_sync_timeout_s);
}

template <class V>
void visit_fields(V& v, RunConfig& c) {
  v.field("seed", c.seed);
  v.field("threads", c.threads);
  v.field("core_share", c.core_share);
  v.field("log_level", c.log_level, kLogLevelNames);
  v.field("device", c.device);
  v.field("autocast", c.autocast, model::kAutocastNames);
}

template <class V>
void visit_fields(V& v, ModelInitConfig& c) {
  v.field("arch", c.arch, kModelArchNames);
  v.field("layers", c.layers);
  v.field("hidden", c.hidden);
  v.field("heads", c.heads);
  v.field("kv_heads", c.kv_heads);
  v.field("head_dim", c.head_dim);
  v.field("ffn", c.ffn);
  v.field("experts", c.experts);
  v.field("experts_per_tok", c.experts_per_tok);
  v.field("moe_ffn", c.moe_ffn);
  v.field("vocab", c.vocab);
  v.field("max_seq_len", c.max_seq_len);
  v.field("rope_theta", c.rope_theta);
  v.field("rms_norm_eps", c.rms_norm_eps);
  v.field("tie_embeddings", c.tie_embeddings);
}

template <class V>
void visit_fields(V& v, ModelConfig& c) {
  v.field("path", c.path);
  v.field("dtype", c.dtype, model::kPrecisionNames);
  v.field("tokenizer", c.tokenizer);
  v.field("chat_template", c.chat_template, model::kChatTemplateChoiceNames);
  v.field("system_prompt", c.system_prompt);
  v.field("attn_implementation", c.attn_implementation, model::kAttentionChoiceNames);
  v.section("init", c.init);
}

template <class V>
void visit_fields(V& v, ExperimentConfig& c) {
  v.section("experiment", c.experiment);
  v.section("eval", c.eval);
  v.section("run", c.run);
  v.section("model", c.model);
  v.section("rollout", c.rollout);
  v.section("task", c.task);
  v.section("trainer", c.trainer);
  v.section("services", c.services);
}

}  // namespace relay
