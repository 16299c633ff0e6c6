/* allocator.h - the allocator under test in a benchmark: exactly one ALLOC_* define picks the calls
 * (bench_malloc, bench_free, bench_realloc, and the rest of the family: bench_calloc,
 * bench_posix_memalign, bench_aligned_alloc, bench_free_sized); now_ns() is the monotonic clock the
 * benchmarks time with, and alloc_block() a bench_malloc that never returns NULL (out_of_memory() ends
 * the run instead). Include it first, after defining _POSIX_C_SOURCE and BENCH_NAME.
 *
 * bench_free_sized(p, n) frees a block of n bytes (the size it was asked for) with the allocator's own
 * sized free where it has one: mimalloc's mi_free_size, jemalloc's sdallocx, tcmalloc's tc_free_sized.
 * shardmm has none (include/shardmm.h), so its build frees with shard_free. The system build calls C23's
 * free_sized when a library of the process exports it - a peer preloaded by a runner's --variant, say
 * snmalloc's shim - through a weak reference the dynamic linker fills in at load time, and free where
 * none does (glibc 2.36 has none). */
#ifndef BENCH_ALLOCATOR_H
#define BENCH_ALLOCATOR_H

#if defined(ALLOC_SHARD) + defined(ALLOC_MIMALLOC) + defined(ALLOC_JEMALLOC) + \
    defined(ALLOC_TCMALLOC) + defined(ALLOC_SYSTEM) != 1
#error "define exactly one of ALLOC_SHARD, ALLOC_MIMALLOC, ALLOC_JEMALLOC, ALLOC_TCMALLOC, ALLOC_SYSTEM"
#endif
#if defined(ALLOC_SHARD)
#include "shardmm.h"                 /* link: -Lbuild -lshardmm (with an rpath) */
#define bench_malloc(n) shard_malloc(n)
#define bench_free(p) shard_free(p)
#define bench_realloc(p, n) shard_realloc(p, n)
#define bench_calloc(k, n) shard_calloc(k, n)
#define bench_posix_memalign(out, a, n) shard_posix_memalign(out, a, n)
#define bench_aligned_alloc(a, n) shard_aligned_alloc(a, n)
#define bench_free_sized(p, n) ((void)(n), shard_free(p))
#elif defined(ALLOC_MIMALLOC)
#include <mimalloc.h>                /* link: -lmimalloc */
#define bench_malloc(n) mi_malloc(n)
#define bench_free(p) mi_free(p)
#define bench_realloc(p, n) mi_realloc(p, n)
#define bench_calloc(k, n) mi_calloc(k, n)
#define bench_posix_memalign(out, a, n) mi_posix_memalign(out, a, n)
#define bench_aligned_alloc(a, n) mi_aligned_alloc(a, n)
#define bench_free_sized(p, n) mi_free_size(p, n)
#elif defined(ALLOC_TCMALLOC)
#include <gperftools/tcmalloc.h>     /* link: -ltcmalloc */
#define bench_malloc(n) tc_malloc(n)
#define bench_free(p) tc_free(p)
#define bench_realloc(p, n) tc_realloc(p, n)
#define bench_calloc(k, n) tc_calloc(k, n)
#define bench_posix_memalign(out, a, n) tc_posix_memalign(out, a, n)
#define bench_aligned_alloc(a, n) tc_memalign(a, n) /* gperftools 2.10 has no tc_aligned_alloc */
#define bench_free_sized(p, n) tc_free_sized(p, n)
#else                                /* ALLOC_JEMALLOC (link -ljemalloc, which replaces malloc/free) */
#include <stdlib.h>                  /* or ALLOC_SYSTEM (glibc) */
#define bench_malloc(n) malloc(n)
#define bench_free(p) free(p)
#define bench_realloc(p, n) realloc(p, n)
#define bench_calloc(k, n) calloc(k, n)
#define bench_posix_memalign(out, a, n) posix_memalign(out, a, n)
#define bench_aligned_alloc(a, n) aligned_alloc(a, n)
#if defined(ALLOC_JEMALLOC)
void sdallocx(void *p, size_t size, int flags); /* jemalloc's sized free (<jemalloc/jemalloc.h>) */
#define bench_free_sized(p, n) sdallocx(p, n, 0)
#else
void free_sized(void *p, size_t size) __attribute__((weak)); /* C23; NULL when no library has it */
#define bench_free_sized(p, n) (free_sized != NULL ? free_sized(p, n) : free(p))
#endif
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* BENCH_NAME, which each benchmark defines before including this header, names it in messages. */
#ifndef BENCH_NAME
#error "define BENCH_NAME (the benchmark's name in messages) before including allocator.h"
#endif

/* An allocation the benchmark needs failed: a message, and exit status 1. */
__attribute__((noinline, cold, noreturn, unused)) static void out_of_memory(size_t size)
{
    fprintf(stderr, "%s: allocation of %zu bytes returned NULL\n", BENCH_NAME, size);
    exit(1);
}

/* bench_malloc, never NULL (the test is one predictable branch, the same for every allocator). */
__attribute__((unused)) static inline void *alloc_block(size_t size)
{
    void *p = bench_malloc(size);
    if (__builtin_expect(p == NULL, 0))
        out_of_memory(size);
    return p;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
