/* peak.c - shardmm's own statistics at the moment a process's anonymous memory peaked: a library to
 * preload after libshardmm.so, for finding out where a benchmark's peak RSS goes.
 *
 *   LD_PRELOAD="build/libshardmm.so build/bench/peak.so" build/bench/shapes-system larson -threads 2
 *
 * What: at load it starts a thread that reads /proc/self/smaps_rollup every millisecond. Whenever the
 * process's anonymous memory is above the highest it has seen, it takes shard_get_stats (include/shardmm.h)
 * at once, so that at exit it holds shardmm's picture of that moment: how much was committed, how much of it
 * live blocks, pages serving a class and free, heaps, spare and orphan segments, the large-block cache. At
 * exit it prints one line to stderr, "peak: anon_kb=... huge_kb=... committed_kb=...", each figure a
 * key=value pair (huge_kb: what of anon_kb lay in transparent huge pages). Under another allocator (no
 * shard_get_stats in the process) it prints the two memory figures alone.
 *
 * How far to trust it: a millisecond between reads misses shorter peaks, and the statistics are taken a
 * little after the reading, while the other threads run on (their counts of live blocks are exact only when
 * nothing allocates meanwhile). The thread never allocates (reads with open and read, no stdio), so it
 * makes no heap of its own. Linux only; the benchmarks' flags (bench_flags), -fPIC, libdl's dlsym in glibc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shardmm.h"

static void (*get_stats)(shard_stats *);
static shard_stats at_peak;
static long peak_anon_kb, peak_huge_kb;
static volatile int stopping;
static pthread_t sampler;
static int sampling;

/* The number after `name` in text (a line of smaps_rollup, in kB), or 0. */
static long kb_after(const char *text, const char *name)
{
    const char *at = strstr(text, name);
    return at == NULL ? 0 : strtol(at + strlen(name), NULL, 10);
}

static void *sample(void *unused)
{
    (void)unused;
    char text[4096];
    const struct timespec millisecond = {0, 1000000};
    while (!stopping) {
        int fd = open("/proc/self/smaps_rollup", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return NULL;
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        text[n > 0 ? n : 0] = '\0';
        long anon = kb_after(text, "\nAnonymous:");
        if (anon > peak_anon_kb) {
            peak_anon_kb = anon;
            peak_huge_kb = kb_after(text, "\nAnonHugePages:");
            if (get_stats != NULL)
                get_stats(&at_peak);
        }
        nanosleep(&millisecond, NULL);
    }
    return NULL;
}

__attribute__((constructor)) static void peak_start(void)
{
    get_stats = (void (*)(shard_stats *))dlsym(RTLD_DEFAULT, "shard_get_stats");
    sampling = pthread_create(&sampler, NULL, sample, NULL) == 0;
}

__attribute__((destructor)) static void peak_report(void)
{
    if (!sampling)
        return;
    stopping = 1;
    pthread_join(sampler, NULL);
    char line[1024];
    int n = snprintf(line, sizeof line, "peak: anon_kb=%ld huge_kb=%ld", peak_anon_kb, peak_huge_kb);
    const shard_stats *s = &at_peak;
    if (get_stats != NULL)
        n += snprintf(line + n, sizeof line - (size_t)n,
                      " committed_kb=%zu live_small_kb=%zu live_medium_kb=%zu live_large_kb=%zu"
                      " small_pages_used=%zu small_pages_free=%zu small_pages_decommitted=%zu"
                      " medium_arenas=%zu heaps=%zu heaps_waiting=%zu spare_segments=%zu spare_kb=%zu"
                      " orphan_segments=%zu large_cached_kb=%zu",
                      s->committed >> 10, s->live_small_bytes >> 10, s->live_medium_bytes >> 10,
                      s->live_large_bytes >> 10, s->small_pages_used, s->small_pages_free,
                      s->small_pages_decommitted, s->medium_arenas, s->heaps, s->heaps_free, s->spare_segments,
                      s->spare_bytes >> 10, s->orphan_segments, s->large_cached_bytes >> 10);
    n += snprintf(line + n, sizeof line - (size_t)n, "\n");
    if (write(2, line, (size_t)n) < 0)
        return;
}
