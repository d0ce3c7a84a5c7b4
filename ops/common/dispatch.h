// Turning a run-time choice into a compile-time constant, in one place.
//
//   dispatch_value<1, 2, 4, 8>(items, [&](auto kItems) { launch<kItems()>(...); });
//
// calls the lambda with std::integral_constant for the matching value; an unmatched value returns
// false so the caller can report it with the allowed values (see allowed_values()).
#pragma once

#include <string>
#include <type_traits>

namespace kiln {

template <auto... Values, typename V, typename F>
bool dispatch_value(V value, F&& f) {
  return ((value == Values ? (f(std::integral_constant<decltype(Values), Values>{}), true) : false) || ...);
}

template <auto... Values>
std::string allowed_values() {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + std::to_string(Values)), ...);
  return s;
}

}  // namespace kiln
