#pragma once

// The dashboard page's template (dashboard_page.cc), kept apart from the C++
// that fills it in. Placeholders: @TITLE@ (HTML-escaped), @MODE@ ("live" or
// "report") and @RUN_DATA@ (the embedded <script type="application/json">
// element in report mode, empty when live).

namespace relay {

extern const char kDashboardPage[];

}  // namespace relay
