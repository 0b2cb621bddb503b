// kiln-device-worker's command line (worker_server.h). Started by kilnd, never
// by hand: the socket and the staging region arrive as inherited descriptors.
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "engine/runtime/worker_server.h"

namespace kiln::runtime::worker {

int WorkerMain(int argc, char** argv, const DeviceWrapper& wrap) {
  CLI::App app{"kiln-device-worker: serves one device to kilnd over a socket it inherits"};
  ServeOptions o;
  int64_t parent_pid = 0;
  app.add_option("--backend", o.backend, "the backend to create")->required();
  app.add_option("--device", o.device_index, "the index of the device to serve");
  app.add_option("--cache_dir", o.backend_options.cache_dir, "kilnd's compile cache");
  app.add_option("--cache_max_bytes", o.cache_max_bytes, "the compile cache's budget");
  app.add_option("--cpu_threads", o.backend_options.cpu_threads, "host threads (0 = every core)");
  app.add_option("--socket_fd", o.socket_fd, "the socket to kilnd");
  app.add_option("--shm_fd", o.shm_fd, "the shared staging region");
  app.add_option("--arena_fd", o.arena_fd, "kilnd's host arena (base/host_arena.h)");
  app.add_option("--queue_spin_us", o.queue_spin_micros,
                 "how long a stream's thread polls its queue before it sleeps");
  app.add_option("--parent_pid", parent_pid, "kilnd's pid: exit at once if it is gone");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (parent_pid != 0 && ::getppid() != parent_pid) return 0;  // kilnd died before we started
  return Serve(o, wrap);
}

}  // namespace kiln::runtime::worker
