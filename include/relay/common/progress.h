#pragma once

// Progress of a long phase (warm start, evaluation, checkpoint writing).
// On a terminal it is one line redrawn in place:
//   warm start [############............]  50/100  sft_loss 0.1234  3.1s
// Anywhere else (CI logs, files) a bar redrawn with '\r' is noise, so it is
// plain lines instead: one per tenth of the way, and one at the end.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace relay {

struct ProgressOptions {
  int bar_width = 24;
  // Redraws at most this often on a terminal (the last update always shows).
  double min_redraw_s = 0.1;
};

class Progress {
 public:
  // `total` >= 1 units of work; `terminal` says how to draw (see
  // is_terminal()).
  Progress(std::string label, int64_t total, std::FILE* out, bool terminal,
           ProgressOptions options = {});
  // On stdout, drawn as a bar when stdout is a terminal.
  Progress(std::string label, int64_t total);
  ~Progress();

  // `done` of `total` units are finished; `detail` is shown after the count.
  void update(int64_t done, const std::string& detail = "");
  // The phase is over (prints the final line once; the destructor calls it).
  void finish(const std::string& detail = "");

  // Whether `out` is a terminal that a redrawn bar makes sense on (not when
  // TERM is "dumb").
  static bool is_terminal(std::FILE* out);

 private:
  void draw(int64_t done, const std::string& detail, bool final);

  std::string label_;
  int64_t total_;
  std::FILE* out_;
  bool terminal_;
  ProgressOptions options_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int64_t done_ = 0;
  int last_tenth_ = -1;
  bool finished_ = false;
  std::string detail_;
};

}  // namespace relay
