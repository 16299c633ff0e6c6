/* allocator.h - the allocator under test in a benchmark: exactly one ALLOC_* define picks the pair of
 * calls (bench_malloc, bench_free), and now_ns() is the monotonic clock the benchmarks time with.
 * Include it first, after defining _POSIX_C_SOURCE. */
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
#elif defined(ALLOC_MIMALLOC)
#include <mimalloc.h>                /* link: -lmimalloc */
#define bench_malloc(n) mi_malloc(n)
#define bench_free(p) mi_free(p)
#elif defined(ALLOC_TCMALLOC)
#include <gperftools/tcmalloc.h>     /* link: -ltcmalloc */
#define bench_malloc(n) tc_malloc(n)
#define bench_free(p) tc_free(p)
#else                                /* ALLOC_JEMALLOC (link -ljemalloc, which replaces malloc/free) */
#include <stdlib.h>                  /* or ALLOC_SYSTEM (glibc) */
#define bench_malloc(n) malloc(n)
#define bench_free(p) free(p)
#endif

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
