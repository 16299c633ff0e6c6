/* bench/engines.c - scripting engines on shardmm's heaps against the same engines on a malloc: the scripts of
 * tests/engines/ through Lua 5.4, Duktape 2 and mruby 3 (tests/engine.h).
 *
 * What it measures: the time an embedder spends per script with a fresh engine for each: make the engine,
 * run the script, close the engine (every object freed one by one). The scripts are the engine test's
 * (engine_scripts in tests/engine.h: a table of 100k entries, string concatenation, a JSON encoder,
 * recursive trees, closures), each at its N there, so they are allocation-heavy in the way of a runtime.
 *   engines-heap ...          each engine has a shard_heap of its own, made before the engine and
 *                             destroyed after it is closed (both timed), its hooks calling
 *                             shard_heap_realloc / shard_heap_free; linked with build/api/libshardmm.so, so
 *                             the C library's malloc (the host's) stays glibc's
 *   engines-heap ... -malloc  the engine's hooks call realloc and free: glibc's, or whatever the runner
 *                             preloads (a peer's malloc, shardmm's drop-in libshardmm.so)
 * One binary for both, so that the interpreters' code lies at the same addresses: two builds of the
 * statically linked mruby differed by 9 % in time at the same instruction count (callgrind) and the same
 * cache misses (cachegrind), which was the layout of its interpreter loop, not the allocator.
 * (engines-system, built with -DALLOC_SYSTEM, runs malloc alone.)
 *
 * Checking: each run's output (what the script printed) is hashed (FNV-1a, 64 bits); every run of the
 * process must give the same hash, and the runner checks that every allocator gives the same one. A script
 * that fails, or a hash that differs between runs, makes the exit code 1.
 *
 * Usage: engines-<system|heap> ENGINE SCRIPT [-runs R] [-malloc]
 *   ENGINE: lua, duktape or mruby; SCRIPT: a name of engine_scripts (table strings json trees closures).
 *   Runs the script R times (default 1), each in a fresh engine, from the repository's root (the scripts
 *   are read from tests/engines/, untimed). Prints one line on stdout,
 *   "ENGINE SCRIPT ms_per_run peak_rss_mb hash": the wall time of the R runs over R, the peak RSS of the
 *   program in MB (VmHWM, see peak_rss_mb) and the output's hash in hex. Errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "engines"
#include "allocator.h" /* ALLOC_SYSTEM or ALLOC_SHARD, and now_ns() */
#include "options.h"   /* -name value options */

#if defined(ALLOC_SHARD)
#define ENGINE_HEAPS 1 /* the engines on heaps */
#elif defined(ALLOC_SYSTEM)
#define ENGINE_HEAPS 0 /* the engines on malloc, which a preloaded library may be */
#else
#error "bench/engines.c is built with ALLOC_SYSTEM or ALLOC_SHARD"
#endif
#include "engine.h"    /* tests/engine.h: the engines behind one interface */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 100000

static uint64_t fnv1a(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
    return h;
}

/* One run: engine made, script run, engine closed (and its heap made and destroyed). 0 and the output's
 * hash in *hash, or 1 with a message. */
static int use_malloc = !ENGINE_HEAPS; /* -malloc */

static int run_once(int kind, const char *name, const char *src, size_t len, long n, uint64_t *hash)
{
    shard_heap *heap = NULL;
#if ENGINE_HEAPS
    if (!use_malloc && (heap = shard_heap_create(NULL)) == NULL) {
        fprintf(stderr, "engines: shard_heap_create failed\n");
        return 1;
    }
#endif
    struct engine e;
    int rc = engine_open(&e, kind, heap);
    if (rc == 0)
        rc = engine_run(&e, name, src, len, n);
    if (rc != 0)
        fprintf(stderr, "engines: %s %s: %s\n", engine_name[kind], name, e.error);
    *hash = fnv1a(e.out, e.out_len);
    engine_close(&e);
#if ENGINE_HEAPS
    if (heap != NULL)
        shard_heap_destroy(heap);
#endif
    return rc != 0;
}

/* The peak RSS of this program in MB: VmHWM of /proc/self/status, the high-water mark of the memory map
 * that exec made. (getrusage's ru_maxrss also counts the process before its exec, and a runner that forks
 * from a Python of 17 MB would put that floor under every small cell.) -1 with a message when unreadable. */
static double peak_rss_mb(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    if (f != NULL)
        fclose(f);
    if (kb < 0)
        fprintf(stderr, "engines: no VmHWM in /proc/self/status\n");
    return kb < 0 ? -1.0 : (double)kb / 1024.0;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: engines ENGINE SCRIPT [-runs R] [-malloc]\n  engines:");
    for (int k = 0; k < ENGINE_KINDS; k++)
        fprintf(to, " %s", engine_name[k]);
    fprintf(to, "\n  scripts:");
    OPTION_LIST(to, engine_scripts);
}

int main(int argc, char **argv)
{
    const char *names[2] = {NULL, NULL};
    long runs = 1;
    int given = 0;
    for (int a = 1; a < argc; a++) {
        const char *value = option_value(argc, argv, &a, "-runs");
        if (value != NULL) {
            runs = option_count("-runs", value, 1, MAX_RUNS);
            continue;
        }
        if (strcmp(argv[a], "-malloc") == 0) {
            use_malloc = 1;
            continue;
        }
        if (option_help(argv[a])) {
            usage(stdout);
            return 0;
        }
        if (argv[a][0] == '-' || given == 2) {
            usage(stderr);
            return 2;
        }
        names[given++] = argv[a];
    }
    if (given != 2) {
        usage(stderr);
        return 2;
    }
    int kind = -1;
    for (int k = 0; k < ENGINE_KINDS; k++)
        if (strcmp(names[0], engine_name[k]) == 0)
            kind = k;
    if (kind < 0) {
        fprintf(stderr, "engines: no engine named '%s'\n", names[0]);
        usage(stderr);
        return 2;
    }
    const struct engine_script_size *script = OPTION_NEED(engine_scripts, names[1], "script", usage);

    size_t len;
    char *src = engine_script(kind, script->name, &len);
    if (src == NULL)
        return 1;
    uint64_t first = 0, hash = 0;
    uint64_t t0 = now_ns();
    for (long r = 0; r < runs; r++) {
        if (run_once(kind, script->name, src, len, script->n, &hash) != 0)
            return 1;
        if (r == 0)
            first = hash;
        else if (hash != first) {
            fprintf(stderr, "engines: %s %s: run %ld printed something else than run 1\n", engine_name[kind],
                    script->name, r + 1);
            return 1;
        }
    }
    double ms = (double)(now_ns() - t0) / 1e6 / (double)runs;
    free(src);

    double peak = peak_rss_mb();
    if (peak < 0)
        return 1;
    printf("%s %s %.2f %.1f %016llx\n", engine_name[kind], script->name, ms, peak, (unsigned long long)first);
    fflush(stdout);
    return 0;
}
