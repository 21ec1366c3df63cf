// trillium::Status: a small error value returned by fallible core operations.
//
// The core never throws for expected failures (out of blocks, bad ids from the caller); it returns
// a Status whose code says which kind of failure it was, so that the bindings can map each code to
// one Python exception type and C++ hosts need no exception handling.
#pragma once

#include <string>
#include <utility>

namespace trillium {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the caller passed a bad value (bad block id, double free, n < 0)
  kOutOfBlocks = 2,      // not enough free blocks; nothing was changed
  kInternal = 3,         // an internal invariant does not hold (a bug in the core)
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status OutOfBlocks(std::string m) { return {StatusCode::kOutOfBlocks, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace trillium
