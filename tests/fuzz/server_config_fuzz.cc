// kilnd's config textproto (server/config.h) on arbitrary text: parse, fill the
// defaults and validate, as LoadConfig does; an error or a config, never a crash.
// A config that validates is validated again after a text round trip.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "google/protobuf/text_format.h"
#include "server/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kiln::v1::ServerConfig> config = kiln::server::ParseConfigText(text, "fuzz");
  if (!config.ok()) return 0;
  kiln::server::ApplyDefaults(*config);
  if (!kiln::server::ValidateConfig(*config).ok()) return 0;
  (void)kiln::server::VerifyOptionsFrom(config->limits());
  std::string printed;
  if (!google::protobuf::TextFormat::PrintToString(*config, &printed)) std::abort();
  absl::StatusOr<kiln::v1::ServerConfig> again = kiln::server::ParseConfigText(printed, "again");
  if (!again.ok()) {
    std::fprintf(stderr, "a valid config does not parse again: %s\n",
                 again.status().ToString().c_str());
    std::abort();
  }
  kiln::server::ApplyDefaults(*again);
  if (absl::Status s = kiln::server::ValidateConfig(*again); !s.ok()) {
    std::fprintf(stderr, "a valid config fails validation after a round trip: %s\n",
                 s.ToString().c_str());
    std::abort();
  }
  return 0;
}
