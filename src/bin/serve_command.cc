// relay serve CONFIG --model DIR --listen HOST:PORT: the OpenAI-compatible
// endpoint (docs/serve.md) on a model directory, with no trainer: for
// evaluation and for developing agents against the model they will train.
// The rollout section sets the engine (slots, context, KV budget), the model
// section the chat template, the task section only the stop strings (a task
// file is not read); the bearer token is services.token_file or
// $RELAY_TOKEN (or --token). Prints the address, serves until SIGINT or
// SIGTERM, then stops taking requests, ends what is in flight and exits 0.

#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bin/commands.h"
#include "relay/app/setup.h"
#include "relay/common/file_io.h"
#include "relay/serve/openai_server.h"
#include "relay/serve/serving_engine.h"

namespace relay::cli {
namespace {

struct ServeArgs {
  app::SetupArgs setup;
  std::string listen = "127.0.0.1:8000";
  std::string port_file;
  std::string model_name;  // default: the model directory's name
  std::string token;
  int max_requests = 64;
  int64_t max_tokens = 1024;
};

int fail(const Status& s) { return cli::fail("serve", s); }

StatusOr<std::pair<std::string, int>> parse_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return InvalidArgumentError(
        absl::StrCat("--listen: expected HOST:PORT (port 0 = any free one), got '", listen, "'"));
  }
  return std::make_pair(listen.substr(0, colon), port);
}

int serve(ServeArgs& args) {
  StatusOr<std::pair<std::string, int>> address = parse_listen(args.listen);
  if (!address.ok()) return fail(address.status());
  if (args.setup.model_dir.empty()) {
    return fail(InvalidArgumentError("--model: required (the model directory to serve)"));
  }
  // The engine thread, the server's threads and the model's all start below:
  // block the stop signals first, so only sigwait here receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // Serving samples no task prompt: the task's file need not be here.
  args.setup.read_task_prompts = false;
  StatusOr<app::RolloutSetup> s = app::setup_rollout(args.setup);
  if (!s.ok()) return fail(s.status());
  StatusOr<std::string> token = app::auth_token(s->config.services, args.token);
  if (!token.ok()) return fail(token.status());
  StatusOr<uint64_t> digest = app::weights_digest(*s->policy);
  if (!digest.ok()) return fail(digest.status());
  StatusOr<std::unique_ptr<rollout::Engine>> engine =
      rollout::Engine::create(s->policy, s->engine, /*version=*/0, *digest);
  if (!engine.ok()) return fail(engine.status());
  const serve::ServedModel model = app::served_model(*s);
  serve::ServingEngine serving(*std::move(engine));
  serve::ServeOptions options;
  options.host = address->first;
  options.port = address->second;
  options.model_name = args.model_name;
  if (options.model_name.empty()) {
    std::filesystem::path dir = std::filesystem::path(args.setup.model_dir).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // "runs/x/"
    options.model_name = dir.filename().empty() ? "relay" : dir.filename().string();
  }
  options.token = *token;
  options.max_requests = args.max_requests;
  options.default_max_tokens = args.max_tokens;
  StatusOr<std::unique_ptr<serve::OpenAiServer>> server =
      serve::OpenAiServer::start(options, model, serving);
  if (!server.ok()) return fail(server.status());
  const int port = (*server)->port();
  if (!args.port_file.empty()) {
    if (Status w = write_file_atomic(args.port_file, absl::StrCat(port, "\n")); !w.ok()) {
      return fail(w);
    }
  }
  std::printf("relay serve: %s on http://%s:%d/v1 (chat template %s, context %lld)\n",
              options.model_name.c_str(), options.host.c_str(), port,
              model::chat_template_name(model.chat_template),
              static_cast<long long>(model.context));
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::fprintf(stderr, "relay serve: %s: stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  // Requests in flight end (aborted) before the server waits for its handlers.
  serving.stop();
  server->reset();
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& relay) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* app = relay.add_subcommand(
      "serve", "Serve a model directory over the OpenAI API (chat, completions, episodes)");
  app->add_option("config", args->setup.config_file, "YAML experiment config")->required();
  app->add_option("overrides", args->setup.overrides, "key.path=value overrides");
  app->add_option("--model", args->setup.model_dir, "Model directory to serve")->required();
  app->add_option("--listen", args->listen, "HOST:PORT to listen on (port 0 = any free port)");
  app->add_option("--port-file", args->port_file, "Write the port here once listening");
  app->add_option("--model-name", args->model_name,
                  "The model's name in the API (default: the model directory's name)");
  app->add_option("--token", args->token,
                  "Bearer token clients must send (default services.token_file, then "
                  "$RELAY_TOKEN; none when all are empty)");
  app->add_option("--max-requests", args->max_requests,
                  "Requests in flight at once; more are answered 429");
  app->add_option("--max-tokens", args->max_tokens,
                  "max_tokens of a chat request that gives none (within the context)");
  return {app, [args] { return serve(*args); }};
}

}  // namespace relay::cli
