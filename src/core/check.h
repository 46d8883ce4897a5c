// Error handling: every failed check throws rn::Error. Its text is the message, written for the
// user (what is wrong, naming the file, key or tensor, and what to do), followed by where in the
// source it was raised ("... [trainer.cpp:196]"); a check without a message says which condition
// failed instead. Library code never aborts on bad input; the CLI catches rn::Error at the top
// and prints it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Thrown by a backend asked for a case it cannot run (dtype, layout, parameter).
// Callers may catch it to report "unsupported"; nothing falls back silently.
class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& what) : Error(what) {}
};

namespace detail {

class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* condition) : file_(file), line_(line), condition_(condition) {}
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  std::string str() const {
    const std::string message = stream_.str();
    std::string where = file_;
    where = where.substr(where.find_last_of('/') + 1) + ":" + std::to_string(line_);
    if (message.empty()) return where + ": check failed: " + (condition_ ? condition_ : "(no condition)");
    return message + " [" + where + "]";
  }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};

template <typename E>
struct Thrower {
  // `&` binds looser than `<<`, so the whole message is built before we throw.
  [[noreturn]] void operator&(const CheckMessage& message) const { throw E(message.str()); }
};

}  // namespace detail
}  // namespace rn

// RN_CHECK(cond) << "context";  throws rn::Error naming file, line and condition.
#define RN_CHECK(cond) \
  if (cond) {          \
  } else               \
    ::rn::detail::Thrower<::rn::Error>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, #cond)

// RN_FAIL() << "what went wrong";  unconditional error.
#define RN_FAIL() ::rn::detail::Thrower<::rn::Error>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr)

// RN_UNSUPPORTED() << "what";  a backend cannot run this case.
#define RN_UNSUPPORTED() \
  ::rn::detail::Thrower<::rn::Unsupported>{} & ::rn::detail::CheckMessage(__FILE__, __LINE__, nullptr)

#define RN_CHECK_EQ(a, b) \
  RN_CHECK((a) == (b)) << "expected " #a " == " #b ": " << #a << "=" << (a) << " " << #b << "=" << (b) << " "
