// kiln_bench's small-batch subcommands (issue 12 item 1), in their own file:
//
//   kiln_bench mlp [--batches 1,64] [--rounds 7] [--iters 200] [--threads 2] [--export DIR]
//   kiln_bench fixed_cost [--rounds 7] [--iters 2000] [--threads 2]
//
// `mlp` times the 784-512-512-10 MLP (tests/e2e/models.h) through
// Engine::Run with its params in a ParamSet, and beside it, A B A B, the same
// three layers as oneDNN's own matmul primitives (weights reordered once into
// oneDNN's preferred layout, bias and ReLU as post-ops): oneDNN is the
// in-process peer; bench/mlp_vs_ort.py adds ONNX Runtime from the files
// `--export` writes. It also prints each layer's kernel time from the
// dispatch report next to the same layer alone in oneDNN.
// `fixed_cost` times the executor's per-run cost on a one-kernel graph
// (y = x + 1 on 16 floats), with and without a dispatch report.
#pragma once

#include <map>
#include <string>

namespace kiln::bench {

int MlpBench(const std::map<std::string, std::string>& flags);
int FixedCostBench(const std::map<std::string, std::string>& flags);

}  // namespace kiln::bench
