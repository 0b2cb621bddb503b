#include "clients/cpp/kilnctl_train.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "clients/cpp/checkpoint.h"
#include "clients/cpp/graph_file.h"
#include "clients/cpp/progress.h"
#include "engine/io/npy.h"
#include "engine/ir/text.h"
#include "engine/ir/verifier.h"
#include "engine/quant/int8_export.h"
#include "zlib.h"

namespace kiln {
namespace {

absl::Status LoadAssignments(const std::vector<std::string>& args, const char* flag,
                             TensorMap& out) {
  for (const std::string& arg : args) {
    std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " expects name=path.npy, got '", arg, "'"));
    }
    KILN_ASSIGN_OR_RETURN(HostTensor t, ReadNpy(kv.second));
    if (!out.emplace(kv.first, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", kv.first, "' given twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadDir(const std::string& dir, TensorMap& out) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (const auto& entry : it) {
    if (entry.path().extension() != ".npy") continue;
    KILN_ASSIGN_OR_RETURN(HostTensor t, ReadNpy(entry.path().string()));
    if (!out.emplace(entry.path().stem().string(), std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat("param '", entry.path().stem().string(),
                                                     "' given by --param and --params-dir"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::OptimizerSpec> Optimizer(const TrainFlags& f, int64_t total_steps) {
  v1::OptimizerSpec s;
  const std::string& k = f.optimizer;
  if (k == "sgd") {
    s.set_kind(v1::OPTIMIZER_SGD);
  } else if (k == "adam") {
    s.set_kind(v1::OPTIMIZER_ADAM);
  } else if (k == "adamw") {
    s.set_kind(v1::OPTIMIZER_ADAMW);
  } else if (k == "lion") {
    s.set_kind(v1::OPTIMIZER_LION);
  } else if (k == "muon") {
    s.set_kind(v1::OPTIMIZER_MUON);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer '", k, "' is unknown; use sgd, adam, adamw, lion or muon"));
  }
  s.set_lr(f.lr);
  if (f.weight_decay >= 0) s.set_weight_decay(f.weight_decay);
  if (f.momentum >= 0) s.set_momentum(f.momentum);
  if (f.beta1 >= 0) s.set_beta1(f.beta1);
  if (f.beta2 >= 0) s.set_beta2(f.beta2);
  s.set_nesterov(f.nesterov);
  s.set_max_grad_norm(f.max_grad_norm);
  v1::LrSchedule* sc = s.mutable_schedule();
  if (f.schedule == "warmup") {
    sc->set_kind(v1::SCHEDULE_LINEAR_WARMUP);
  } else if (f.schedule == "cosine") {
    sc->set_kind(v1::SCHEDULE_COSINE);
    sc->set_total_steps(total_steps);
    sc->set_min_lr(f.min_lr);
  } else if (f.schedule != "constant") {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule '", f.schedule, "' is unknown; use constant, warmup or cosine"));
  }
  sc->set_warmup_steps(f.warmup_steps);
  return s;
}

// The rows `order[first .. first + count)` of `t` (rows = its first dim).
absl::StatusOr<HostTensor> Rows(const HostTensor& t, const std::vector<int64_t>& order,
                                int64_t first, int64_t count) {
  Dims dims = t.dims();
  dims[0] = count;
  KILN_ASSIGN_OR_RETURN(HostTensor out, HostTensor::CreateUninitialized(t.dtype(), dims));
  const int64_t row = t.dims()[0] == 0 ? 0 : t.num_bytes() / t.dims()[0];
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(static_cast<char*>(out.data()) + i * row,
                static_cast<const char*>(t.data()) + order[first + i] * row, row);
  }
  return out;
}

// One gzip-compressed IDX file of (Fashion-)MNIST: images u8 [N, R, C] ->
// f32 [N, R * C] scaled to [0, 1], labels u8 [N] -> i64 [N].
absl::StatusOr<HostTensor> ReadIdx(const std::string& path, bool images) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path,
                                            " (install Debian's dataset-fashion-mnist, or pass "
                                            "--dataset-dir)"));
  }
  std::string bytes;
  constexpr size_t kMaxBytes = size_t{256} << 20;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0 && bytes.size() <= kMaxBytes) bytes.append(buf, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed || bytes.size() > kMaxBytes) {
    return absl::DataLossError(absl::StrCat(path, ": not a readable gzip file under 256 MiB"));
  }
  auto be32 = [&](size_t at) {
    const auto* u = reinterpret_cast<const unsigned char*>(bytes.data() + at);
    return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
  };
  const size_t header = images ? 16 : 8;
  if (bytes.size() < header || be32(0) != (images ? 0x803u : 0x801u)) {
    return absl::DataLossError(absl::StrCat(path, ": not an IDX ", images ? "image" : "label",
                                            " file (bad magic number)"));
  }
  const int64_t count = be32(4);
  const int64_t rows = images ? be32(8) : 1, cols = images ? be32(12) : 1;
  if (rows > 4096 || cols > 4096 ||
      static_cast<uint64_t>(count) * rows * cols != bytes.size() - header) {
    return absl::DataLossError(absl::StrCat(path, ": the header's sizes do not match the ",
                                            bytes.size() - header, " data bytes"));
  }
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data() + header);
  if (images) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_F32, {count, rows * cols}));
    float* out = t.data_as<float>();
    for (int64_t i = 0; i < count * rows * cols; ++i) out[i] = static_cast<float>(data[i]) / 255.0f;
    return t;
  }
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(v1::DTYPE_I64, {count}));
  for (int64_t i = 0; i < count; ++i) t.data_as<int64_t>()[i] = data[i];
  return t;
}

