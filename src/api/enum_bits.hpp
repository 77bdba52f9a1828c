// Enums that come through the C ABI are read as the integers they hold: from C (or from a struct
// filled by memset) an enum object may hold any int, which C++ does not allow an enum to be loaded
// as (UBSan's -fsanitize=enum stops there). Compare the integer; convert back only once valid.
#pragma once

#include <cstdint>
#include <cstring>

namespace jfa::detail {

template <typename Enum>
int32_t enum_bits(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "the C ABI's enums are 32-bit");
  int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

}  // namespace jfa::detail
