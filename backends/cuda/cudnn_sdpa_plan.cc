#include "backends/cuda/cudnn_sdpa_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::cuda {
namespace {

std::string Strides(int64_t H, int64_t S, int64_t D) {
  return absl::StrCat(H * S * D, ",", S * D, ",", D, ",1");
}

}  // namespace

absl::Status CudnnSdpaServes(const SdpaShape& s, int cc_major, int cc_minor, size_t cudnn_version) {
  auto no = [](auto&&... why) {
    return absl::UnimplementedError(absl::StrCat("cudnn sdpa: ", why...));
  };
  if (cudnn_version < 90000) return no("needs cuDNN 9");
  if (cc_major < 8) return no("needs compute capability 8.0 or newer");
  if (s.dtype != v1::DTYPE_F16 && s.dtype != v1::DTYPE_BF16) return no("serves f16 and bf16");
  if (s.mask != v1::MASK_NONE && s.mask != v1::MASK_BIDIRECTIONAL && s.mask != v1::MASK_CAUSAL) {
    return no("serves no mask or a causal mask, not ",
              v1::MaskKind_Name(static_cast<v1::MaskKind>(s.mask)));
  }
  if (s.softcap != 0) return no("serves no softcap");
  if (s.B <= 0 || s.Hq <= 0 || s.Hkv <= 0 || s.Sq <= 0 || s.Sk <= 0) return no("empty operands");
  if (s.Hq % s.Hkv != 0) return no("query heads must be a multiple of kv heads");
  if (s.Sq == 1 && s.Sk == 1) return no("serves no Sq = Sk = 1");
  if (s.mask == v1::MASK_CAUSAL && s.Sq > s.Sk) {
    return no("a causal mask with more queries than keys leaves rows without keys");
  }
  const int64_t most = cc_major == 9 ? 256 : 128;
  for (int64_t d : {s.D, s.Dv}) {
    if (d % 8 != 0 || d > most) return no("head dims must be multiples of 8 up to ", most);
  }
  // The operands' strides are int64, but keep every element offset in 32 bits,
  // as the engine's kernels index (the score matrix is never stored).
  const int64_t widest =
      std::max({s.B * s.Hq * s.Sq * std::max(s.D, s.Dv), s.B * s.Hkv * s.Sk * std::max(s.D, s.Dv)});
  if (widest >= (int64_t{1} << 31)) return no("operands past 2^31 elements");
  (void)cc_minor;
  return absl::OkStatus();
}

std::string CudnnSdpaKey(const SdpaShape& s, size_t cudnn_version) {
  const int64_t shift = s.mask == v1::MASK_CAUSAL ? s.Sk - s.Sq : 0;
  return absl::StrCat(
      "cudnn_sdpa_fwd;graph=", kCudnnSdpaGraphVersion, ";cudnn=", cudnn_version,
      ";dtype=", DTypeName(s.dtype), ";b=", s.B, ";hq=", s.Hq, ";hkv=", s.Hkv, ";sq=", s.Sq,
      ";sk=", s.Sk, ";d=", s.D, ";dv=", s.Dv, ";q_strides=", Strides(s.Hq, s.Sq, s.D),
      ";k_strides=", Strides(s.Hkv, s.Sk, s.D), ";v_strides=", Strides(s.Hkv, s.Sk, s.Dv),
      ";o_strides=", Strides(s.Hq, s.Sq, s.Dv),
      ";mask=", v1::MaskKind_Name(static_cast<v1::MaskKind>(s.mask)), ";shift=", shift);
}

}  // namespace kiln::cuda
