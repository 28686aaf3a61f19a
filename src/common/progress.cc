#include "relay/common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace relay {

Progress::Progress(std::string label, int64_t total, std::FILE* out, bool terminal,
                   ProgressOptions options)
    : label_(std::move(label)),
      total_(std::max<int64_t>(1, total)),
      out_(out),
      terminal_(terminal),
      options_(options),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::hours(1)) {
  draw(0, "", false);
}

Progress::Progress(std::string label, int64_t total)
    : Progress(std::move(label), total, stdout, is_terminal(stdout)) {}

Progress::~Progress() { finish(detail_); }

bool Progress::is_terminal(std::FILE* out) {
  if (out == nullptr || ::isatty(::fileno(out)) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

void Progress::update(int64_t done, const std::string& detail) {
  if (finished_) return;
  done_ = std::clamp<int64_t>(done, 0, total_);
  detail_ = detail;
  draw(done_, detail, false);
}

void Progress::finish(const std::string& detail) {
  if (finished_) return;
  finished_ = true;
  draw(done_, detail, true);
}

void Progress::draw(int64_t done, const std::string& detail, bool final) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int tenth = static_cast<int>(done * 10 / total_);
  if (terminal_) {
    if (!final && done < total_ &&
        std::chrono::duration<double>(now - last_draw_).count() < options_.min_redraw_s) {
      return;
    }
    const int filled = static_cast<int>(done * options_.bar_width / total_);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(options_.bar_width - filled), '.');
    // \r and clear-to-end-of-line: the line is redrawn where it stands.
    std::fprintf(out_, "\r\033[K%s [%s] %lld/%lld%s%s  %.1fs%s", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_),
                 detail.empty() ? "" : "  ", detail.c_str(), elapsed, final ? "\n" : "");
  } else {
    // Plain lines: each new tenth after the start and before the end, and
    // the end (a phase shorter than a tenth prints one line).
    if (!final && (tenth == last_tenth_ || tenth == 0 || tenth >= 10)) return;
    std::fprintf(out_, "%s %lld/%lld%s%s  %.1fs%s\n", label_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), detail.empty() ? "" : "  ", detail.c_str(),
                 elapsed, final ? "  done" : "");
  }
  last_tenth_ = tenth;
  last_draw_ = now;
  std::fflush(out_);
}

}  // namespace relay
