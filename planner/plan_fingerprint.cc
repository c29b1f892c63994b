#include "planner/plan_fingerprint.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

// SplitMix64's finaliser over the running hash and the next value: the same
// on every rank of a build.
uint64_t Mix(uint64_t hash, uint64_t value) {
  uint64_t z = hash ^ (value + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t MaskHash(const AttentionMask& mask) {
  uint64_t h = Mix(static_cast<uint64_t>(mask.kind), static_cast<uint64_t>(mask.window));
  for (const MaskSpan& span : mask.spans) {
    h = Mix(Mix(h, static_cast<uint64_t>(span.length)), span.causal ? 1 : 0);
  }
  return h;
}

// Adds (sender, receiver)'s chunks to `pairs`, one chunk at a time.
void AddChunk(std::map<std::pair<int32_t, int32_t>, uint64_t>* pairs, int32_t sender,
              int32_t receiver, const Transfer& chunk, uint64_t mask) {
  auto [it, fresh] = pairs->try_emplace({sender, receiver}, 0);
  if (fresh) {
    it->second = Mix(Mix(0, static_cast<uint64_t>(sender)), static_cast<uint64_t>(receiver));
  }
  uint64_t& h = it->second;
  h = Mix(h, static_cast<uint64_t>(chunk.seq_index));
  h = Mix(h, static_cast<uint64_t>(chunk.offset));
  h = Mix(h, static_cast<uint64_t>(chunk.length));
  h = Mix(h, mask);
}

uint64_t Sum(const std::map<std::pair<int32_t, int32_t>, uint64_t>& pairs) {
  uint64_t sum = 0;
  for (const auto& [pair, hash] : pairs) sum += hash;  // mod 2^64
  return sum;
}

}  // namespace

PlanFingerprint FingerprintOf(const RankPlan& plan, const std::vector<AttentionMask>& masks) {
  const bool masked = !plan.attention_masks.empty();
  // The mask attention sees for a received chunk of (source, sequence).
  std::map<std::pair<int32_t, int32_t>, uint64_t> seen;
  if (masked && plan.ulysses.gpus > 1) {
    for (size_t i = 0; i < plan.ulysses.sequences.size() && i < plan.attention_masks.size(); ++i) {
      const UlyssesSequence& s = plan.ulysses.sequences[i];
      seen[{s.src_rank, s.seq_index}] = MaskHash(plan.attention_masks[i]);
    }
  }
  std::map<std::pair<int32_t, int32_t>, uint64_t> sent, expected;
  // A sender's masks are those it gave (its share may have none: it may
  // keep no sequence to attend to), a receiver's those its share has.
  for (const Transfer& chunk : plan.route.sends) {
    const bool given =
        chunk.seq_index >= 0 && static_cast<size_t>(chunk.seq_index) < masks.size();
    const uint64_t mask = given ? MaskHash(masks[chunk.seq_index]) : 0;
    AddChunk(&sent, plan.rank, chunk.peer, chunk, mask);
  }
  for (size_t i = 0; i < plan.route.recvs.size(); ++i) {
    const Transfer& chunk = plan.route.recvs[i];
    uint64_t mask = 0;
    if (masked && plan.ulysses.gpus > 1) {
      auto it = seen.find({chunk.peer, chunk.seq_index});
      mask = it != seen.end() ? it->second : ~uint64_t{0};  // not in its bag: disagrees
    } else if (masked && i < plan.attention_masks.size()) {
      mask = MaskHash(plan.attention_masks[i]);
    }
    AddChunk(&expected, chunk.peer, plan.rank, chunk, mask);
  }
  PlanFingerprint f;
  f.sent = Sum(sent);
  f.expected = Sum(expected);
  f.bag_first = plan.ulysses.first_rank;
  f.bag_gpus = plan.ulysses.gpus;
  uint64_t bag = Mix(Mix(0, static_cast<uint64_t>(f.bag_first)), static_cast<uint64_t>(f.bag_gpus));
  for (size_t i = 0; i < plan.ulysses.sequences.size(); ++i) {
    const UlyssesSequence& s = plan.ulysses.sequences[i];
    bag = Mix(Mix(Mix(bag, static_cast<uint64_t>(s.src_rank)), static_cast<uint64_t>(s.seq_index)),
              static_cast<uint64_t>(s.length));
    for (int64_t chunk : s.chunk_lengths) bag = Mix(bag, static_cast<uint64_t>(chunk));
    if (masked && plan.ulysses.gpus > 1 && i < plan.attention_masks.size()) {
      bag = Mix(bag, MaskHash(plan.attention_masks[i]));
    }
  }
  f.bag = bag;
  return f;
}

absl::Status CheckFingerprints(const std::vector<PlanFingerprint>& fingerprints) {
  uint64_t sent = 0, expected = 0;
  for (const PlanFingerprint& f : fingerprints) {
    sent += f.sent;
    expected += f.expected;
  }
  if (sent != expected) {
    return absl::FailedPreconditionError(
        "disagree on the route: the chunks some rank sends a peer are not those the peer "
        "expects");
  }
  const int32_t world = static_cast<int32_t>(fingerprints.size());
  for (int32_t r = 0; r < world; ++r) {
    const PlanFingerprint& mine = fingerprints[r];
    if (mine.bag_gpus < 1 || mine.bag_first < 0 || mine.bag_first > r ||
        r - mine.bag_first >= mine.bag_gpus || mine.bag_first + mine.bag_gpus > world) {
      return absl::FailedPreconditionError(absl::StrCat(
          "put rank ", r, " in a bag of ranks ", mine.bag_first, "..",
          mine.bag_first + mine.bag_gpus - 1, ", which does not hold it"));
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    const PlanFingerprint& mine = fingerprints[r];
    for (int32_t m = mine.bag_first; m < mine.bag_first + mine.bag_gpus; ++m) {
      const PlanFingerprint& theirs = fingerprints[m];
      if (theirs.bag_first != mine.bag_first || theirs.bag_gpus != mine.bag_gpus ||
          theirs.bag != mine.bag) {
        return absl::FailedPreconditionError(absl::StrCat(
            "disagree on the bag of ranks ", mine.bag_first, "..",
            mine.bag_first + mine.bag_gpus - 1, ": rank ", m, "'s view of its members, chunk "
            "table or masks differs from rank ", r, "'s"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace knapformer
