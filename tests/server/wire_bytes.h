#ifndef KNAPFORMER_TESTS_SERVER_WIRE_BYTES_H_
#define KNAPFORMER_TESTS_SERVER_WIRE_BYTES_H_

// Protobuf's encoding written by hand, for requests no conforming encoder
// sends (unpacked values, unknown fields, groups) and for requests too large
// to build as messages in a test's memory.

#include <cstdint>
#include <string>

namespace knapformer::testing_util {

inline std::string Varint(uint64_t value) {
  std::string out;
  do {
    out.push_back(static_cast<char>((value & 0x7f) | (value > 0x7f ? 0x80 : 0)));
    value >>= 7;
  } while (value != 0);
  return out;
}

inline std::string Tag(int number, int wire_type) {
  return Varint(static_cast<uint64_t>(number) << 3 | wire_type);
}

// A length-delimited field.
inline std::string Field(int number, const std::string& payload) {
  return Tag(number, 2) + Varint(payload.size()) + payload;
}

}  // namespace knapformer::testing_util

#endif  // KNAPFORMER_TESTS_SERVER_WIRE_BYTES_H_
