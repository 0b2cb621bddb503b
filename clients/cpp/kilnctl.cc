// kilnctl: the command-line client of kilnd (docs/clients.md).
//
//   kilnctl devices | health | cache stats
//   kilnctl compile model.kiln [--shape x=1,784]
//   kilnctl run model.kiln --input x=x.npy [--param w=w.npy | --params-dir dir]
//           [--out dir] [--report] [--trace trace.json] [--device auto|cpu:0|...]
//   kilnctl report [--last N | --request ID] [--trace trace.json]
//   global: --addr host:port --api-key KEY --tls --ca ca.pem --cert me.pem --key me.key
//           (or KILN_ADDR, KILN_API_KEY, KILN_TLS, KILN_CA, KILN_CERT, KILN_KEY)
//
// Exit status: 0 on success, 1 when kilnd (or a local file) answers an error,
// 2 on bad usage; `health` exits 3 when the server is up but not serving.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "clients/cpp/client.h"
#include "clients/cpp/graph_file.h"
#include "clients/cpp/kilnctl_import.h"
#include "clients/cpp/kilnctl_models.h"
#include "clients/cpp/kilnctl_train.h"
#include "clients/cpp/progress.h"
#include "clients/cpp/report_format.h"
#include "engine/io/gguf.h"
#include "engine/io/npy.h"
#include "engine/io/npz.h"
#include "engine/io/onnx/onnx_import.h"
#include "engine/io/safetensors.h"

namespace kiln {
namespace {

struct GlobalFlags {
  std::string addr = "127.0.0.1:7450";
  std::string api_key;
  bool tls = false;
  std::string ca, cert, key, tls_server_name;
  double timeout_s = 0;
  bool progress = false;
  bool no_shm = false;
  bool no_shm_run = false;
  bool no_shm_train_step = false;
};

struct RunFlags {
  std::string graph;
  std::string model;                 // NAME[:VERSION] of the server's repository
  std::vector<std::string> weights;  // .safetensors / .gguf files of params
  std::vector<std::string> inputs;   // name=path.npy
  std::vector<std::string> params;   // name=path.npy
  std::string params_dir;
  std::string out_dir;
  bool report = false;
  std::string trace;
  std::string device = "auto";
  int priority = 0;
  bool allow_tf32 = false;
  bool allow_int8_activations = false;
  v1::CudaGraphs cuda_graphs = v1::CUDA_GRAPHS_AUTO;
};

struct CompileFlags {
  std::string graph;
  std::vector<std::string> shapes;  // name=d0,d1,...
  std::string device = "auto";
  bool prefer_common_ir = false;
  bool no_fusion = false;
  bool allow_tf32 = false;
  bool allow_int8_activations = false;
  v1::CudaGraphs cuda_graphs = v1::CUDA_GRAPHS_AUTO;
};

struct ReportFlags {
  int last = 1;
  std::string request_id;
  std::string trace;
};

absl::StatusOr<std::unique_ptr<Client>> Connect(const GlobalFlags& g) {
  ClientOptions options;
  options.api_key = g.api_key;
  options.tls = g.tls;
  options.ca_file = g.ca;
  options.cert_file = g.cert;
  options.key_file = g.key;
  options.tls_server_name = g.tls_server_name;
  options.shared_memory = !g.no_shm;
  options.shm_runs = !g.no_shm_run;
  options.shm_train_steps = !g.no_shm_train_step;
  if (g.timeout_s > 0) options.timeout = absl::Seconds(g.timeout_s);
  return Client::Create(g.addr, options);
}

absl::StatusOr<std::pair<std::string, std::string>> SplitAssignment(const std::string& arg,
                                                                    const char* flag) {
  std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
  if (kv.first.empty() || kv.second.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " expects name=value, got '", arg, "'"));
  }
  return kv;
}

absl::Status LoadTensors(const std::vector<std::string>& args, const char* flag, TensorMap& out) {
  for (const std::string& arg : args) {
    KILN_ASSIGN_OR_RETURN(auto kv, SplitAssignment(arg, flag));
    KILN_ASSIGN_OR_RETURN(HostTensor t, ReadNpy(kv.second));
    if (!out.emplace(kv.first, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", kv.first, "' given twice"));
    }
  }
  return absl::OkStatus();
}

// Every `<name>.npy` in `dir` is the param `<name>`.
absl::Status LoadParamsDir(const std::string& dir, TensorMap& out) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::vector<std::filesystem::path> files;
  for (const auto& entry : it) {
    if (entry.path().extension() == ".npy") files.push_back(entry.path());
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, " holds no .npy files"));
  for (const auto& path : files) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, ReadNpy(path.string()));
    if (!out.emplace(path.stem().string(), std::move(t)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("param '", path.stem().string(), "' given by --param and --params-dir"));
    }
  }
  return absl::OkStatus();
}

