// Training checkpoints (docs/training.md, "Checkpoints"): one safetensors
// file (engine/io/safetensors.h) holding every param and every optimizer-state
// tensor of a training session by name ("w1", "opt/w1/m", ..., "opt/step"),
// and in `__metadata__`:
//   format          "kiln.checkpoint"
//   format_version  "1" (a reader refuses a newer version)
//   step            the steps taken (equal to the opt/step tensor)
//   training_spec   the session's kiln.v1.TrainingSpec as protobuf JSON (loss,
//                   trained params, optimizer, schedule)
//   graph_sha256    GraphIdentity() of the graph the session trains
// plus the caller's own keys (CheckpointInfo::extra; kilnctl's data order).
//
// The client writes the file from GetParams and restores it with SetParams:
// kilnd never touches the file system for a checkpoint. Restoring checks
// the file before anything is sent (the spec, the graph and every param of
// the session, named and typed as the graph declares); kilnd checks the
// optimizer-state tensors' names and types (SetParams) and that the state is
// complete (the next step). Resuming on the same device and build continues
// the run bit for bit: the next step sees the same params and state.
//
// Thread safety: free functions; a Client may be shared (client.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "clients/cpp/client.h"
#include "kiln/v1/service.pb.h"
#include "kiln/v1/train.pb.h"

namespace kiln {

inline constexpr char kCheckpointFormat[] = "kiln.checkpoint";
inline constexpr int kCheckpointVersion = 1;

// What a checkpoint records about its session, and what a restore demands.
struct CheckpointInfo {
  v1::TrainingSpec training;  // the session's spec, as sent to CreateSession
  std::string graph_sha256;   // GraphIdentity(the session's graph)
  // The caller's keys, saved as given and handed back by a restore. Names
  // must not be those of the metadata above.
  std::map<std::string, std::string> extra;
};

// The SHA-256 (hex) of the graph as sent: the GraphSource's deterministic
// protobuf serialization. The same .kiln text or proto gives the same value
// from any client (the Python client computes it the same way).
std::string GraphIdentity(const v1::GraphSource& graph);

// Reads the params and optimizer state of the training session `session_id`
// (GetParams) and writes them with `info` to `path` atomically (a temporary
// file, fsync, rename). A session that has not stepped yet has no state: its
// checkpoint holds the params and opt/step = 0. Returns the step saved.
absl::StatusOr<int64_t> SaveCheckpoint(const Client& client, const std::string& session_id,
                                       const std::string& path, const CheckpointInfo& info);

struct RestoredCheckpoint {
  int64_t step = 0;
  std::map<std::string, std::string> metadata;  // every key, the caller's included
};

// Reads `path` and checks it against `expect` and the session's `signature`
// (CreateSessionResponse.signature): the format and version, the training
// spec (a mismatch names the differing field), the graph identity, every param
// of the graph present with its declared type, no tensor that is neither a
// param nor under "opt/", opt/step an i64 scalar equal to the metadata's step.
// Then uploads every tensor to the session (SetParams). INVALID_ARGUMENT (or
// the file reader's status) naming what is wrong; nothing is sent then.
absl::StatusOr<RestoredCheckpoint> RestoreCheckpoint(const Client& client,
                                                     const std::string& session_id,
                                                     const v1::Signature& signature,
                                                     const std::string& path,
                                                     const CheckpointInfo& expect);

}  // namespace kiln
