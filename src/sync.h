/* sync.h - atomics, the 16-byte CAS, a spin lock and prefetch: the processor-level helpers of
 * the core. x86-64 only (the whole allocator is); no OS and no C library.
 *
 * Depends on: config.h (the counters' and the spin's knobs); spin_wait_yield is defined in segment.c
 * and spin_fork_passes in heap.c, so that this header needs no port.h.
 *
 * The atomics are the compiler's __atomic builtins on plain fields, so the structures read by the asm
 * fast paths keep a simple, known layout. Every read-modify-write names its memory order. Compiled with
 * ThreadSanitizer (SHARD_TSAN), the 16-byte CAS is a builtin too, and tsan_acquire / tsan_release tell it
 * of orderings it cannot see (fuzz.ninja's build/tsan/stress).
 */
#ifndef SHARD_SYNC_H
#define SHARD_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* counted(x): x, an atomic read-modify-write, counted in a SHARD_COUNTERS build (config.h). */
#if SHARD_COUNTERS
extern uint64_t sync_atomic_ops, sync_lock_acquisitions;
#define counted(x) (__atomic_fetch_add(&sync_atomic_ops, 1, __ATOMIC_RELAXED), (x))
#define count_lock() __atomic_fetch_add(&sync_lock_acquisitions, 1, __ATOMIC_RELAXED)
#else
#define counted(x) (x)
#define count_lock() ((void)0)
#endif

