// Value specialisation of ONNX models whose shapes depend on input values.
//
// Kiln's IR has static (or symbolic) shapes: no op's output extent depends on
// a tensor's contents. Some ONNX models have such values as graph inputs: a
// Loop's trip count M (its scan outputs stack M slices), a Reshape target, a
// Slice bound, a TopK k. Like XLA's and JAX's static arguments, an
// OnnxSpecializer treats the small integer inputs that determine shapes as
// part of the compile key: each distinct value is imported once (the input
// becomes a constant, so the Loop becomes a Scan of M steps), and the engine
// compiles that graph once per input-shape signature as usual (Engine's
// compile cache). The specialisations are bounded (least recently used
// dropped), and a value past the import limits (OnnxImportOptions::
// max_loop_iterations for a trip count) is the importer's clear error.
//
// Which inputs: a model that imports with every input left a run-time value
// needs none. Otherwise the candidates are the graph inputs of an integer or
// bool dtype with a static shape of at most 16 elements (scalars such as M,
// and the small vectors of a Reshape target or Pad list: ValueInputCandidates);
// the first
// specialisation imports with all of them fixed, then keeps only those whose
// value the import cannot do without (each one left out in turn), so a
// token id or a flag the shapes do not depend on stays a run-time input.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/host_tensor.h"
#include "engine/io/onnx/onnx_import.h"

namespace kiln::io {

class OnnxSpecializer {
 public:
  struct Options {
    OnnxImportOptions import;  // input_values must be empty: the specializer sets them
    int max_specializations = 16;
  };

  // Parses and imports `bytes` once without fixed values: a model that needs
  // none is served by that one import. Fails with the import's error when it
  // is not UNIMPLEMENTED, or when no input could be specialised on.
  static absl::StatusOr<std::unique_ptr<OnnxSpecializer>> Create(std::string bytes,
                                                                 Options options);

  // True when the model imports without any fixed value.
  bool generic() const { return generic_ != nullptr; }
  // The inputs specialised on (after the first specialisation: only those
  // the import needs), in graph order.
  std::vector<std::string> value_inputs() const;

  // The imported model for these input values (every graph input by name;
  // only the value inputs are read). Its graph's inputs are the model's
  // other inputs: run it with those.
  absl::StatusOr<std::shared_ptr<const OnnxModel>> For(
      std::span<const std::pair<std::string, const HostTensor*>> inputs);

  // Imports done so far (the generic one included), and specialisations held.
  int64_t imports() const;
  int cached() const;

 private:
  OnnxSpecializer() = default;
  absl::StatusOr<std::shared_ptr<const OnnxModel>> Import(
      const std::vector<std::pair<std::string, const HostTensor*>>& fixed);

  std::string bytes_;
  // The candidates' declared types: a value given must have its input's.
  std::map<std::string, std::pair<DType, Dims>> declared_;
  Options options_;
  std::shared_ptr<const OnnxModel> generic_;

  mutable absl::Mutex mu_;
  std::vector<std::string> value_inputs_ ABSL_GUARDED_BY(mu_);
  bool narrowed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t imports_ ABSL_GUARDED_BY(mu_) = 0;
  // Key: the value inputs' dtypes, dims and elements; most recent first.
  using Key = std::vector<int64_t>;
  std::list<std::pair<Key, std::shared_ptr<const OnnxModel>>> lru_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::list<std::pair<Key, std::shared_ptr<const OnnxModel>>>::iterator> index_
      ABSL_GUARDED_BY(mu_);
};

// What a server needs of a model it serves through an OnnxSpecializer before
// any value is known: the graph's inputs (initializers excluded) and outputs
// as declared (a dim_param is a symbol of that name; an unknown dim a symbol
// named "<value>.<axis>"; an output declared without a type has no dtype
// and no dims), and the initializers' values by name (every
// specialisation imported with all_initializers_as_params binds params of
// these names, so one param set serves them all).
struct OnnxInterface {
  std::vector<std::pair<std::string, v1::TensorType>> inputs, outputs;
  std::vector<std::pair<std::string, HostTensor>> initializers;
};
absl::StatusOr<OnnxInterface> ReadOnnxInterface(std::string_view bytes, const ir::InferLimits& limits);

// The graph inputs (initializers excluded) of an integer or bool dtype whose
// declared shape is static with at most 16 elements: what a specialiser may fix.
absl::StatusOr<std::vector<std::string>> ValueInputCandidates(std::string_view bytes);

}  // namespace kiln::io
