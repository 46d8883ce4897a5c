// Reading JSON from files a user hands us (weights headers, rank tables, shard manifests).
//
// json_integer(): an integer field checked for type and range. nlohmann's get<int>() of a
// double converts it (undefined behaviour when it is out of range: 3e79 as an int64_t), and
// of a larger integer truncates it (2^32 + 1 reads as 1), so a count or a version read
// that way can be any value at all.
//
// parse_json_refusing_duplicates(): nlohmann::json::parse, but a key given twice in one object
// (at any depth) is named in `duplicate` instead of the later value silently replacing the
// earlier one: in a rank table or a header, which of two values was meant is not ours to guess.
//
// json_excerpt(): a short rendering of a JSON value for an error message about it.
//
// nlohmann::json::dump() recurses once per level of nesting, so dumping a value read from a
// file (a weights header, a rank table) that nests a few hundred thousand arrays deep
// overflows the stack: a crash where the file deserved an error. json_excerpt() descends
// at most kJsonExcerptDepth levels (deeper values show as [...] or {...}), stops adding
// members once the text is long enough, and cuts it at max_chars (on a UTF-8 character
// boundary) with "..." after the cut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rn {

// The largest count (records, elements, steps) the readers accept: 2^40, far beyond any real
// file (the shard index has the same limit), and small enough that a sum of 2^23 of them (more
// than any file holds) cannot overflow int64.
inline constexpr int64_t kJsonMaxCount = int64_t{1} << 40;

// The value of `v` if it is a JSON integer in [lo, hi] (a number written without a fraction
// or exponent); empty otherwise, doubles included.
inline std::optional<int64_t> json_integer(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(u) < lo || static_cast<int64_t>(u) > hi) return {};
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) return {};
    return i;
  }
  return {};
}

// Throws what nlohmann::json::parse throws for text that is not JSON. `duplicate` receives the
// first key found twice in one object (empty when none).
inline nlohmann::json parse_json_refusing_duplicates(std::string_view text, std::string& duplicate) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  duplicate.clear();
  auto on_event = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) keys.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == nlohmann::json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  return nlohmann::json::parse(text, on_event);
}

inline constexpr int kJsonExcerptDepth = 4;

namespace detail {

inline void append_json_excerpt(std::string& out, const nlohmann::json& j, int depth, size_t budget) {
  if (!j.is_structured()) {
    if (j.is_string() && j.get_ref<const std::string&>().size() > budget) {
      // A long string: only its start can show (replace: the cut may split a character).
      const nlohmann::json head(j.get_ref<const std::string&>().substr(0, budget));
      out += head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      return;
    }
    out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // a scalar: no recursion
    return;
  }
  const bool object = j.is_object();
  if (j.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  if (depth == 0) {
    out += object ? "{...}" : "[...]";
    return;
  }
  out += object ? '{' : '[';
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (out.size() > budget) {
      out += ",...";
      break;
    }
    if (!first) out += ',';
    first = false;
    if (object) {
      append_json_excerpt(out, nlohmann::json(it.key()), 0, budget);
      out += ':';
    }
    append_json_excerpt(out, *it, depth - 1, budget);
  }
  out += object ? '}' : ']';
}

}  // namespace detail

inline std::string json_excerpt(const nlohmann::json& j, size_t max_chars = 120) {
  std::string out;
  detail::append_json_excerpt(out, j, kJsonExcerptDepth, max_chars);
  if (out.size() > max_chars) {
    size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    out.resize(cut);
    out += "...";
  }
  return out;
}

}  // namespace rn
