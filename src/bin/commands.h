#pragma once

// The `relay` command line's subcommands. Each lives in its own file
// (bin/<name>_command.cc), which registers the command's flags on the CLI
// next to the code that runs it; relay_main.cc lists them. A command returns
// the process exit code: 0 on success, 1 when the input is bad or an
// operation fails (with a one-line "relay <command>: <message>" on stderr),
// never an uncaught exception. Results go to stdout; logs go to stderr.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "relay/common/status.h"

namespace CLI {
class App;
}

namespace relay::cli {

// A subcommand registered on `relay`'s CLI: `app` is its parser (parsed()
// once it was chosen) and `run` what it does then, with the flags parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// One per subcommand, in the order `relay --help` lists them.
Command add_config_command(CLI::App& relay);       // config check: validate and print a config
Command add_init_command(CLI::App& relay);         // init: a fresh model directory
Command add_score_command(CLI::App& relay);        // score: per-token log-probs
Command add_tokenize_command(CLI::App& relay);     // tokenize: text <-> ids
Command add_generate_command(CLI::App& relay);     // generate: sample with the KV cache
Command add_rollout_command(CLI::App& relay);      // rollout: K samples per task prompt, scored
Command add_run_command(CLI::App& relay);          // run: trainer + workers, supervised
Command add_eval_command(CLI::App& relay);         // eval: held-out accuracy and pass@k
Command add_store_command(CLI::App& relay);        // store inspect: the rollout store
Command add_train_local_command(CLI::App& relay);  // train-local: the loop in one process
Command add_report_command(CLI::App& relay);       // report: the dashboard as one HTML file
Command add_serve_command(CLI::App& relay);        // serve: the OpenAI-compatible endpoint
Command add_export_command(CLI::App& relay);       // export: an HF directory, LoRA merged
Command add_env_command(CLI::App& relay);          // env: LibTorch, devices, BLAS kernels, threads

// Prints "relay <command>: <status message>" on stderr; returns 1.
int fail(const std::string& command, const Status& status);

// "1, 2,3" -> {1, 2, 3}; errors name the bad item.
bool parse_ids(const std::string& text, std::vector<int64_t>* ids, std::string* error);

}  // namespace relay::cli
