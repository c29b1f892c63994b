#ifndef KNAPFORMER_CLIENT_HOST_TENSOR_CACHE_H_
#define KNAPFORMER_CLIENT_HOST_TENSOR_CACHE_H_

// Host memory for the tensors the SequenceBalancer creates on CPU (send
// and receive staging, routed outputs), kept when they are freed and handed
// out again.
//
// Why: a step's exchanges allocate the same few multi-megabyte buffers every
// step. glibc returns blocks that large to the kernel on free (mmap), so
// every fresh one is page-faulted in again on first write; in route_bench
// (4 Gloo processes) that made Route + ReverseRoute 5x the bare all-to-alls,
// most of it in the kernel's fault path. The library cannot tune the
// trainer's malloc; like CUDA's caching allocator on GPUs, it can keep its
// own freed blocks for the next step. GPU tensors do not come from here.
//
// Blocks are rounded up to one of four sizes per power of two (at most 25%
// more address space; pages never written are never faulted in), reused for
// any request of their size class, and freed oldest first beyond the limit.
// Tensors may outlive every balancer: the cache lives as long as the process.
// Thread-safe.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

namespace knapformer {

// The default limit on freed bytes the cache keeps: 1 GiB, unless the
// environment variable KNAPFORMER_HOST_CACHE_BYTES (a number of bytes, read
// at the first allocation; 0 turns the cache off) says otherwise.
inline constexpr int64_t kDefaultHostCacheBytes = int64_t{1} << 30;

// Blocks smaller than this go back to malloc when freed (it reuses small
// blocks well by itself).
inline constexpr int64_t kMinCachedHostBytes = int64_t{64} << 10;

// A contiguous, uninitialised CPU tensor whose memory comes from the cache.
// Throws c10::OutOfMemoryError (as at::empty does) when the memory cannot
// be had even after the cache gave back what it holds.
at::Tensor EmptyHostTensor(c10::IntArrayRef sizes, c10::ScalarType dtype);

// At most `bytes` of freed blocks are kept (0: none, every block goes back
// to malloc when freed); blocks beyond it are freed now, oldest first.
// Negative values are taken as 0.
void SetHostCacheLimit(int64_t bytes);

struct HostCacheStats {
  int64_t limit_bytes = 0;
  int64_t cached_bytes = 0;  // freed blocks kept for reuse
  int64_t hits = 0;          // allocations served by a kept block
  int64_t misses = 0;        // allocations of a cacheable size that were not
};
HostCacheStats GetHostCacheStats();

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_HOST_TENSOR_CACHE_H_
