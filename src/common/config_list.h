// SPDX-License-Identifier: Apache-2.0
// The compiled configurations of a kernel family, as a type list. Each configuration
// type names its run-time key (`static constexpr Key key()`), which plan() picks and
// launch() looks up. Host and device code.
#pragma once

#include <type_traits>

namespace fusedstep {

template <class... Cfgs>
struct ConfigList {
  using Key = std::common_type_t<decltype(Cfgs::key())...>;
  static constexpr int kSize = sizeof...(Cfgs);
  static constexpr Key kKeys[] = {Cfgs::key()...};
};

// The configurations of two lists, in order.
template <class A, class B>
struct ConcatConfigs;
template <class... A, class... B>
struct ConcatConfigs<ConfigList<A...>, ConfigList<B...>> {
  using type = ConfigList<A..., B...>;
};

}  // namespace fusedstep
