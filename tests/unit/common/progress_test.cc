#include "relay/common/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace relay {
namespace {

// What a Progress wrote to a temporary file.
template <class Fn>
std::string capture(bool terminal, Fn&& fn) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  fn(f, terminal);
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[512];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(ProgressTest, PlainLinesWhenNotATerminal) {
  const std::string out = capture(false, [](std::FILE* f, bool t) {
    Progress p("warm start", 100, f, t);
    for (int i = 1; i <= 100; ++i) p.update(i, "sft_loss 0.5");
  });
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no carriage returns in a log";
  EXPECT_EQ(out.find("\033["), std::string::npos) << "no escape codes in a log";
  // Tenths 1..9 and the final line.
  EXPECT_EQ(count(out, "\n"), 10) << out;
  EXPECT_EQ(out.find("warm start 0/100"), std::string::npos) << out;
  EXPECT_NE(out.find("warm start 10/100"), std::string::npos) << out;
  EXPECT_NE(out.find("warm start 50/100  sft_loss 0.5"), std::string::npos) << out;
  EXPECT_NE(out.find("warm start 100/100  sft_loss 0.5"), std::string::npos) << out;
  EXPECT_NE(out.find("done\n"), std::string::npos) << out;
}

TEST(ProgressTest, OneRedrawnLineOnATerminal) {
  ProgressOptions o;
  o.min_redraw_s = 0;
  o.bar_width = 10;
  const std::string out = capture(true, [&](std::FILE* f, bool t) {
    Progress p("eval", 4, f, t, o);
    for (int i = 1; i <= 4; ++i) p.update(i);
    p.finish("accuracy 0.750");
    p.finish("twice");  // no second final line
  });
  EXPECT_EQ(count(out, "\n"), 1) << "a single line, ended once";
  EXPECT_EQ(count(out, "\r\033[K"), 6) << "start, four updates, the final draw";
  EXPECT_NE(out.find("eval [#####.....] 2/4"), std::string::npos) << out;
  EXPECT_NE(out.find("eval [##########] 4/4  accuracy 0.750"), std::string::npos) << out;
  EXPECT_EQ(out.find("twice"), std::string::npos);
}

TEST(ProgressTest, RedrawsAreRateLimitedButTheEndAlwaysShows) {
  ProgressOptions o;
  o.min_redraw_s = 3600;
  const std::string out = capture(true, [&](std::FILE* f, bool t) {
    Progress p("ckpt", 1000, f, t, o);
    for (int i = 1; i <= 1000; ++i) p.update(i);
  });
  EXPECT_EQ(count(out, "\r"), 3) << "the start, the last update (done == total) and the end";
  EXPECT_NE(out.find("1000/1000"), std::string::npos);
}

TEST(ProgressTest, AFileIsNotATerminal) {
  std::FILE* f = std::tmpfile();
  EXPECT_FALSE(Progress::is_terminal(f));
  std::fclose(f);
}

}  // namespace
}  // namespace relay
