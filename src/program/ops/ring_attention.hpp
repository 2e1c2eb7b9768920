#pragma once
// Ring attention's implementation (ring_attention.cpp), for the benchmark that measures what its
// communication costs: with `communicate` false every key/value block stays where it is (the
// ring's computation alone, on the wrong blocks: its values mean nothing).
#include <optional>
#include <string>

#include "shardplan/array.hpp"
#include "shardplan/shard_map.hpp"

namespace shardplan::detail {

/// The checks context parallelism's kernels share (shard_map.hpp: ring_attention,
/// allgather_kv_attention, ulysses_attention): shapes, heads, dtypes, and an even block when
/// causal. Throws SpecError "[op] why: q ..., k ..., v ...".
void check_context_operands(const char* op, const Array& q, const Array& k, const Array& v,
                            bool is_causal);

Array ring_attention_impl(const Array& q, const Array& k, const Array& v, const std::string& axis,
                          bool is_causal, std::optional<double> scale, bool communicate,
                          RingRotate rotate = RingRotate::kPermute);

}  // namespace shardplan::detail
