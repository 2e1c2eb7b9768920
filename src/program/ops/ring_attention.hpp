#pragma once
// Ring attention's implementation (ring_attention.cpp), for the benchmark that measures what its
// communication costs: with `communicate` false every key/value block stays where it is (the
// ring's computation alone, on the wrong blocks: its values mean nothing).
#include <optional>
#include <string>

#include "shardplan/array.hpp"
#include "shardplan/shard_map.hpp"

namespace shardplan::detail {

Array ring_attention_impl(const Array& q, const Array& k, const Array& v, const std::string& axis,
                          bool is_causal, std::optional<double> scale, bool communicate,
                          RingRotate rotate = RingRotate::kPermute);

}  // namespace shardplan::detail