#define load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define exchange_acq_rel(p, v) counted(__atomic_exchange_n((p), (v), __ATOMIC_ACQ_REL))
#define fetch_add_relaxed(p, v) counted(__atomic_fetch_add((p), (v), __ATOMIC_RELAXED))
/* Compare-and-swap; on failure *expected receives the current value. */
#define cas_acq_rel(p, expected, desired) \
    counted(__atomic_compare_exchange_n((p), (expected), (desired), false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
#define cas_release(p, expected, desired) \
    counted(__atomic_compare_exchange_n((p), (expected), (desired), false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))

/* Keeps the compiler from moving memory accesses across it; the processor may still (a store past a
 * later load, on x86-64). For the side of a handshake whose fence another thread runs for it
 * (port_caps.fence_all_threads). */
#define compiler_fence() __atomic_signal_fence(__ATOMIC_SEQ_CST)
#define fetch_sub_release(p, v) counted(__atomic_fetch_sub((p), (v), __ATOMIC_RELEASE))

static inline void cpu_pause(void) { __asm__ volatile("pause" ::: "memory"); }

/* Write intent for the line of p: the next allocation reads the link there and the caller writes.
 * prefetchw is spelled out: without -march for it the compiler would emit a read prefetch. Processors
 * without it (pre-Broadwell Intel) run it as a no-op; it never faults, also for NULL. */
static inline void prefetch_write(const void *p) { __asm__("prefetchw %0" : : "m"(*(const char *)p)); }

/* Two words changed together by cmpxchg16b: a pointer and a counter against ABA. */
typedef struct __attribute__((aligned(16))) pair128 {
    void *ptr;
    uint64_t count;
} pair128;

/* SHARD_TSAN: compiled with ThreadSanitizer (clang's and gcc's spellings). Not a knob: the compiler says. */
#if defined(__SANITIZE_THREAD__)
#define SHARD_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHARD_TSAN 1
#endif
#endif
#ifndef SHARD_TSAN
#define SHARD_TSAN 0
#endif

/* An ordering that ThreadSanitizer cannot see for itself, told to it: tsan_release(p) after the last
 * access that must come first, tsan_acquire(p) before the first that must come after (the sanitizer's
 * own interface, declared here so that no header is needed). Nothing in every other build. */
#if SHARD_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define tsan_acquire(p) __tsan_acquire(p)
#define tsan_release(p) __tsan_release(p)
#else
#define tsan_acquire(p) ((void)(p))
#define tsan_release(p) ((void)(p))
#endif

/* Replace *target with desired if it holds expected; otherwise *expected gets the current value.
 * Acquire and release both ways: a heap pushed onto the stack of free heaps is handed, whole, to the
 * thread that pops it (heap.c). The inline asm is the release build's: the compiler's 16-byte CAS would
 * need -mcx16 on every build, or become a call into libatomic. ThreadSanitizer sees no synchronisation
 * in inline asm, so its build (fuzz.ninja, with -mcx16) takes the builtin, which it instruments. */
static inline bool cas128(pair128 *target, pair128 *expected, pair128 desired)
{
#if SHARD_TSAN
    return counted(__atomic_compare_exchange(target, expected, &desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
#else
    bool ok;
    (void)counted(0);
    __asm__ volatile("lock cmpxchg16b %1"
                     : "=@ccz"(ok), "+m"(*target), "+a"(expected->ptr), "+d"(expected->count)
                     : "b"(desired.ptr), "c"(desired.count)
                     : "memory");
    return ok;
#endif
}

/* A lock for short sections that are never hot: spin with pause (Intel's advice, see
 * shared/seeds/fastmm4-avx-vs-fastmm5.txt) and only then give the processor away.
 *
 * `locked` is 0 (free), 1 (held) or SPIN_FORK: held by the fork handlers (heap.c), from the allocator's
 * prepare handler to its parent or child handler. Other libraries' handlers run in that window on the
 * forking thread, and they may allocate and free (glibc allows it); so the forking thread passes through
 * a lock its fork holds (no other thread can be inside it: the prepare handler waited for them), and its
 * unlock of such a lock leaves it held. A waiter takes the lock with a compare-and-swap from 0, never an
 * exchange, so that SPIN_FORK is never overwritten.
 *
 * Other threads must not wait for a fork either: a library's prepare handler that runs after ours may
 * wait for a mutex of its own that a thread holds while it allocates (glibc takes its own locks after
 * every prepare handler, so there that works). So the allocator's locks are taken with
 * spin_lock_unless_fork, which answers 0 instead of waiting for a lock held by another thread's fork,
 * and each caller has a way to do without (a large block that skips the cache, metadata from a
 * reservation of its own, a trim left for later); only setting the error hook waits. */
typedef struct spinlock {
    uint32_t locked;
} spinlock;
#define SPIN_FORK 2u

void spin_wait_yield(void);   /* port_yield, through a function so that sync.h needs no port.h */
int spin_fork_passes(void);   /* 1 on the thread whose fork holds the locks (heap.c) */

/* The i-th round of a wait: pause for the first SHARD_SPIN_PAUSES rounds, then yield. */
static inline void pause_or_yield(unsigned i)
{
    if (i < SHARD_SPIN_PAUSES)
        cpu_pause();
    else
        spin_wait_yield();
}

/* One attempt: 1 when the lock is now the caller's (or held by the caller's own fork). */
static inline int spin_try_lock(spinlock *l)
{
    uint32_t expected = 0;
    if (counted(__atomic_compare_exchange_n(&l->locked, &expected, 1u, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))) {
        count_lock();
        return 1;
    }
    return expected == SPIN_FORK && spin_fork_passes();
}

static inline void spin_lock(spinlock *l)
{
    while (!spin_try_lock(l))
        for (unsigned i = 0; load_relaxed(&l->locked) != 0; i++) {
            if (load_relaxed(&l->locked) == SPIN_FORK && spin_fork_passes())
                break;
            pause_or_yield(i);
        }
}

/* spin_lock, but 0 (the lock not taken) where another thread's fork holds it; 1 when it is the caller's. */
static inline int spin_lock_unless_fork(spinlock *l)
{
    for (;;) {
        if (spin_try_lock(l))
            return 1;
        for (unsigned i = 0;; i++) {
            uint32_t v = load_relaxed(&l->locked);
            if (v == 0)
                break;
            if (v == SPIN_FORK)
                return spin_fork_passes();
            pause_or_yield(i);
        }
    }
}

static inline void spin_unlock(spinlock *l)
{
    if (unlikely(load_relaxed(&l->locked) == SPIN_FORK))
        return; /* taken by passing through the fork's hold: the fork handlers give it back */
    __atomic_store_n(&l->locked, 0u, __ATOMIC_RELEASE);
}

/* The fork handlers' own: hold the lock as SPIN_FORK, and give it back. */
static inline void spin_lock_for_fork(spinlock *l)
{
    for (unsigned i = 0;; i++) {
        uint32_t expected = 0;
        if (__atomic_compare_exchange_n(&l->locked, &expected, SPIN_FORK, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        pause_or_yield(i);
    }
}

static inline void spin_unlock_for_fork(spinlock *l) { __atomic_store_n(&l->locked, 0u, __ATOMIC_RELEASE); }

#endif