// Accuracy of the session's forward graph on (images, labels), by argmax of
// the output `logits`, in batches of `batch` (and one of the rest).
absl::StatusOr<int64_t> CountCorrect(const Client& client, const std::string& id,
                                     const TrainFlags& f, const HostTensor& images,
                                     const HostTensor& labels, int64_t batch) {
  const int64_t n = images.dims()[0];
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  int64_t correct = 0;
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t count = std::min(batch, n - first);
    TensorMap inputs;
    KILN_ASSIGN_OR_RETURN(HostTensor x, Rows(images, order, first, count));
    KILN_ASSIGN_OR_RETURN(HostTensor y, Rows(labels, order, first, count));
    inputs.emplace(f.image_input, std::move(x));
    inputs.emplace(f.label_input, std::move(y));
    KILN_ASSIGN_OR_RETURN(Client::RunResult r, client.Run(id, inputs));
    const HostTensor* logits = r.output(f.logits);
    if (logits == nullptr || logits->rank() != 2 || logits->dims()[0] != count) {
      return absl::InvalidArgumentError(absl::StrCat("evaluation needs an output '", f.logits,
                                                     "' of shape [batch, classes] (--logits)"));
    }
    const int64_t classes = logits->dims()[1];
    for (int64_t i = 0; i < count; ++i) {
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (logits->GetAsDouble(i * classes + c) > logits->GetAsDouble(i * classes + best))
          best = c;
      }
      correct += best == labels.data_as<int64_t>()[first + i];
    }
  }
  return correct;
}

}  // namespace

