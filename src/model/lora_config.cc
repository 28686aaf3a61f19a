#include "relay/model/lora_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace relay::model {

void check(const LoraConfig& c, Problems problems) {
  if (c.rank < 0) problems.add("rank", "must be >= 0 (0 = no adapters)", c.rank);
  if (!c.enabled()) return;
  problems.positive("alpha", c.alpha);
  problems.in_range("dropout", c.dropout, 0, 1, /*open_hi=*/true);
  if (c.targets.empty()) {
    problems.add("targets", absl::StrCat("must name at least one projection of ",
                                         absl::StrJoin(kLoraProjections, ", "), ", or all-linear"));
  }
  for (const std::string& t : c.targets) {
    if (t != "all-linear" &&
        std::find(kLoraProjections.begin(), kLoraProjections.end(), t) == kLoraProjections.end()) {
      problems.add("targets",
                   absl::StrCat("'", t, "' is not a projection relay adapts (",
                                absl::StrJoin(kLoraProjections, ", "), ", or all-linear)"));
    }
  }
}

}  // namespace relay::model
