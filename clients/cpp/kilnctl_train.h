// `kilnctl train` (clients/cpp/kilnctl_train.cc): trains a graph through a
// kilnd training session (docs/training.md) on .npy data: every --data array
// holds one row per example (same first dim); batches are consecutive rows
// (shuffled per epoch with --shuffle-seed), the last partial batch is dropped.
// `--data fashion-mnist` takes Debian's dataset-fashion-mnist files instead
// (--dataset-dir): train images as f32 [N, 784] in [0, 1] for the input
// --image-input, labels as i64 for --label-input; after training the test set
// runs through the session's forward graph and the accuracy of the output
// --logits is printed.
// Params come from --params-dir / --param, the others are initialized from
// --init-seed (rank >= 2: uniform +-1/sqrt(fan_in) with fan_in = the first
// dim, as torch.nn.Linear; rank < 2: zero). Progress: a bar on stderr when it
// is a terminal (or --progress), else a plain line on stdout every --log-every
// steps (progress.h); the trained params (and, with --save-state, the
// optimizer state) are written to --out as <name>.npy.
//
// --checkpoint PATH writes a checkpoint (clients/cpp/checkpoint.h) at the end
// and every --checkpoint-every steps, each atomically; its metadata also holds
// the data order (kilnctl.batch, kilnctl.rows, kilnctl.shuffle_seed,
// kilnctl.epoch, kilnctl.position). --resume PATH restores one and continues
// the run where it stopped: the step after the saved one, on the batch that
// step would have had (the shuffles of the epochs before are replayed from
// --shuffle-seed), so that a run stopped and resumed equals the uninterrupted
// run bit for bit. --steps is the step to stop at, counted from the run's
// start (steps before a resume included); the cosine schedule spans every
// epoch whatever --steps says, so a run cut short by --steps is the first
// part of the full one.
//
// Precision (docs/training.md): --amp bf16|f16 computes matmuls and convs in
// that dtype from f32 master weights (--loss-scale dynamic|static|none;
// dynamic, the f16 default, with --init-scale and --scale-growth-interval).
// --qat int8|int4 trains with fake quantization (--qat-per-channel,
// --qat-asymmetric activations, --qat-lsq learned weight scales,
// --qat-weights-only). --export-int8 DIR (with --qat int8) writes the int8
// inference form (engine/quant/int8_export.h) as DIR/model.kiln and
// DIR/<param>.npy and, on fashion-mnist, prints its test accuracy beside the
// trained weights' in plain f32 and the drop between them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "clients/cpp/client.h"

namespace kiln {

struct TrainFlags {
  std::string graph;
  std::vector<std::string> data;    // name=path.npy
  std::vector<std::string> params;  // name=path.npy
  std::string params_dir;
  std::string out_dir;
  bool save_state = false;
  std::string loss = "loss";
  std::vector<std::string> trainable;
  std::string optimizer = "adamw";
  double lr = 1e-3;
  double weight_decay = -1;  // < 0: the optimizer's default
  double momentum = -1;
  double beta1 = -1, beta2 = -1;
  bool nesterov = false;
  double max_grad_norm = 0;
  std::string schedule = "constant";  // constant, warmup, cosine
  int64_t warmup_steps = 0;
  double min_lr = 0;
  int64_t batch = 128;
  int64_t epochs = 1;
  int64_t max_steps = 0;      // 0 = every batch of every epoch
  uint64_t shuffle_seed = 0;  // 0 = in order
  uint64_t init_seed = 1;
  int64_t log_every = 0;         // 0 = about 20 plain lines over the run (none beside a bar)
  std::string checkpoint;        // write a checkpoint here
  int64_t checkpoint_every = 0;  // ... also every N steps (0 = only at the end)
  std::string resume;            // continue from this checkpoint
  std::string device = "auto";
  std::string dataset_dir = "/usr/share/datasets/fashion-mnist";
  std::string image_input = "x";
  std::string label_input = "y";
  std::string logits = "logits";
  std::string amp;         // "", bf16, f16
  std::string loss_scale;  // "", dynamic, static, none
  double init_scale = 0;   // 0 = the default (65536)
  int64_t scale_growth_interval = 0;
  std::string qat;  // "", int8, int4
  bool qat_per_channel = false, qat_asymmetric = false, qat_lsq = false, qat_weights_only = false;
  std::string export_int8;  // directory
};

void AddTrainCommand(CLI::App& app, TrainFlags& flags);
absl::Status CmdTrain(const Client& client, const TrainFlags& flags, bool progress);

}  // namespace kiln