void AddTrainCommand(CLI::App& app, TrainFlags& f) {
  CLI::App* cmd =
      app.add_subcommand("train", "train a graph on .npy data through a training session");
  cmd->add_option("graph", f.graph, ".kiln text, binary .pb or .pbtxt graph")->required();
  cmd->add_option("--data,-d", f.data,
                  "training data: input=path.npy (one row per example), or fashion-mnist")
      ->required();
  cmd->add_option("--dataset-dir", f.dataset_dir, "where the fashion-mnist files are")
      ->capture_default_str();
  cmd->add_option("--image-input", f.image_input, "fashion-mnist: the images' input")
      ->capture_default_str();
  cmd->add_option("--label-input", f.label_input, "fashion-mnist: the labels' input")
      ->capture_default_str();
  cmd->add_option("--logits", f.logits, "fashion-mnist: the output evaluated on the test set")
      ->capture_default_str();
  cmd->add_option("--param,-p", f.params, "initial param: name=path.npy");
  cmd->add_option("--params-dir", f.params_dir, "directory of initial <param>.npy files");
  cmd->add_option("--init-seed", f.init_seed, "seed for the params not given")
      ->capture_default_str();
  cmd->add_option("--out,-o", f.out_dir, "write the trained params to <dir>/<name>.npy");
  cmd->add_flag("--save-state", f.save_state, "also write the optimizer state (opt/...)");
  cmd->add_option("--loss", f.loss, "the scalar loss output")->capture_default_str();
  cmd->add_option("--train", f.trainable, "params to train (default: every param not frozen)");
  cmd->add_option("--optimizer", f.optimizer, "sgd, adam, adamw, lion or muon")
      ->capture_default_str();
  cmd->add_option("--lr", f.lr, "learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", f.weight_decay, "weight decay (default: the optimizer's)");
  cmd->add_option("--momentum", f.momentum, "SGD / Muon momentum");
  cmd->add_option("--beta1", f.beta1, "Adam / AdamW / Lion beta1");
  cmd->add_option("--beta2", f.beta2, "Adam / AdamW / Lion beta2");
  cmd->add_flag("--nesterov", f.nesterov, "SGD: Nesterov momentum");
  cmd->add_option("--clip", f.max_grad_norm, "clip gradients to this global norm (0 = off)");
  cmd->add_option("--schedule", f.schedule, "constant, warmup or cosine")->capture_default_str();
  cmd->add_option("--warmup", f.warmup_steps, "linear warm-up steps");
  cmd->add_option("--min-lr", f.min_lr, "cosine: the final learning rate");
  cmd->add_option("--batch", f.batch, "examples per step")->capture_default_str();
  cmd->add_option("--epochs", f.epochs, "passes over the data")->capture_default_str();
  cmd->add_option(
      "--steps", f.max_steps,
      "stop at this step of the run, steps before a --resume included (0 = all epochs)");
  cmd->add_option("--shuffle-seed", f.shuffle_seed, "shuffle each epoch with this seed (0 = no)");
  cmd->add_option("--log-every", f.log_every,
                  "a plain progress line every N steps (default: about 20 over the run)");
  cmd->add_option("--checkpoint", f.checkpoint,
                  "write a checkpoint (.safetensors: params, optimizer state, step, data order)");
  cmd->add_option("--checkpoint-every", f.checkpoint_every,
                  "also write the checkpoint every N steps (0 = at the end only)");
  cmd->add_option("--resume", f.resume, "continue bit-exactly from this checkpoint");
  cmd->add_option("--device", f.device, "auto, or a device id (cpu:0)")->capture_default_str();
  cmd->add_option("--amp", f.amp, "mixed precision: bf16 or f16 compute, f32 master weights");
  cmd->add_option("--loss-scale", f.loss_scale,
                  "--amp loss scaling: dynamic (f16 default), static or none (bf16 default)");
  cmd->add_option("--init-scale", f.init_scale, "the first (or static) loss scale (65536)");
  cmd->add_option("--scale-growth-interval", f.scale_growth_interval,
                  "dynamic loss scaling: good steps before the scale doubles (2000)");
  cmd->add_option("--qat", f.qat, "quantization-aware training: int8 or int4");
  cmd->add_flag("--qat-per-channel", f.qat_per_channel, "--qat: a weight scale per output channel");
  cmd->add_flag("--qat-asymmetric", f.qat_asymmetric,
                "--qat: activations on the unsigned grid with a zero point");
  cmd->add_flag("--qat-lsq", f.qat_lsq, "--qat: learned weight scales (LSQ)");
  cmd->add_flag("--qat-weights-only", f.qat_weights_only, "--qat: leave the activations in f32");
  cmd->add_option("--export-int8", f.export_int8,
                  "--qat int8: write the int8 inference graph and params to this directory");
}

