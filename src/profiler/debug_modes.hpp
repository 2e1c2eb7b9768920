#pragma once
// The debug modes' recording side (private): whether any CommDebugMode or MemoryDebugMode is
// alive (Program::run reads it once per run), and where a run's counts go.
#include <atomic>
#include <map>
#include <string>

#include "shardplan/profiler.hpp"

namespace shardplan::profiler::detail {

extern std::atomic<int> g_comm_modes;    // CommDebugModes alive
extern std::atomic<int> g_memory_modes;  // MemoryDebugModes alive
inline bool comm_on() { return g_comm_modes.load(std::memory_order_relaxed) > 0; }
inline bool memory_on() { return g_memory_modes.load(std::memory_order_relaxed) > 0; }

/// One run's collectives, by scope then kind.
using ScopeCounts = std::map<std::string, std::map<CollectiveKind, CollectiveCount>>;
/// Adds `counts` to every CommDebugMode alive.
void add_comm(const ScopeCounts& counts);
/// Appends `run` to every MemoryDebugMode alive.
void add_memory(const MemoryRun& run);

}  // namespace shardplan::profiler::detail
