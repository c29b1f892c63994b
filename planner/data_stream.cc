#include "planner/data_stream.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/splitmix64.h"

namespace knapformer {
namespace {

constexpr int64_t kMaxCodeValue = 1 << 20;
constexpr int64_t kMaxTextTokens = 392;

absl::StatusOr<int64_t> ConsumeField(absl::string_view& rest, char letter,
                                     absl::string_view code, int64_t min_value,
                                     int64_t max_value) {
  if (rest.empty() || rest.front() != letter) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data code '", code, "': expected '", std::string(1, letter),
        "' (grammar g{G}b{B}i{R}f{F}s{S})"));
  }
  rest.remove_prefix(1);
  size_t digits = 0;
  int64_t value = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
    value = value * 10 + (rest[digits] - '0');
    if (value > max_value) {
      return absl::InvalidArgumentError(absl::StrCat("data code '", code, "': ",
                                                     std::string(1, letter),
                                                     " exceeds the limit of ", max_value));
    }
    ++digits;
  }
  if (digits == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data code '", code, "': expected digits after '", std::string(1, letter), "'"));
  }
  if (value < min_value) {
    return absl::InvalidArgumentError(absl::StrCat("data code '", code, "': ",
                                                   std::string(1, letter),
                                                   " must be at least ", min_value));
  }
  rest.remove_prefix(digits);
  return value;
}

}  // namespace

int64_t DataCode::VisualTokens() const {
  const int64_t side = resolution / 16;
  // max(int(F / 3.4), 1) in exact integer arithmetic.
  const int64_t temporal = temporal_compression ? std::max<int64_t>(frames * 10 / 34, 1) : frames;
  return side * side * temporal;
}

std::string DataCode::ToString() const {
  return absl::StrCat("g", gpus, "b", batch, "i", resolution, "f", frames, "s",
                      temporal_compression ? 1 : 0);
}

absl::StatusOr<std::vector<DataCode>> ParseDataCodes(absl::string_view codes) {
  if (codes.empty()) {
    return absl::InvalidArgumentError(
        "data: empty (expected codes g{G}b{B}i{R}f{F}s{S} joined by ',')");
  }
  std::vector<DataCode> parsed;
  for (absl::string_view code : absl::StrSplit(codes, ',')) {
    if (code.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("data '", codes, "': empty code"));
    }
    absl::string_view rest = code;
    DataCode value;
    auto take = [&](char letter, int64_t min_value, int64_t max_value,
                    int64_t* out) -> absl::Status {
      auto field = ConsumeField(rest, letter, code, min_value, max_value);
      if (!field.ok()) return field.status();
      *out = *field;
      return absl::OkStatus();
    };
    int64_t compression = 0;
    for (auto status : {take('g', 1, kMaxCodeValue, &value.gpus),
                        take('b', 1, kMaxCodeValue, &value.batch),
                        take('i', 16, kMaxCodeValue, &value.resolution),
                        take('f', 1, kMaxCodeValue, &value.frames),
                        take('s', 0, 1, &compression)}) {
      if (!status.ok()) return status;
    }
    if (!rest.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data code '", code, "': unexpected trailing '", rest, "'"));
    }
    value.temporal_compression = compression == 1;
    if (value.VisualTokens() + kMaxTextTokens > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data code '", code, "': a sample exceeds 2^31 tokens"));
    }
    parsed.push_back(value);
  }
  return parsed;
}

std::string ScenarioCodes(absl::string_view name) {
  if (name == "low-res") return "g32b32i256f1s0";
  if (name == "mixed-res") return "g16b4i256f1s0,g4b5i512f1s0,g4b5i1024f1s0,g8b1i2048f1s0";
  if (name == "joint") {
    return "g8b4i256f1s0,g2b5i512f1s0,g2b5i1024f1s0,g4b1i2048f1s0,"
           "g1b10i256f4s0,g3b1i512f4s0,g8b2i256f85s1,g4b1i512f85s1";
  }
  return "";
}

std::vector<std::string> ScenarioNames() { return {"low-res", "mixed-res", "joint"}; }

absl::StatusOr<DataStream> DataStream::Create(std::vector<DataCode> codes, int64_t world_size,
                                              uint64_t seed) {
  int64_t block = 0;
  for (const DataCode& code : codes) block += code.gpus;
  if (codes.empty() || block > kMaxCodeValue) {
    return absl::InvalidArgumentError("data: no codes, or more than 2^20 GPUs per block");
  }
  if (world_size < 1 || world_size > kMaxCodeValue || world_size % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world: ", world_size, " must be a positive multiple of the data codes' ", block,
        " GPUs (at most ", kMaxCodeValue, ")"));
  }
  std::vector<int32_t> code_of_rank;
  code_of_rank.reserve(world_size);
  while (static_cast<int64_t>(code_of_rank.size()) < world_size) {
    for (size_t c = 0; c < codes.size(); ++c) {
      code_of_rank.insert(code_of_rank.end(), codes[c].gpus, static_cast<int32_t>(c));
    }
  }
  return DataStream(std::move(codes), std::move(code_of_rank), seed);
}

RankLengths DataStream::Batch(int64_t step) const {
  RankLengths lengths(code_of_rank_.size());
  for (size_t rank = 0; rank < code_of_rank_.size(); ++rank) {
    const DataCode& code = codes_[code_of_rank_[rank]];
    // Independent stream per (seed, step, rank).
    const uint64_t step_key = SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(step)).Next()).Next();
    SplitMix64 rng(step_key ^ SplitMix64(static_cast<uint64_t>(rank) + 0x632BE59BD9B4E019ull).Next());
    const double aspect = 0.96 + 0.08 * rng.Uniform();
    const int64_t visual =
        static_cast<int64_t>(static_cast<double>(code.VisualTokens()) * aspect);
    lengths[rank].reserve(code.batch);
    for (int64_t i = 0; i < code.batch; ++i) {
      lengths[rank].push_back(visual + static_cast<int64_t>(rng.Below(kMaxTextTokens + 1)));
    }
  }
  return lengths;
}

}  // namespace knapformer