namespace {

absl::StatusOr<v1::TransformSpec> Precision(const TrainFlags& f) {
  v1::TransformSpec t;
  if (!f.amp.empty()) {
    v1::AmpSpec& a = *t.mutable_amp();
    if (f.amp == "bf16") {
      a.set_compute(v1::DTYPE_BF16);
    } else if (f.amp == "f16") {
      a.set_compute(v1::DTYPE_F16);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--amp ", f.amp, ": use bf16 or f16"));
    }
    if (f.loss_scale == "dynamic") {
      a.set_loss_scale(v1::LOSS_SCALE_DYNAMIC);
    } else if (f.loss_scale == "static") {
      a.set_loss_scale(v1::LOSS_SCALE_STATIC);
    } else if (f.loss_scale == "none") {
      a.set_loss_scale(v1::LOSS_SCALE_NONE);
    } else if (!f.loss_scale.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--loss-scale ", f.loss_scale, ": use dynamic, static or none"));
    }
    if (f.init_scale != 0) a.set_init_scale(f.init_scale);
    if (f.scale_growth_interval != 0) a.set_growth_interval(f.scale_growth_interval);
  } else if (!f.loss_scale.empty() || f.init_scale != 0 || f.scale_growth_interval != 0) {
    return absl::InvalidArgumentError(
        "--loss-scale, --init-scale and --scale-growth-interval need --amp");
  }
  if (!f.qat.empty()) {
    v1::QatSpec& q = *t.mutable_qat();
    if (f.qat == "int8") {
      q.set_bits(8);
    } else if (f.qat == "int4") {
      q.set_bits(4);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--qat ", f.qat, ": use int8 or int4"));
    }
    q.set_weight_per_channel(f.qat_per_channel);
    q.set_activation_asymmetric(f.qat_asymmetric);
    q.set_lsq(f.qat_lsq);
    q.set_weights_only(f.qat_weights_only);
  } else if (f.qat_per_channel || f.qat_asymmetric || f.qat_lsq || f.qat_weights_only) {
    return absl::InvalidArgumentError(
        "--qat-per-channel, --qat-asymmetric, --qat-lsq and "
        "--qat-weights-only need --qat");
  }
  if (!f.export_int8.empty() && f.qat != "int8") {
    return absl::InvalidArgumentError("--export-int8 needs --qat int8");
  }
  return t;
}

// Writes `params` to dir/<name>.npy.
absl::Status WriteParams(const std::string& dir, const TensorMap& params, bool with_state) {
  for (const auto& [name, t] : params) {
    if (!with_state && name.rfind("opt/", 0) == 0) continue;
    const std::filesystem::path path = std::filesystem::path(dir) / (name + ".npy");
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
    }
    KILN_RETURN_IF_ERROR(WriteNpy(path.string(), t));
    std::printf("%s -> %s\n", name.c_str(), path.c_str());
  }
  return absl::OkStatus();
}

// The test-set accuracy (percent) of `graph` with `params` in a session of its own.
absl::StatusOr<double> Accuracy(const Client& client, const v1::GraphSource& graph,
                                const TensorMap& params, const TrainFlags& f,
                                const HostTensor& images, const HostTensor& labels) {
  v1::CompileOptions options;
  options.set_device(f.device);
  KILN_ASSIGN_OR_RETURN(v1::CreateSessionResponse s, client.CreateSession(graph, options));
  absl::StatusOr<int64_t> correct = [&]() -> absl::StatusOr<int64_t> {
    KILN_RETURN_IF_ERROR(client.SetParams(s.session_id(), params).status());
    return CountCorrect(client, s.session_id(), f, images, labels, f.batch);
  }();
  const absl::Status closed = client.CloseSession(s.session_id());
  KILN_RETURN_IF_ERROR(correct.status());
  KILN_RETURN_IF_ERROR(closed);
  return 100.0 * static_cast<double>(*correct) / static_cast<double>(images.dims()[0]);
}

