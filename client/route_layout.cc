#include "client/route_layout.h"


#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

// Adds `value` (>= 0) to *total; false on overflow.
bool AddChecked(int64_t value, int64_t* total) {
  return !__builtin_add_overflow(*total, value, total);
}

bool SumChecked(const std::vector<int64_t>& values, int64_t* total) {
  *total = 0;
  for (int64_t v : values) {
    if (!AddChecked(v, total)) return false;
  }
  return true;
}

absl::Status Overflow(int rank, const char* what) {
  return absl::InternalError(
      absl::StrCat("plan: rank ", rank, "'s ", what, " overflow 64 bits"));
}

}  // namespace

absl::StatusOr<RouteLayout> DeriveRouteLayout(const RankPlan& plan,
                                              const std::vector<int64_t>& lengths, int rank,
                                              int world_size, int bag_gpus, int bag_first_rank) {
  RouteLayout out;
  const int n = world_size;
  std::vector<int64_t> sequence_start(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths[", i, "]: ", lengths[i], " is negative"));
    }
    sequence_start[i + 1] = sequence_start[i];
    if (!AddChecked(lengths[i], &sequence_start[i + 1])) return Overflow(rank, "lengths");
  }
  out.input_rows = sequence_start.back();

  out.send_rows.assign(n, 0);
  out.recv_rows.assign(n, 0);
  out.send_index.reserve(out.input_rows);
  int previous_peer = 0;
  for (const Transfer& t : plan.route.sends) {
    if (t.peer < 0 || t.peer >= n || t.seq_index < 0 ||
        t.seq_index >= static_cast<int32_t>(lengths.size()) || t.offset < 0 || t.length < 0 ||
        t.offset > lengths[t.seq_index] - t.length) {
      return absl::InternalError(absl::StrCat("plan: rank ", rank, " is asked to send ",
                                              "tokens outside sequence ", t.seq_index,
                                              " or to rank ", t.peer));
    }
    // The send buffer holds each peer's rows together, peers ascending, as
    // the all-to-all sends them: a plan out of that order would send rows
    // to the wrong ranks.
    if (t.peer < previous_peer) {
      return absl::InternalError(absl::StrCat("plan: rank ", rank, "'s sends name rank ", t.peer,
                                              " after rank ", previous_peer,
                                              "; peers must ascend"));
    }
    previous_peer = t.peer;
    // Checked before the rows are listed, so that a plan sending tokens
    // many times over cannot make this list outgrow the input.
    if (t.length > out.input_rows - static_cast<int64_t>(out.send_index.size())) {
      return absl::InternalError(absl::StrCat("plan: rank ", rank, " is asked to send more than its ",
                                              out.input_rows, " tokens"));
    }
    out.send_rows[t.peer] += t.length;
    for (int64_t row = 0; row < t.length; ++row) {
      out.send_index.push_back(sequence_start[t.seq_index] + t.offset + row);
    }
  }
  // Every token leaves exactly once: the plan must be a permutation of the
  // input, or the reverse route could not put every row back.
  if (static_cast<int64_t>(out.send_index.size()) != out.input_rows) {
    return absl::InternalError(absl::StrCat("plan: rank ", rank, " sends ", out.send_index.size(),
                                            " of its ", out.input_rows, " tokens"));
  }
  std::vector<bool> seen(out.input_rows, false);
  for (int64_t row : out.send_index) {
    if (seen[row]) return absl::InternalError("plan: a token is sent twice");
    seen[row] = true;
  }
  previous_peer = 0;
  for (const Transfer& t : plan.route.recvs) {
    if (t.peer < 0 || t.peer >= n || t.length < 0) {
      return absl::InternalError(
          absl::StrCat("plan: rank ", rank, " is to receive from rank ", t.peer));
    }
    if (t.peer < previous_peer) {
      return absl::InternalError(absl::StrCat("plan: rank ", rank, "'s receives name rank ",
                                              t.peer, " after rank ", previous_peer,
                                              "; peers must ascend"));
    }
    previous_peer = t.peer;
    if (!AddChecked(t.length, &out.recv_rows[t.peer])) return Overflow(rank, "receives");
  }
  out.routed_lengths = plan.compute_chunk_lengths;
  int64_t received = 0;
  for (int64_t length : out.routed_lengths) {
    if (length < 0) {
      return absl::InternalError(
          absl::StrCat("plan: rank ", rank, " computes on a chunk of ", length, " tokens"));
    }
  }
  if (!SumChecked(out.routed_lengths, &out.routed_rows)) return Overflow(rank, "chunks");
  if (!SumChecked(out.recv_rows, &received)) return Overflow(rank, "receives");
  if (out.routed_rows != received) {
    return absl::InternalError(absl::StrCat("plan: rank ", rank, " receives ", received,
                                            " tokens but computes on ", out.routed_rows));
  }

  const UlyssesBag& ulysses = plan.ulysses;
  if (ulysses.gpus != bag_gpus || ulysses.first_rank != bag_first_rank) {
    return absl::InternalError(absl::StrCat("plan: rank ", rank, " is in the bag of ", bag_gpus,
                                            " GPUs from rank ", bag_first_rank, ", the plan says ",
                                            ulysses.gpus, " from ", ulysses.first_rank));
  }
  if (bag_gpus == 1) {
    out.attention_lengths = out.routed_lengths;
    out.attention_rows = out.routed_rows;
    return out;
  }
  out.ulysses_send_rows.assign(bag_gpus, out.routed_rows);
  out.ulysses_recv_rows.assign(bag_gpus, 0);
  for (const UlyssesSequence& seq : ulysses.sequences) {
    if (static_cast<int>(seq.chunk_lengths.size()) != bag_gpus) {
      return absl::InternalError(absl::StrCat("plan: a sequence of rank ", rank, "'s bag has ",
                                              seq.chunk_lengths.size(), " chunk lengths for ",
                                              bag_gpus, " GPUs"));
    }
    int64_t total = 0;
    for (int p = 0; p < bag_gpus; ++p) {
      if (seq.chunk_lengths[p] < 0) {
        return absl::InternalError(absl::StrCat("plan: a sequence of rank ", rank,
                                                "'s bag has a negative chunk length"));
      }
      if (!AddChecked(seq.chunk_lengths[p], &out.ulysses_recv_rows[p]) ||
          !AddChecked(seq.chunk_lengths[p], &total)) {
        return Overflow(rank, "Ulysses chunks");
      }
    }
    if (total != seq.length) {
      return absl::InternalError(absl::StrCat("plan: a sequence of ", seq.length,
                                              " tokens in rank ", rank, "'s bag has chunks of ",
                                              total));
    }
    out.attention_lengths.push_back(seq.length);
  }
  // This rank's own position holds exactly the chunks it computes on.
  const int position = rank - bag_first_rank;
  if (position < 0 || position >= bag_gpus) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in the bag of ",
                                                   bag_gpus, " GPUs from rank ", bag_first_rank));
  }
  if (out.ulysses_recv_rows[position] != out.routed_rows) {
    return absl::InternalError(absl::StrCat(
        "plan: rank ", rank, "'s bag lists ", out.ulysses_recv_rows[position],
        " tokens at its position but it computes on ", out.routed_rows));
  }
  if (!SumChecked(out.attention_lengths, &out.attention_rows)) {
    return Overflow(rank, "bag sequences");
  }
  return out;
}

std::vector<int64_t> AttentionIndex(const std::vector<int64_t>& ulysses_recv_rows,
                                    const UlyssesBag& bag) {
  std::vector<int64_t> index;
  if (bag.gpus <= 1) return index;
  // The receive buffer holds position 0's chunks of every sequence, then
  // position 1's...; attention wants each sequence whole, its chunks in
  // position order (which is token order: chunk offsets ascend with position).
  std::vector<int64_t> block_start(bag.gpus, 0);
  for (int p = 1; p < bag.gpus; ++p) {
    block_start[p] = block_start[p - 1] + ulysses_recv_rows[p - 1];
  }
  index.reserve(block_start.back() + ulysses_recv_rows.back());
  for (const UlyssesSequence& seq : bag.sequences) {
    for (int p = 0; p < bag.gpus; ++p) {
      for (int64_t row = 0; row < seq.chunk_lengths[p]; ++row) {
        index.push_back(block_start[p] + row);
      }
      block_start[p] += seq.chunk_lengths[p];
    }
  }
  return index;
}

}  // namespace knapformer
