#pragma once
/// Error values shared by every Grace domain.
///
/// Expected failures are values, modelled on KJ's taxonomy; restart policy
/// switches on the kind (`errc`), never on the message text.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace grace {

enum class errc : uint8_t {
  ok = 0,
  failed,         ///< a bug or an unrecoverable backend failure
  overloaded,     ///< transient: retry later (timeouts, full queues)
  disconnected,   ///< a peer was lost: reconnect or restart the group
  preempted,      ///< the job must stop and be restarted
  invalid_input,  ///< bad configuration, CLI, message or checkpoint
};

const char* to_string(errc e) noexcept;

/// An error value: a kind plus a one-line human message naming what was
/// wrong and, where possible, what to do about it.
struct error {
  errc code = errc::failed;
  std::string message;
  error() = default;
  error(errc c, std::string m) : code(c), message(std::move(m)) {}
  std::string what() const { return std::string(to_string(code)) + ": " + message; }
};

/// The error for bad input (configuration, a command line, a message, a file).
inline error invalid_input(std::string message) { return error{errc::invalid_input, std::move(message)}; }

/// A value or an error (a minimal `expected`, C++17 has none).
template <class T>
class result {
public:
  result(T v) : v_(std::move(v)) {}
  result(error e) : v_(std::move(e)) {}
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  const error& err() const { return std::get<1>(v_); }

private:
  std::variant<T, error> v_;
};

/// Success or an error.
class status {
public:
  status() = default;
  status(error e) : e_(std::move(e)) {}
  static status success() { return {}; }
  bool ok() const noexcept { return !e_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }
  const error& err() const { return *e_; }

private:
  std::optional<error> e_;
};

}  // namespace grace