// --export-int8: the int8 form of the trained graph, written to f.export_int8;
// on fashion-mnist its accuracy against the trained weights' in plain f32.
absl::Status ExportInt8(const Client& client, const v1::GraphSource& source, const v1::QatSpec& qat,
                        const TensorMap& trained, const TrainFlags& f, bool fashion,
                        const HostTensor& images, const HostTensor& labels) {
  v1::Graph graph;
  if (source.has_graph()) {
    graph = source.graph();
  } else {
    KILN_ASSIGN_OR_RETURN(graph, ir::ParseGraphProto(source.text()));
  }
  KILN_ASSIGN_OR_RETURN(quant::Int8Model model, quant::ExportInt8(graph, qat, trained));
  for (const std::string& note : model.notes) std::printf("int8 export: %s\n", note.c_str());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> ir_graph, ir::ImportGraph(model.graph));
  std::error_code ec;
  std::filesystem::create_directories(f.export_int8, ec);
  const std::string kiln_path = (std::filesystem::path(f.export_int8) / "model.kiln").string();
  {
    std::ofstream out(kiln_path);
    out << ir::PrintGraph(*ir_graph);
    if (!out.good()) return absl::PermissionDeniedError(absl::StrCat("cannot write ", kiln_path));
  }
  std::printf("int8 graph -> %s\n", kiln_path.c_str());
  KILN_RETURN_IF_ERROR(WriteParams(f.export_int8, model.params, false));
  if (!fashion) return absl::OkStatus();
  TensorMap plain;
  for (const auto& [name, t] : trained) {
    if (name.rfind("opt/", 0) == 0 || absl::EndsWith(name, "/lsq_scale")) continue;
    plain.emplace(name, t.Clone());
  }
  KILN_ASSIGN_OR_RETURN(double f32, Accuracy(client, source, plain, f, images, labels));
  v1::GraphSource int8_source;
  *int8_source.mutable_graph() = model.graph;
  KILN_ASSIGN_OR_RETURN(double int8,
                        Accuracy(client, int8_source, model.params, f, images, labels));
  std::printf("int8 test accuracy %.2f%% (the trained weights in f32: %.2f%%; drop %.2f points)\n",
              int8, f32, f32 - int8);
  return absl::OkStatus();
}

}  // namespace

