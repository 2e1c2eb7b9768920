#pragma once

// The public headers of shardplan, and nothing else.
#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/plan_report.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"
#include "shardplan/tree_struct.hpp"
