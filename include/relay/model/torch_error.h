#pragma once

// The message of an exception for a person to read. A c10::Error's what() is
// the message followed by the C++ stack trace of where LibTorch threw it
// (a dozen lines or more of frames); what_without_backtrace() is the message
// alone. Every place that turns a caught exception into a Status or a printed
// line goes through this, so no stack trace reaches a user.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace relay::model {

inline std::string exception_message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace relay::model