absl::Status CmdTrain(const Client& client, const TrainFlags& f, bool progress) {
  KILN_ASSIGN_OR_RETURN(v1::GraphSource graph, LoadGraphFile(f.graph));
  TensorMap data, params;
  const bool fashion = f.data.size() == 1 && f.data[0] == "fashion-mnist";
  HostTensor test_images, test_labels;
  if (fashion) {
    const std::string dir = f.dataset_dir + "/";
    KILN_ASSIGN_OR_RETURN(HostTensor images, ReadIdx(dir + "train-images-idx3-ubyte.gz", true));
    KILN_ASSIGN_OR_RETURN(HostTensor labels, ReadIdx(dir + "train-labels-idx1-ubyte.gz", false));
    KILN_ASSIGN_OR_RETURN(test_images, ReadIdx(dir + "t10k-images-idx3-ubyte.gz", true));
    KILN_ASSIGN_OR_RETURN(test_labels, ReadIdx(dir + "t10k-labels-idx1-ubyte.gz", false));
    data.emplace(f.image_input, std::move(images));
    data.emplace(f.label_input, std::move(labels));
  } else {
    KILN_RETURN_IF_ERROR(LoadAssignments(f.data, "--data", data));
  }
  KILN_RETURN_IF_ERROR(LoadAssignments(f.params, "--param", params));
  if (!f.params_dir.empty()) KILN_RETURN_IF_ERROR(LoadDir(f.params_dir, params));
  int64_t rows = -1;
  for (const auto& [name, t] : data) {
    if (t.rank() == 0)
      return absl::InvalidArgumentError(absl::StrCat("--data ", name, " is a scalar"));
    if (rows >= 0 && t.dims()[0] != rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data arrays disagree on the number of rows: ", name, " has ", t.dims()[0],
                       ", others ", rows));
    }
    rows = t.dims()[0];
  }
  if (f.batch < 1 || f.batch > rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch ", f.batch, " must be in [1, ", rows, "] (the rows of the data)"));
  }
  if (f.epochs < 1 || f.epochs > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--epochs ", f.epochs, " must be in [1, 2^30]"));
  }
  if (f.max_steps < 0 || f.log_every < 0 || f.checkpoint_every < 0) {
    return absl::InvalidArgumentError("--steps, --log-every and --checkpoint-every must be >= 0");
  }
  if (f.checkpoint_every > 0 && f.checkpoint.empty()) {
    return absl::InvalidArgumentError("--checkpoint-every needs --checkpoint PATH");
  }
  if (!f.resume.empty() && (!f.params.empty() || !f.params_dir.empty())) {
    return absl::InvalidArgumentError(
        "--param / --params-dir do not go with --resume: the checkpoint holds the params");
  }
  const int64_t per_epoch = rows / f.batch;
  int64_t planned = 0;
  if (__builtin_mul_overflow(per_epoch, f.epochs, &planned)) {
    return absl::InvalidArgumentError("--epochs x batches per epoch overflows int64");
  }
  const int64_t total = f.max_steps > 0 ? std::min(planned, f.max_steps) : planned;
  // The schedule spans the planned run, not --steps: a run stopped early by
  // --steps is the start of the full run, and its checkpoint resumes it.
  KILN_ASSIGN_OR_RETURN(v1::OptimizerSpec optimizer, Optimizer(f, planned));

  v1::CompileOptions options;
  options.set_device(f.device);
  KILN_ASSIGN_OR_RETURN(*options.mutable_transforms(), Precision(f));
  v1::TrainingSpec* spec = options.mutable_transforms()->mutable_training();
  spec->set_loss(f.loss);
  for (const std::string& p : f.trainable) spec->add_params(p);
  *spec->mutable_optimizer() = optimizer;
  absl::StatusOr<v1::CreateSessionResponse> session;
  {
    Spinner spin("compiling the training step", progress);
    session = client.CreateSession(graph, options);
  }
  KILN_RETURN_IF_ERROR(session.status());
  const std::string id = session->session_id();
  CheckpointInfo info;
  info.training = *spec;
  info.graph_sha256 = GraphIdentity(graph);
  info.extra = {{"kilnctl.batch", absl::StrCat(f.batch)},
                {"kilnctl.rows", absl::StrCat(rows)},
                {"kilnctl.shuffle_seed", absl::StrCat(f.shuffle_seed)}};
  absl::Status status = [&]() -> absl::Status {
    int64_t step = 0;  // steps taken, a resumed run's included
    if (!f.resume.empty()) {
      KILN_ASSIGN_OR_RETURN(RestoredCheckpoint restored,
                            RestoreCheckpoint(client, id, session->signature(), f.resume, info));
      // The data order must be the saved run's, or the batches differ.
      for (const auto& [key, value] : info.extra) {
        auto it = restored.metadata.find(key);
        const std::string saved = it == restored.metadata.end() ? "(none)" : it->second;
        if (saved != value) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--resume ", f.resume, ": saved with ", key, " ", saved, ", this run has ", value,
              " (the same data, --batch and --shuffle-seed continue the run)"));
        }
      }
      step = restored.step;
      if (step >= total) {
        return absl::InvalidArgumentError(
            absl::StrCat("--resume ", f.resume, ": the checkpoint is at step ", step,
                         " and this run ends at step ", total,
                         "; nothing to train (raise --epochs or --steps)"));
      }
      std::printf("resumed from %s at step %lld\n", f.resume.c_str(), static_cast<long long>(step));
    } else {
      // Params not given: initialized here (documented in kilnctl_train.h).
      std::mt19937_64 rng(f.init_seed);
      for (const v1::SignatureEntry& e : session->signature().params()) {
        if (params.contains(e.name())) continue;
        Dims dims;
        for (const v1::Dim& d : e.type().dims()) {
          if (!d.has_size()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "param '", e.name(), "' has a symbolic dim: give its value with --param"));
          }
          dims.push_back(d.size());
        }
        KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(e.type().dtype(), dims));
        if (dims.size() >= 2 && dims[0] > 0) {
          const double bound = 1.0 / std::sqrt(static_cast<double>(dims[0]));
          std::uniform_real_distribution<double> u(-bound, bound);
          for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, u(rng));
        }
        params.emplace(e.name(), std::move(t));
      }
      int64_t bytes = 0;
      for (const auto& [name, t] : params) bytes += t.num_bytes();
      ProgressBar bar("uploading params", bytes, progress);
      KILN_RETURN_IF_ERROR(
          client.SetParams(id, params, [&](int64_t done, int64_t) { bar.Update(done); }).status());
      bar.Finish();
    }
    auto save = [&](int64_t at) -> absl::Status {
      CheckpointInfo here = info;
      here.extra["kilnctl.epoch"] = absl::StrCat(at / per_epoch + 1);
      here.extra["kilnctl.position"] = absl::StrCat(at % per_epoch);
      return SaveCheckpoint(client, id, f.checkpoint, here).status();
    };

    // The data order: epoch e (1-based) reads the rows in the order of the
    // e-th shuffle of 0..rows-1, shuffled in place from the previous epoch's.
    std::vector<int64_t> order(rows);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 shuffle(f.shuffle_seed);
    const int64_t first_epoch = step / per_epoch + 1, first_batch = step % per_epoch;
    for (int64_t e = 1; e < first_epoch && f.shuffle_seed != 0; ++e) {
      std::shuffle(order.begin(), order.end(), shuffle);
    }
    TrainProgress bar(step, total, progress, f.log_every, stdout);
    double first_loss = NAN, last_loss = NAN, epoch_sum = 0;
    const int64_t start_step = step;
    int64_t epoch_steps = 0;
    for (int64_t epoch = first_epoch; epoch <= f.epochs && step < total; ++epoch) {
      if (f.shuffle_seed != 0) std::shuffle(order.begin(), order.end(), shuffle);
      epoch_sum = 0;
      epoch_steps = 0;
      for (int64_t b = epoch == first_epoch ? first_batch : 0; b < per_epoch && step < total; ++b) {
        TensorMap batch;
        for (const auto& [name, t] : data) {
          KILN_ASSIGN_OR_RETURN(HostTensor rows_t, Rows(t, order, b * f.batch, f.batch));
          batch.emplace(name, std::move(rows_t));
        }
        KILN_ASSIGN_OR_RETURN(v1::TrainStepResponse r, client.TrainStep(id, batch));
        ++step;
        ++epoch_steps;
        if (step == start_step + 1) first_loss = r.loss();
        last_loss = r.loss();
        epoch_sum += r.loss();
        bar.Update(step, epoch, r.loss(), r.lr());
        if (f.checkpoint_every > 0 && step % f.checkpoint_every == 0 && step < total) {
          KILN_RETURN_IF_ERROR(save(step)) << "at step " << step;
        }
      }
      bar.Break();
      std::printf("epoch %lld: mean loss %.6f over %lld steps\n", static_cast<long long>(epoch),
                  epoch_sum / static_cast<double>(std::max<int64_t>(1, epoch_steps)),
                  static_cast<long long>(epoch_steps));
    }
    if (!f.checkpoint.empty()) {
      KILN_RETURN_IF_ERROR(save(step));
      std::printf("checkpoint at step %lld -> %s\n", static_cast<long long>(step),
                  f.checkpoint.c_str());
    }
    std::printf("trained %lld steps: first loss %.6f, last loss %.6f\n",
                static_cast<long long>(step - start_step), first_loss, last_loss);
    if (fashion) {
      Spinner spin("evaluating on the test set", progress);
      KILN_ASSIGN_OR_RETURN(int64_t correct,
                            CountCorrect(client, id, f, test_images, test_labels, f.batch));
      const int64_t n = test_images.dims()[0];
      std::printf("test accuracy %.2f%% (%lld / %lld)\n",
                  100.0 * static_cast<double>(correct) / static_cast<double>(n),
                  static_cast<long long>(correct), static_cast<long long>(n));
    }
    if (f.out_dir.empty() && f.export_int8.empty()) return absl::OkStatus();
    KILN_ASSIGN_OR_RETURN(TensorMap trained, client.GetParams(id));
    if (!f.export_int8.empty()) {
      KILN_RETURN_IF_ERROR(ExportInt8(client, graph, options.transforms().qat(), trained, f,
                                      fashion, test_images, test_labels));
    }
    if (f.out_dir.empty()) return absl::OkStatus();
    return WriteParams(f.out_dir, trained, f.save_state);
  }();
  const absl::Status closed = client.CloseSession(id);
  KILN_RETURN_IF_ERROR(status);
  KILN_RETURN_IF_ERROR(closed) << "while closing session " << id;
  return absl::OkStatus();
}

}  // namespace kiln
