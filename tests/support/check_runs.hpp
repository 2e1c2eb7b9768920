#pragma once
// The check every test executable runs on each completed Program::run (check_runs.cpp), for
// tests of the check itself.
#include "../../src/program/compiler/compile.hpp"
#include "../../src/program/analysis/run_record.hpp"

namespace shardplan::detail::test {

/// Fails the running test (ADD_FAILURE) where `record` differs from what `program`'s cost says:
/// a step's collectives, the bytes per collective kind, the bytes a device held after a step.
void check_run(const Program& program, const RunRecord& record);

}  // namespace shardplan::detail::test