// Params by tensor name from .safetensors, .gguf and .npz files (GGUF's quantized
// blocks stay quantized); a name in two places is an error.
absl::Status LoadWeightFiles(const std::vector<std::string>& files, TensorMap& out) {
  for (const std::string& file : files) {
    std::vector<std::pair<std::string, HostTensor>> tensors;
    if (absl::EndsWith(file, ".gguf")) {
      KILN_ASSIGN_OR_RETURN(io::GgufFile f, io::GgufFile::Open(file));
      for (const io::GgufTensorInfo& t : f.tensors()) {
        KILN_ASSIGN_OR_RETURN(HostTensor v, f.Read(t.name));
        tensors.emplace_back(t.name, std::move(v));
      }
    } else if (absl::EndsWith(file, ".npz")) {
      KILN_ASSIGN_OR_RETURN(tensors, io::ReadNpz(file));
    } else if (absl::EndsWith(file, ".safetensors")) {
      KILN_ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::Open(file));
      for (const io::SafetensorsEntry& e : f.tensors()) {
        KILN_ASSIGN_OR_RETURN(HostTensor v, f.Read(e.name));
        tensors.emplace_back(e.name, std::move(v));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--weights ", file, ": not a .safetensors, .gguf or .npz file"));
    }
    for (auto& [name, t] : tensors) {
      if (!out.emplace(name, std::move(t)).second) {
        return absl::InvalidArgumentError(absl::StrCat("param '", name, "' given twice (", file,
                                                       " and an earlier --param/--weights)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  f << content;
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string Preview(const HostTensor& t) {
  constexpr int64_t kShown = 8;
  std::vector<std::string> v;
  for (int64_t i = 0; i < std::min(t.num_elements(), kShown); ++i) {
    v.push_back(absl::StrFormat("%.6g", t.GetAsDouble(i)));
  }
  return absl::StrCat("[", absl::StrJoin(v, ", "), t.num_elements() > kShown ? ", ...]" : "]");
}

absl::Status CmdDevices(const GlobalFlags& g) {
  KILN_ASSIGN_OR_RETURN(auto client, Connect(g));
  KILN_ASSIGN_OR_RETURN(v1::ListDevicesResponse resp, client->ListDevices());
  std::vector<std::vector<std::string>> rows;
  for (const v1::DeviceInfo& d : resp.devices()) {
    const double peak = d.profile().peak_gflops_f32();
    rows.push_back({d.id(), d.backend(), d.name(), d.arch(), HumanBytes(d.memory_bytes()),
                    absl::StrCat(d.threads()),
                    peak > 0 ? absl::StrFormat("%.0f GFLOP/s", peak) : std::string("-"),
                    d.profile().calibrated() ? "yes" : "no", absl::StrCat(d.concurrent_runs()),
                    d.isolated() ? absl::StrCat("process ", d.worker_pid()) : std::string("kilnd"),
                    d.healthy() ? "healthy" : absl::StrCat("UNHEALTHY (", d.faults(), " faults)")});
  }
  std::printf(
      "%s",
      FormatTable({"id", "backend", "name", "arch", "memory", "threads", "peak f32", "calibrated",
                   "runs at once", "worker", "health"},
                  {false, false, false, false, true, true, true, false, true, false, false}, rows)
          .c_str());
  for (const v1::DeviceInfo& d : resp.devices()) {
    if (!d.fault().empty()) {
      std::printf("%s: last fault: %s (restarted %lld times)\n", d.id().c_str(), d.fault().c_str(),
                  static_cast<long long>(d.restarts()));
    }
  }
  for (const std::string& u : resp.unavailable()) std::printf("unavailable: %s\n", u.c_str());
  return absl::OkStatus();
}

int CmdHealth(const GlobalFlags& g, const std::string& service) {
  auto client = Connect(g);
  absl::StatusOr<ServingStatus> s =
      client.ok() ? (*client)->Health(service) : absl::StatusOr<ServingStatus>(client.status());
  if (!s.ok()) {
    std::fprintf(stderr, "kilnctl: %s: %s\n", g.addr.c_str(), s.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*s).c_str());
  return *s == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 3;
}

absl::Status CmdCacheStats(const GlobalFlags& g) {
  KILN_ASSIGN_OR_RETURN(auto client, Connect(g));
  KILN_ASSIGN_OR_RETURN(v1::ServerInfoResponse info, client->ServerInfo());
  const v1::CacheInfo& c = info.cache();
  const int64_t lookups = c.memory_hits() + c.disk_hits() + c.misses();
  std::printf("server        kilnd %s (compiler %s), up %lld s, tenant %s\n",
              info.version().c_str(), info.compiler_version().c_str(),
              static_cast<long long>(info.uptime_seconds()), info.tenant().c_str());
  if (!c.server_wide()) {
    // A tenant that is not an admin sees its own compiles only.
    std::printf("executables   %lld memory hits, %lld disk hits, %lld misses (this tenant's)\n",
                static_cast<long long>(c.memory_hits()), static_cast<long long>(c.disk_hits()),
                static_cast<long long>(c.misses()));
    return absl::OkStatus();
  }
  std::printf("cache dir     %s\n", c.dir().empty() ? "(disk cache off)" : c.dir().c_str());
  std::printf("executables   %lld memory hits, %lld disk hits, %lld misses (hit rate %s)\n",
              static_cast<long long>(c.memory_hits()), static_cast<long long>(c.disk_hits()),
              static_cast<long long>(c.misses()),
              lookups > 0
                  ? absl::StrFormat("%.1f%%", 100.0 * (lookups - c.misses()) / lookups).c_str()
                  : "-");
  std::printf("kernels       %lld hits, %lld misses\n", static_cast<long long>(c.kernel_hits()),
              static_cast<long long>(c.kernel_misses()));
  std::printf("disk          %lld entries, %s\n", static_cast<long long>(c.disk_entries()),
              HumanBytes(c.disk_bytes()).c_str());
  std::printf("evictions     %lld\ncorrupt       %lld\n", static_cast<long long>(c.evictions()),
              static_cast<long long>(c.corrupt()));
  return absl::OkStatus();
}

absl::Status CmdCompile(const GlobalFlags& g, const CompileFlags& f) {
  KILN_ASSIGN_OR_RETURN(v1::GraphSource graph, LoadGraphFile(f.graph));
  std::vector<std::pair<std::string, Dims>> shapes;
  for (const std::string& arg : f.shapes) {
    KILN_ASSIGN_OR_RETURN(auto kv, SplitAssignment(arg, "--shape"));
    Dims dims;
    for (absl::string_view d : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      int64_t v;
      if (!absl::SimpleAtoi(d, &v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--shape ", arg, ": '", std::string(d), "' is not a size"));
      }
      dims.push_back(v);
    }
    shapes.emplace_back(kv.first, std::move(dims));
  }
  v1::CompileOptions options;
  options.set_device(f.device);
  options.set_prefer_common_ir(f.prefer_common_ir);
  options.set_disable_fusion(f.no_fusion);
  options.set_allow_tf32(f.allow_tf32);
  options.set_allow_int8_activations(f.allow_int8_activations);
  options.set_cuda_graphs(f.cuda_graphs);
  KILN_ASSIGN_OR_RETURN(auto client, Connect(g));
  absl::StatusOr<v1::CompileResponse> resp;
  {
    Spinner spin("compiling", ProgressWanted(g.progress));
    resp = client->Compile(graph, options, shapes);
  }
  KILN_RETURN_IF_ERROR(resp.status());
  std::printf("%s", FormatSignature(resp->signature()).c_str());
  if (resp->executable_key().empty()) {
    std::printf("\nverified; pass --shape for every symbolic input dim to compile\n");
    return absl::OkStatus();
  }
  std::printf("\n%s", FormatCompileReport(resp->report()).c_str());
  return absl::OkStatus();
}

// --cuda-graphs auto|on|off (CompileOptions.cuda_graphs).
void AddCudaGraphsOption(CLI::App& app, v1::CudaGraphs& out) {
  const std::map<std::string, v1::CudaGraphs> values = {
      {"auto", v1::CUDA_GRAPHS_AUTO}, {"on", v1::CUDA_GRAPHS_ON}, {"off", v1::CUDA_GRAPHS_OFF}};
  app.add_option("--cuda-graphs", out,
                 "CUDA graphs on cuda devices: auto (when the launches saved are >= 1% of the "
                 "run), on, off")
      ->transform(CLI::CheckedTransformer(values, CLI::ignore_case))
      ->default_str("auto");
}

absl::Status CmdRun(const GlobalFlags& g, const RunFlags& f) {
  if (f.graph.empty() == f.model.empty()) {
    return absl::InvalidArgumentError(
        "kilnctl run needs a graph file or --model NAME[:VERSION], not both");
  }
  TensorMap inputs, params;
  KILN_RETURN_IF_ERROR(LoadTensors(f.inputs, "--input", inputs));
  v1::GraphSource graph;
  if (!f.model.empty()) {
    KILN_ASSIGN_OR_RETURN(*graph.mutable_model(), ParseModelRef(f.model));
  } else {
    // An ONNX model whose shapes depend on an input's value is imported for
    // the value given; that input is then part of the graph, not sent.
    std::vector<std::string> fixed;
    KILN_ASSIGN_OR_RETURN(graph, LoadGraphFileForInputs(f.graph, inputs, &fixed));
    for (const std::string& name : fixed) inputs.erase(name);
  }
  KILN_RETURN_IF_ERROR(LoadTensors(f.params, "--param", params));
  if (!f.params_dir.empty()) KILN_RETURN_IF_ERROR(LoadParamsDir(f.params_dir, params));
  KILN_RETURN_IF_ERROR(LoadWeightFiles(f.weights, params));
  if (!f.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.out_dir, ec);
    if (ec)
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", f.out_dir, ": ", ec.message()));
  }
  KILN_ASSIGN_OR_RETURN(auto client, Connect(g));
  const bool progress = ProgressWanted(g.progress);
  Client::RunOptions options;
  options.report = f.report || !f.trace.empty();
  options.priority = f.priority;
  options.compile.set_device(f.device);
  options.compile.set_allow_tf32(f.allow_tf32);
  options.compile.set_allow_int8_activations(f.allow_int8_activations);
  options.compile.set_cuda_graphs(f.cuda_graphs);

  absl::StatusOr<Client::RunResult> result;
  if (params.empty() && !graph.has_model()) {
    Spinner spin("compiling and running", progress);
    result = client->Run(graph, inputs, {}, options);
  } else {
    // Params go through a session: SetParams streams weights of any size.
    absl::StatusOr<v1::CreateSessionResponse> session;
    {
      Spinner spin("compiling", progress);
      session = client->CreateSession(graph, options.compile);
    }
    KILN_RETURN_IF_ERROR(session.status());
    const std::string id = session->session_id();
    absl::Status status = [&]() -> absl::Status {
      std::vector<std::string> wanted;
      for (const v1::SignatureEntry& e : session->signature().params()) wanted.push_back(e.name());
      for (const auto& [name, t] : params) {
        if (std::find(wanted.begin(), wanted.end(), name) == wanted.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the graph has no param '", name,
              "' (its params: ", wanted.empty() ? "none" : absl::StrJoin(wanted, ", "), ")"));
        }
      }
      int64_t total = 0;
      for (const auto& [name, t] : params) total += t.num_bytes();
      ProgressBar bar("uploading params", total, progress);
      KILN_RETURN_IF_ERROR(
          client->SetParams(id, params, [&](int64_t done, int64_t) { bar.Update(done); }).status());
      bar.Finish();
      Spinner spin("running", progress);
      result = client->Run(id, inputs, options);
      return absl::OkStatus();
    }();
    const absl::Status closed = client->CloseSession(id);
    KILN_RETURN_IF_ERROR(status);
    KILN_RETURN_IF_ERROR(closed) << "while closing session " << id;
  }
  KILN_RETURN_IF_ERROR(result.status());
  // A while loop's stacked output (an ONNX Loop whose body computes its
  // cond) comes back as a buffer and its length: the model's output is the
  // rows written.
  KILN_RETURN_IF_ERROR(io::TrimStackedOutputs(result->outputs));

  for (const auto& [name, t] : result->outputs) {
    const std::string type = absl::StrCat(DTypeName(t.dtype()), DimsToString(t.dims()));
    if (f.out_dir.empty()) {
      std::printf("%s: %s %s\n", name.c_str(), type.c_str(), Preview(t).c_str());
      continue;
    }
    const std::string path = (std::filesystem::path(f.out_dir) / (name + ".npy")).string();
    KILN_RETURN_IF_ERROR(WriteNpy(path, t));
    std::printf("%s: %s -> %s\n", name.c_str(), type.c_str(), path.c_str());
  }
  if (f.report) std::printf("\n%s", FormatReportTable(result->report).c_str());
  if (!f.trace.empty()) {
    KILN_RETURN_IF_ERROR(WriteFile(f.trace, ReportsToChromeTrace({&result->report, 1})));
    std::fprintf(stderr, "trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                 f.trace.c_str());
  }
  return absl::OkStatus();
}

absl::Status CmdReport(const GlobalFlags& g, const ReportFlags& f) {
  KILN_ASSIGN_OR_RETURN(auto client, Connect(g));
  std::vector<v1::DispatchReport> reports;
  if (!f.request_id.empty()) {
    KILN_ASSIGN_OR_RETURN(v1::DispatchReport r, client->GetReport(f.request_id));
    reports.push_back(std::move(r));
  } else {
    KILN_ASSIGN_OR_RETURN(reports, client->GetReports(f.last));
  }
  if (reports.empty()) {
    std::printf("no reports kept for this tenant yet\n");
    return absl::OkStatus();
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    std::printf("%s%s", i > 0 ? "\n" : "", FormatReportTable(reports[i]).c_str());
  }
  if (!f.trace.empty()) {
    KILN_RETURN_IF_ERROR(WriteFile(f.trace, ReportsToChromeTrace(reports)));
    std::fprintf(stderr, "trace: %s (%zu reports)\n", f.trace.c_str(), reports.size());
  }
  return absl::OkStatus();
}

int Report(const absl::Status& s) {
  if (s.ok()) return 0;
  std::fprintf(stderr, "kilnctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return 1;
}

int Main(int argc, char** argv) {
  CLI::App app{"kilnctl: talk to a kilnd server"};
  app.require_subcommand(1);
  GlobalFlags g;
  app.add_option("--addr", g.addr, "kilnd address")->envname("KILN_ADDR")->capture_default_str();
  app.add_option("--api_key,--api-key", g.api_key, "API key (sent as a bearer token)")
      ->envname("KILN_API_KEY");
  app.add_flag("--tls", g.tls, "connect with TLS (implied by --ca, --cert, --key)")
      ->envname("KILN_TLS");
  app.add_option("--ca", g.ca,
                 "PEM CA the server's certificate must chain to (default: the "
                 "system's roots)")
      ->envname("KILN_CA");
  app.add_option("--cert", g.cert, "PEM client certificate (mTLS; with --key)")
      ->envname("KILN_CERT");
  app.add_option("--key", g.key, "PEM private key of --cert")->envname("KILN_KEY");
  app.add_option("--tls-server-name", g.tls_server_name,
                 "name to check the server's certificate against, when not the --addr host")
      ->envname("KILN_TLS_SERVER_NAME");
  app.add_option("--timeout", g.timeout_s, "per-call deadline in seconds (0 = none)");
  app.add_flag("--progress", g.progress, "draw progress on stderr even when it is not a terminal");
  app.add_flag("--no-shm", g.no_shm,
               "send tensors as bytes even to a kilnd on this host (default: shared memory when "
               "it can; KILN_SHM=0 does the same)");
  app.add_flag("--no-shm-run", g.no_shm_run,
               "with shared memory, send Run over gRPC instead of kilnd's shared-memory socket "
               "(default: the socket when kilnd takes runs there; KILN_SHM_RUN=0 does the same)");
  app.add_flag("--no-shm-train-step", g.no_shm_train_step,
               "with shared memory, send train's steps over gRPC instead of kilnd's shared-memory "
               "socket (default: the socket when kilnd takes steps there; KILN_SHM_TRAIN_STEP=0 "
               "does the same)");

  app.add_subcommand("devices", "list the server's devices");
  std::string health_service;
  CLI::App* health = app.add_subcommand("health", "grpc.health.v1 check (exit 0 when SERVING)");
  health->add_option("--service", health_service, "service name (empty = the whole server)");

  CompileFlags cf;
  CLI::App* compile = app.add_subcommand("compile", "verify and compile a graph");
  compile->add_option("graph", cf.graph, ".kiln text, binary .pb or .pbtxt graph")->required();
  compile->add_option("--shape", cf.shapes, "concrete input shape: name=d0,d1,...");
  compile->add_option("--device", cf.device, "auto, or a device id (cpu:0)")->capture_default_str();
  compile->add_flag("--prefer-common-ir", cf.prefer_common_ir,
                    "decompose instead of native kernels");
  compile->add_flag("--no-fusion", cf.no_fusion, "disable fusion");
  compile->add_flag("--allow-tf32", cf.allow_tf32,
                    "let f32 matmuls use TF32 tensor cores (cuda; ~1e-3 relative error)");
  compile->add_flag("--allow-int8-activations", cf.allow_int8_activations,
                    "let DequantMatMul round activations to int8 per 32 values (cpu; ~0.5% relative error)");
  AddCudaGraphsOption(*compile, cf.cuda_graphs);

  RunFlags rf;
  CLI::App* run = app.add_subcommand("run", "run a graph on .npy inputs");
  run->add_option("graph", rf.graph, ".kiln text, binary .pb, .pbtxt or .onnx graph");
  run->add_option("--model,-m", rf.model,
                  "a model of the server's repository: NAME or NAME:VERSION");
  run->add_option("--weights,-w", rf.weights,
                  "params from a .safetensors, .gguf or .npz file (by tensor name)");
  run->add_option("--input,-i", rf.inputs, "input: name=path.npy");
  run->add_option("--param,-p", rf.params, "param: name=path.npy (uploads through a session)");
  run->add_option("--params-dir", rf.params_dir, "directory of <param>.npy files");
  run->add_option("--out,-o", rf.out_dir, "write each output to <dir>/<name>.npy");
  run->add_flag("--report", rf.report, "print the dispatch report as a table");
  run->add_option("--trace", rf.trace, "write the dispatch report as Chrome trace JSON");
  run->add_option("--device", rf.device, "auto, or a device id (cpu:0)")->capture_default_str();
  run->add_flag("--allow-tf32", rf.allow_tf32,
                "let f32 matmuls use TF32 tensor cores (cuda; ~1e-3 relative error)");
  run->add_flag("--allow-int8-activations", rf.allow_int8_activations,
                "let DequantMatMul round activations to int8 per 32 values (cpu; ~0.5% relative error)");
  AddCudaGraphsOption(*run, rf.cuda_graphs);
  run->add_option("--priority", rf.priority, "higher runs first within the tenant");

  ReportFlags pf;
  CLI::App* report = app.add_subcommand("report", "the last dispatch reports of this tenant");
  report->add_option("--last,-n", pf.last, "how many (0 = all the server keeps)")
      ->capture_default_str();
  report->add_option("--request", pf.request_id, "one request's report, by request id");
  report->add_option("--trace", pf.trace, "also write them as Chrome trace JSON");

  AddImportCommand(app);  // kilnctl import: ONNX -> graph file, offline
  ModelsFlags mf;
  CLI::App* models = AddModelsCommand(app, mf);
  TrainFlags tf;
  AddTrainCommand(app, tf);

  CLI::App* cache = app.add_subcommand("cache", "compile cache");
  cache->require_subcommand(1);
  cache->add_subcommand("stats", "hits, misses, evictions and disk use");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is not an error
  }

  if (app.got_subcommand("health")) return CmdHealth(g, health_service);
  if (app.got_subcommand("devices")) return Report(CmdDevices(g));
  if (app.got_subcommand("compile")) return Report(CmdCompile(g, cf));
  if (app.got_subcommand("run")) {
    if (rf.graph.empty() == rf.model.empty()) {  // a usage error, as CLI11's own
      std::fprintf(stderr, "kilnctl run: give a graph file or --model NAME[:VERSION], not both\n%s",
                   app.get_subcommand("run")->help().c_str());
      return 2;
    }
    return Report(CmdRun(g, rf));
  }
  if (app.got_subcommand("report")) return Report(CmdReport(g, pf));
  if (app.got_subcommand("cache")) return Report(CmdCacheStats(g));
  if (app.got_subcommand("models"))
    return Report(RunModelsCommand(*models, mf, [&g] { return Connect(g); }));
  if (app.got_subcommand("train")) {
    absl::StatusOr<std::unique_ptr<Client>> client = Connect(g);
    if (!client.ok()) return Report(client.status());
    return Report(CmdTrain(**client, tf, ProgressWanted(g.progress)));
  }
  return 2;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  kiln::TuneMallocForLargeTensors();
  try {
    return kiln::Main(argc, argv);
  } catch (const std::exception& e) {  // a library's (CLI11, JSON, allocation) unexpected error
    std::fprintf(stderr, "kilnctl: %s\n", e.what());
    return 1;
  }
}
