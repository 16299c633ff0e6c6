/* sync.h - atomics, the 16-byte CAS, a spin lock and prefetch: the processor-level helpers of
 * the core. x86-64 only (the whole allocator is); no OS and no C library.
 *
 * The atomics are the compiler's __atomic builtins on plain fields, so the structures read by the asm
 * fast paths keep a simple, known layout. Every read-modify-write names its memory order.
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

/* Replace *target with desired if it holds expected; otherwise *expected gets the current value. */
static inline bool cas128(pair128 *target, pair128 *expected, pair128 desired)
{
    bool ok;
    (void)counted(0);
    __asm__ volatile("lock cmpxchg16b %1"
                     : "=@ccz"(ok), "+m"(*target), "+a"(expected->ptr), "+d"(expected->count)
                     : "b"(desired.ptr), "c"(desired.count)
                     : "memory");
    return ok;
}

/* A lock for short sections that are never hot: spin with pause (Intel's advice, see
 * shared/seeds/fastmm4-avx-vs-fastmm5.txt) and only then give the processor away. */
typedef struct spinlock {
    uint32_t locked;
} spinlock;

void spin_wait_yield(void); /* port_yield, through a function so that sync.h needs no port.h */

/* The i-th round of a wait: pause for the first SHARD_SPIN_PAUSES rounds, then yield. */
static inline void pause_or_yield(unsigned i)
{
    if (i < SHARD_SPIN_PAUSES)
        cpu_pause();
    else
        spin_wait_yield();
}

static inline void spin_lock(spinlock *l)
{
    for (;;) {
        if (!counted(__atomic_exchange_n(&l->locked, 1u, __ATOMIC_ACQUIRE))) {
            count_lock();
            return;
        }
        for (unsigned i = 0; load_relaxed(&l->locked); i++)
            pause_or_yield(i);
    }
}

static inline void spin_unlock(spinlock *l) { __atomic_store_n(&l->locked, 0u, __ATOMIC_RELEASE); }

#endif
