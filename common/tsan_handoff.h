#ifndef KNAPFORMER_COMMON_TSAN_HANDOFF_H_
#define KNAPFORMER_COMMON_TSAN_HANDOFF_H_

// Handoffs that an uninstrumented library orders, told to ThreadSanitizer.
// gRPC (Debian's, not instrumented) runs a reactor's OnCancel and OnDone on
// its own threads only after the handler returned the reactor or called its
// Finish; TSan cannot see that ordering and would report the reactor's own
// fields as raced. HandOff(p) before giving p to the library and TakeOver(p)
// where the library gives it back make the ordering visible, so that the
// suppressions need not hide every stack with a gRPC frame. No-ops without
// TSan. KNAPFORMER_HAVE_TSAN is defined in a TSan build (tests that need TSan
// skip without it).

#if defined(__SANITIZE_THREAD__)
#define KNAPFORMER_HAVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KNAPFORMER_HAVE_TSAN 1
#endif
#endif

#ifdef KNAPFORMER_HAVE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace knapformer {

inline void HandOff(const void* p) {
#ifdef KNAPFORMER_HAVE_TSAN
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

inline void TakeOver(const void* p) {
#ifdef KNAPFORMER_HAVE_TSAN
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_TSAN_HANDOFF_H_
