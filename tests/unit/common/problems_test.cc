#include "relay/common/problems.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "relay/common/name_table.h"

namespace relay {
namespace {

TEST(ProblemsTest, NestedViewsReportFullPathsIntoOneList) {
  Problems root("trainer");
  Problems ppo = root.at("ppo");
  ppo.in_range("clip_low", 2, 0, 1, /*open_hi=*/true);
  root.at_least("ppo_epochs", 0, 1);
  ASSERT_EQ(root.list().size(), 2u);
  EXPECT_EQ(root.list()[0].path, "trainer.ppo.clip_low");
  EXPECT_EQ(root.list()[0].what, "must be in [0, 1), got 2");
  EXPECT_EQ(root.list()[1].path, "trainer.ppo_epochs");
  EXPECT_EQ(root.status().message(),
            "trainer.ppo.clip_low: must be in [0, 1), got 2\n"
            "trainer.ppo_epochs: must be >= 1, got 0");
  EXPECT_EQ(ppo.path("clip_high"), "trainer.ppo.clip_high");
}

TEST(ProblemsTest, RulesRejectNanAndAcceptTheirBounds) {
  Problems p;
  p.positive("a", std::nan(""));
  p.non_negative("b", std::nan(""));
  p.finite("c", std::numeric_limits<double>::infinity());
  p.positive("ok1", 1e-300);
  p.non_negative("ok2", 0);
  p.in_range("ok3", 1, 0, 1);
  p.zero_or_above("ok4", 0, 1, "1");
  p.zero_or_above("d", 1, 1, "1");
  p.non_empty("e", "");
  ASSERT_EQ(p.list().size(), 5u) << p.status();
  EXPECT_EQ(p.list()[0].path, "a");
  EXPECT_EQ(p.list()[3].what, "must be 0 (off) or > 1, got 1");
  EXPECT_EQ(p.list()[4].what, "must be non-empty, got ''");
  EXPECT_TRUE(Problems().status().ok());
}

enum class Fruit { kApple, kPear };
const NameTable<Fruit> kFruitNames{
    "fruit", {{"apple", Fruit::kApple}, {"pear", Fruit::kPear}, {"malus", Fruit::kApple}}};

TEST(NameTableTest, ParsesEveryNameAndNamesEachValueCanonically) {
  EXPECT_EQ(*kFruitNames.parse("pear"), Fruit::kPear);
  EXPECT_EQ(*kFruitNames.parse("malus"), Fruit::kApple);
  EXPECT_STREQ(kFruitNames.name(Fruit::kApple), "apple");  // the first name listed
  StatusOr<Fruit> bad = kFruitNames.parse("Pear");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown fruit 'Pear'; known: apple, pear, malus");
}

}  // namespace
}  // namespace relay
