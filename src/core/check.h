// Error handling: every failed check throws rn::Error with the file, the line, the
// failed condition and a message. Library code never aborts on bad input; the CLI
// catches rn::Error at the top and prints it.
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
  CheckMessage(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": ";
    if (condition != nullptr) stream_ << "check failed: " << condition << ": ";
  }
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  std::string str() const { return stream_.str(); }

 private:
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

#define RN_CHECK_EQ(a, b) RN_CHECK((a) == (b)) << #a << "=" << (a) << " " << #b << "=" << (b) << " "
