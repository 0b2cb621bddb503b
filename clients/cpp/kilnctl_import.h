// `kilnctl import` (clients/cpp/kilnctl_import.cc): registers the subcommand on
// kilnctl's CLI11 app. Its callback converts the model and exits the process
// with 0 or 1, so kilnctl's own dispatch needs no entry for it.
#pragma once

#include "CLI/CLI.hpp"

namespace kiln {

void AddImportCommand(CLI::App& app);

}  // namespace kiln
