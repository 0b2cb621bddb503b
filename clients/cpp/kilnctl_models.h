// kilnctl models: the server's model repository (list, load, unload).
#pragma once

#include <functional>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "clients/cpp/client.h"

namespace kiln {

struct ModelsFlags {
  std::string name;
  int64_t version = 0;
};

// Registers `kilnctl models [list|load|unload]`; returns the subcommand.
CLI::App* AddModelsCommand(CLI::App& app, ModelsFlags& flags);
// Runs it after parsing, connecting through `connect`.
absl::Status RunModelsCommand(const CLI::App& models, const ModelsFlags& flags,
                              const std::function<absl::StatusOr<std::unique_ptr<Client>>()>& connect);

// "NAME" or "NAME:VERSION" (kilnctl run --model) as a model ref.
absl::StatusOr<v1::ModelRef> ParseModelRef(const std::string& text);

}  // namespace kiln
