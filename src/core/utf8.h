// UTF-8 well-formedness, for names that are recorded in UTF-8 text (config.yaml, JSON
// headers): a byte that is not UTF-8 would be replaced there, or refused by the JSON writer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rn {

// The offset of the first byte of `text` that does not belong to well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF), or npos. A YAML file is UTF-8
// text: yaml-cpp reads other bytes as they are but writes U+FFFD for them, so a string value
// holding them would not survive the run folder's config.yaml.
inline size_t invalid_utf8_at(std::string_view text) {
  const auto byte = [text](size_t k) { return static_cast<unsigned char>(text[k]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char b = byte(i);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong below U+0800
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong below U+10000
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// `text` for a message: well-formed UTF-8 as it is, and every byte that is not (or is an ASCII
// control character, as an escape sequence would be) as \xNN. A parser's error quotes the
// bytes it stopped at, which in a damaged binary file would reach the terminal raw.
inline std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto escape = [&out](unsigned char c) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
  };
  size_t i = 0;
  while (i < text.size()) {
    const size_t bad = invalid_utf8_at(text.substr(i));
    const size_t good_end = bad == std::string_view::npos ? text.size() : i + bad;
    for (; i < good_end; ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (c < 0x20 || c == 0x7f)
        escape(c);
      else
        out += text[i];
    }
    if (i < text.size()) escape(static_cast<unsigned char>(text[i++]));
  }
  return out;
}

}  // namespace rn
