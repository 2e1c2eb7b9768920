#!/usr/bin/env bash
# Plans the published runs that tests/published_runs_test.cpp does not contain (docs/validation.md,
# "Held out") with their settings, one line each: planned peak (live bytes), the caching allocator
# model's reserved bytes (a segment per cudaMalloc, and with expandable segments) and tokens/s per
# device beside the published figures ("-" where none is published) and the fits verdict.
# Usage: scripts/held_out_runs.sh [path to the shardplan binary, default build-release/shardplan]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build-release/shardplan}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Llama 2's config.json fields the step reads (meta-llama/Llama-2-13b-hf, Llama-2-70b-hf).
mkdir -p "$tmp/l2-13b" "$tmp/l2-70b"
echo '{"model_type": "llama", "vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
  "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40}' > "$tmp/l2-13b/config.json"
echo '{"model_type": "llama", "vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672,
  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}' > "$tmp/l2-70b/config.json"
l3_8b=tests/data/hf_configs/Meta-Llama-3-8B
l3_70b=tests/data/hf_configs/Meta-Llama-3-70B
opsac=names:query_proj,value_proj,context,mlpwi_0,mlpwo  # torchtitan's op-SAC (docs/validation.md)
# Each row is planned through the declared stack of its torchtitan version (docs/training.md
# "Training stacks"), set in $stack before the rows; the row's own settings are options over it.
run() {  # label, published GiB, published tok/s, train-plan arguments...
  local label=$1 gib=$2 tps=$3 out
  shift 3
  out=$("$bin" train-plan --stack "$stack" --headroom 0 "$@" 2>&1) || {
    echo "$label: $out"
    return
  }
  printf '%-40s peak %9s GiB, reserved %9s (expandable %9s) (published %5s)  tok/s %6s (published %5s)  %s\n' "$label" \
    "$(awk '/^  peak/ {print $2}' <<<"$out")" \
    "$(awk '/^  reserved \(caching allocator model\)/ {print $5}' <<<"$out")" \
    "$(awk '/^  reserved \(caching allocator model\)/ {print $9}' <<<"$out")" "$gib" \
    "$(awk '/tokens\/s per device/ {print $4}' <<<"$out")" "$tps" \
    "$(grep -oE 'fits$|does NOT fit.*' <<<"$out")"
}
# torchtitan's A100 runs (mid-2024) were on AWS: its multinode_trainer.slurm was "optimized for
# AWS with EFA" ("Enable for A100": FI_PROVIDER=efa, 96 CPUs a task), and AWS's A100 80GB
# instance is the p4de (docs/validation.md). Each row is planned on it, then on a DGX A100's
# network (8 x 200 Gb/s a node) to show how much the network decides.
a100_rows() {  # hardware, label suffix
  local stack=torchtitan-2024-07  # eager by the stack (compile off then)
  local a100=(--hardware "$1" --rules preset:llama_fsdp --mesh fsdp:64)
  run "L3 8B, bs1, op-SAC, 64 A100$2" - 2973 -c $l3_8b "${a100[@]}" --batch 64 --seq 8192 --remat $opsac
  run "L3 70B, bs1, full AC, 64 A100$2" - 331 -c $l3_70b "${a100[@]}" --batch 64 --seq 8192 --remat full
  run "L2 13B, bs2, op-SAC, 64 A100$2" - 1904 -c "$tmp/l2-13b" "${a100[@]}" --batch 128 --seq 4096 --remat $opsac
  run "L2 70B, bs2, full AC, 64 A100$2" - 353 -c "$tmp/l2-70b" "${a100[@]}" --batch 128 --seq 4096 --remat full
  run "L2 70B, bs1, op-SAC, 64 A100$2" - 355 -c "$tmp/l2-70b" "${a100[@]}" --batch 64 --seq 4096 --remat $opsac
  run "L2 13B, bs2, no AC, 64 A100 (fit)$2" - 2162 -c "$tmp/l2-13b" "${a100[@]}" --batch 128 --seq 4096
  run "L2 70B, bs2, op-SAC, 64 A100 (OOM)$2" - - -c "$tmp/l2-70b" "${a100[@]}" --batch 128 --seq 4096 --remat $opsac
}
a100_rows a100-80g-p4de ""
stack=torchtitan-2024-12  # docs/performance.md of December 2024: compiled, Float8 rows
h100=(--hardware tests/data/hardware/h100-hbm2e-500w.yaml --compile --float8 --remat full)
run "L3.1 8B, CP table: fsdp:8, 32k" 83.9 3890 -c $l3_8b "${h100[@]}" --mesh fsdp:8 --seq 32768 --batch 8
run "L3.1 8B, CP table: fsdp:4,cp:2, 64k" 84.2 2540 -c $l3_8b "${h100[@]}" --mesh fsdp:4,cp:2 --seq 65536 --batch 4
run "L3.1 8B, CP table: fsdp:2,cp:4, 128k" 84.0 1071 -c $l3_8b "${h100[@]}" --mesh fsdp:2,cp:4 --seq 131072 --batch 2
run "L3.1 8B, CP table: fsdp:1,cp:8, 256k" 84.5 548 -c $l3_8b "${h100[@]}" --mesh fsdp:1,cp:8 --seq 262144 --batch 1
# The stack's tensor-parallel plan (--tp-plan modules): torchtitan's Float8ColwiseParallel /
# Float8RowwiseParallel (apply_tp with enable_float8).
run "L3.1 70B, fsdp:32,tp:8, Float8" 71.9 829 -c $l3_70b "${h100[@]}" --mesh fsdp:32,tp:8 --batch 512 --seq 8192 --tp-plan modules
# The same with torchtitan's experimental.enable_async_tensor_parallel (Table 4's "2D + AsyncTP"):
# --async-tp, the stack's tp collectives run under their products (docs/training.md "Async TP").
run "L3.1 70B, fsdp:32,tp:8, Float8, AsyncTP" 67.6 876 -c $l3_70b "${h100[@]}" --mesh fsdp:32,tp:8 --batch 512 --seq 8192 --tp-plan modules --async-tp
# pytorch/torchtitan 3537666 (2025-01-27; the figures again in 069bae2, #808): llama3_8b.toml as then (local batch 1 x 8192, op-SAC) with
# --training.compile, launched by run_llama_train.sh (expandable segments); bf16, then tensorwise
# float8 with float8 all-gather.
jan25=(-c $l3_8b --hardware tests/data/hardware/h100-hbm2e-500w.yaml --mesh fsdp:8 --batch 8 --seq 8192 --remat $opsac --compile)
run "L3 8B, bs1, op-SAC, compile (Jan 2025)" 47.65 5760 "${jan25[@]}"
run "L3 8B, bs1, op-SAC, compile, Float8" 47.32 7186 "${jan25[@]}" --float8
# The same runs' rowwise figure, in the message of pytorch/torchtitan 069bae2 (#808, 2025-02-27,
# "--model.converters float8 --training.compile --float8.recipe_name rowwise": 47.77 GiB,
# 6,468 tps, beside 47.65 / 5,760 for bf16 and 47.32 / 7,186 for tensorwise with float8
# all-gather): rowwise scaling, the weights gathered in bf16 (torchao's rowwise recipe).
run "L3 8B, bs1, op-SAC, compile, Float8 rowwise" 47.77 6468 "${jan25[@]}" --float8 --float8-recipe rowwise
# Launched with torchrun directly (the benchmark file's command, no PYTORCH_CUDA_ALLOC_CONF): the
# default allocator's figure ("reserved") is the one to compare; the others' is "expandable".
stack=torchtitan-2025-06  # the benchmark file of June 2025 (fused AdamW is not modelled)
h200=(--hardware h200 --rules preset:llama_fsdp --compile --float8 --remat names:context --seq 8192)
run "L3.1 8B, 32 H200, Float8" 47.96 10938 -c $l3_8b "${h200[@]}" --mesh fsdp:32 --batch 64
run "L3.1 8B, 64 H200, Float8" 46.97 10753 -c $l3_8b "${h200[@]}" --mesh fsdp:64 --batch 128
# NVIDIA dgxc-benchmarking llama3.1/README_8b.md (NeMo 24.09, DGX H100): Llama 3.1 8B BF16 on 8
# GPUs, TP 1, PP 1, CP 2, global batch 128 x 8192, micro-batch 1 (32 a step on each of the 4
# data-parallel ranks), Megatron's distributed optimizer (--optimizer-sharding zero1; the data
# axis is named fsdp because the preset shards the state over that name; the bf16 parameters
# are whole over it under zero1, as Megatron's data parallelism holds them).
stack=megatron-core
run "L3.1 8B BF16, dp 4 x cp 2, 32 micro-batches" - 10153 -c $l3_8b --hardware h100-sxm \
  --mesh fsdp:4,cp:2 --batch 128 --seq 8192 --grad-accum 32 --optimizer-sharding zero1
# Sensitivity: the A100 rows on a DGX A100 network instead (not the runs' cluster).
a100_rows a100-80g ", DGX net"
