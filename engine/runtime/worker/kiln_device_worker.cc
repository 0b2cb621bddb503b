// The device worker kilnd starts per isolated device (engine/runtime/worker_server.h).
#include "engine/runtime/worker_server.h"

int main(int argc, char** argv) { return kiln::runtime::worker::WorkerMain(argc, argv); }
