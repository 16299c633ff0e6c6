/* options.h - the run-time options: SHARDMM_ variables of the process's environment, read once at
 * start-up (options_read, from heap_start) through the port (port_caps.options), each with its default
 * from config.h. README.md has the table of them for users.
 *
 * The values are plain globals, written once before the first heap or large block exists and read only
 * on slow paths (a load where a build knob was an immediate): the fast paths read none of them.
 *
 * Depends on: config.h, libc.h (messages), port.h (the capabilities options and process_exit_hook).
 */
#ifndef SHARD_OPTIONS_H
#define SHARD_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct options {
    uint32_t verbose;              /* SHARDMM_VERBOSE: a line for every refusal and error-hook call */
    uint32_t show_stats;           /* SHARDMM_SHOW_STATS: the statistics table at exit */
    uint32_t report_leaks;         /* SHARDMM_REPORT_LEAKS: the leak report at exit */
    /* SHARDMM_DELAY_MS sets the three; each keeps its build knob's value as its default. */
    uint32_t decommit_delay_ms;    /* free small pages and empty arenas (SHARD_DECOMMIT_DELAY_MS) */
    uint32_t reserve_delay_ms;     /* the reserve of an exited thread's heap (SHARD_RESERVE_DELAY_MS) */
    uint32_t large_cache_delay_ms; /* the large-block cache (SHARD_LARGE_CACHE_DELAY_MS) */
    size_t large_cache_bytes;      /* SHARDMM_LARGE_CACHE_MB: the cache's committed bytes at most, 0: no
                                      cache (SHARD_LARGE_CACHE_BYTES); more by default (large.c) */
    uint32_t large_cache_fixed;    /* SHARDMM_LARGE_CACHE_MB is set: large_cache_bytes and no more */
    uint32_t large_spares;         /* SHARDMM_LARGE_SPARES: a thread keeps the large block it freed last
                                      for its next large allocation (large.c's spare); 1 by default */
    uint32_t large_colours;        /* SHARDMM_LARGE_COLOURS: large blocks start at one of 64 cache lines of
                                      their first page (large.c's colours); 1 by default */
    uint32_t earned_tails;         /* SHARDMM_EARNED_TAILS: a fresh large block's last 2 MB is a large page
                                      only while the program's lately were used to their ends (large.c's
                                      earned tails); 1 by default, 0: always */
    uint32_t lend_pages;           /* SHARDMM_LEND_PAGES: a thread heap lends the free small pages it holds
                                      beyond SHARD_LEND_AFTER to the other heaps (small.h, lent pages); 1 by
                                      default */
    uint32_t huge_pages;           /* SHARDMM_HUGE_PAGES: which segments and arenas go on large pages where
                                      the platform has them, SHARD_HUGE_PAGES_* (config.h; segment.h's
                                      segment_large_from) */
    size_t quarantine_bytes;       /* SHARDMM_QUARANTINE_MB: the full-debug build's quarantine of freed
                                      blocks, bytes at most (SHARD_QUARANTINE_BYTES); 0: none */
} options;

extern options options_values;

/* Read the options from the port, warn (SHARDMM_VERBOSE) about unknown names and invalid values, and
 * ask the port for the exit hook if an exit-time option is set. Once, from heap_start: it allocates
 * nothing (heap.c's re-entrancy rule). */
void options_read(void);

/* SHARDMM_VERBOSE's lines, "shardmm: ..." on the port's error channel; the callers test
 * options_values.verbose first. */
__attribute__((cold, noinline)) void options_say_refused(const char *call, size_t bytes);   /* the OS said no */
__attribute__((cold, noinline)) void options_say_limit(size_t bytes, size_t limit);         /* shard_set_limit did */
__attribute__((cold, noinline)) void options_say_error_hook(const char *what, const void *p); /* a hook's call */

#endif
