/* test_engines.c - shardmm's heaps (shard_heap_*) under real scripting engines: Lua 5.4, Duktape 2 and mruby 3,
 * each with all of its memory through its allocator hook on a heap of its own (tests/engine.h).
 *
 * The rules, as this file reads them (include/shardmm.h, issue 22):
 * - An engine on a heap computes what it computes on the C library's malloc: every script of
 *   tests/engines/ prints the same text through both, and an engine that is closed leaves its heap with
 *   no live block (everything it allocated went back through the hook).
 * - Under a limit, an allocation that would pass it calls on_limit and then returns NULL: the engine
 *   reports its own out-of-memory error (Lua "not enough memory", Duktape "alloc failed", mruby
 *   NoMemoryError), the heap never held more than the limit, and the host goes on (a fresh engine runs
 *   the next script). A callback that raises the limit lets the script finish.
 * - Destroying a heap reclaims an engine that was never closed: after 50 rounds of engines dropped in
 *   mid-script the process's resident memory is within a few MB of where it started.
 * - A heap is used by one thread at a time and may move between threads: 1000 engines on 4 threads,
 *   some closed, some dropped, some created on one thread, run on a second and ended on a third, compute
 *   the right output; the resident memory does not grow from the first 500 to the next 500, no more heap
 *   structures are made than engines' heaps are alive at once (destroyed ones are reused), and
 *   shard_check() finds nothing wrong.
 *
 * The scripts are read from tests/engines/, so run it from the repository's root (tests/run does).
 * Build: see build.ninja (build/test-engines). Run: build/test-engines [test names]
 */
#define HARNESS_MAIN
#include "harness.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "shardmm.h"

#define MB ((size_t)1 << 20)
#define OOM_LIMIT (32 * MB)        /* the limit of the out-of-memory test */
#define RSS_SLACK (8 * MB)         /* "within a few MB": what resident memory may grow by */
#define ABANDON_ROUNDS 50
#define ABANDON_N 24000            /* entries an abandoned script keeps: 5 to 8 MB of engine memory */
#define WORKERS 4
#define INSTANCES 1000             /* engines of the thread test, in two halves */
#define INSTANCE_N_DIVISOR 100     /* the thread test's scripts run at 1/100 of their N */

/* ---- helpers ---- */

/* The process's resident memory, bytes (/proc/self/statm). */
static size_t rss_now(void)
{
    unsigned long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL || fscanf(f, "%lu %lu", &pages, &resident) != 2)
        resident = 0;
    if (f != NULL)
        fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static double in_mb(size_t bytes) { return (double)bytes / (double)MB; }

static long long signed_delta(size_t from, size_t to) { return (long long)to - (long long)from; }

static shard_heap_stats heap_stats(shard_heap *heap)
{
    shard_heap_stats s;
    memset(&s, 0, sizeof s);
    shard_heap_get_stats(heap, &s);
    return s;
}

static size_t heap_live_blocks(shard_heap *heap)
{
    shard_heap_stats s = heap_stats(heap);
    return s.live_small + s.live_medium + s.live_large;
}

static size_t heap_live_bytes(shard_heap *heap)
{
    shard_heap_stats s = heap_stats(heap);
    return s.live_small_bytes + s.live_medium_bytes + s.live_large_bytes;
}

static shard_stats process_stats(void)
{
    shard_stats s;
    memset(&s, 0, sizeof s);
    shard_get_stats(&s);
    return s;
}

/* The text of every script in every engine, read once. */
static struct {
    char *text;
    size_t len;
} sources[ENGINE_KINDS][ENGINE_SCRIPTS + 2];
#define SCRIPT_OOM ENGINE_SCRIPTS
#define SCRIPT_ABANDON (ENGINE_SCRIPTS + 1)

static const char *script_name(int script)
{
    return script == SCRIPT_OOM ? "oom" : script == SCRIPT_ABANDON ? "abandon" : engine_scripts[script].name;
}

/* Reads every script; 0 when one is missing (then the tests that need it fail, naming it). */
static int load_sources(void)
{
    static int loaded = -1;
    if (loaded >= 0)
        return loaded;
    loaded = 1;
    for (int k = 0; k < ENGINE_KINDS; k++)
        for (int s = 0; s < ENGINE_SCRIPTS + 2; s++)
            if ((sources[k][s].text = engine_script(k, script_name(s), &sources[k][s].len)) == NULL)
                loaded = 0;
    return loaded;
}

/* Runs script s with n in a new engine of kind k (on heap, or malloc when heap is NULL) and closes it.
 * Returns the output (malloc'd; the caller frees it), or NULL with a failure recorded. */
static char *run_closed(int k, int s, long n, shard_heap *heap)
{
    struct engine e;
    if (engine_open(&e, k, heap) != 0) {
        CHECKF(0, "%s: the engine could not be made: %s", engine_name[k], e.error);
        engine_close(&e);
        return NULL;
    }
    int rc = engine_run(&e, script_name(s), sources[k][s].text, sources[k][s].len, n);
    CHECKF(rc == 0, "%s %s (n %ld, %s): %s", engine_name[k], script_name(s), n, heap ? "heap" : "malloc", e.error);
    char *out = rc == 0 ? strdup(e.out) : NULL;
    engine_close(&e);
    return out;
}

/* The output of a script that ran: its first word is the script's name. */
static int looks_like_output(const char *out, int s)
{
    size_t len = strlen(script_name(s));
    return out != NULL && strncmp(out, script_name(s), len) == 0 && (out[len] == '\t' || out[len] == ' ');
}

/* ---- output on a heap equals output on malloc ---- */

TEST(every_script_prints_the_same_on_a_heap_as_on_malloc)
{
    if (!load_sources())
        CHECKF(0, "the scripts of tests/engines/ could not be read");
    for (int k = 0; k < ENGINE_KINDS && load_sources(); k++) {
        for (int s = 0; s < ENGINE_SCRIPTS; s++) {
            long n = engine_scripts[s].n;
            char *expected = run_closed(k, s, n, NULL);
            shard_heap *heap = shard_heap_create(NULL);
            CHECKF(heap != NULL, "shard_heap_create(NULL) failed");
            if (heap == NULL) {
                free(expected);
                continue;
            }
            char *got = run_closed(k, s, n, heap);
            CHECKF(looks_like_output(expected, s), "%s %s on malloc printed '%s'", engine_name[k], script_name(s),
                   expected ? expected : "(nothing)");
            CHECKF(got != NULL && expected != NULL && strcmp(got, expected) == 0,
                   "%s %s: on the heap it printed\n    %s  on malloc\n    %s", engine_name[k], script_name(s),
                   got ? got : "(nothing)\n", expected ? expected : "(nothing)\n");
            shard_heap_stats st = heap_stats(heap);
            CHECKF(st.live_small + st.live_medium + st.live_large == 0,
                   "%s %s: the closed engine left %zu small, %zu medium, %zu large blocks in its heap",
                   engine_name[k], script_name(s), st.live_small, st.live_medium, st.live_large);
            CHECKF(st.committed_peak > 0, "%s %s: the heap never held memory: is the hook used?", engine_name[k],
                   script_name(s));
            shard_heap_destroy(heap);
            free(expected);
            free(got);
        }
    }
    CHECK_EQ(shard_check(), 0);
}

/* ---- out of memory under a limit ---- */

struct limit_calls {
    int calls;
    size_t largest;     /* the largest size asked for */
    size_t raise_by;    /* 0: refuse; else raise the limit by this much (up to raise_to) and retry */
    size_t raise_to;
};

static int on_limit(void *arg, shard_heap *heap, size_t size)
{
    struct limit_calls *c = arg;
    c->calls++;
    if (size > c->largest)
        c->largest = size;
    if (c->raise_by == 0)
        return 0;
    shard_heap_stats s = heap_stats(heap);
    if (s.limit + c->raise_by > c->raise_to)
        return 0;
    shard_heap_set_limit(heap, s.limit + c->raise_by);
    return 1;
}

/* The engine's own out-of-memory error, as it words it. */
static int is_out_of_memory(int k, const char *error)
{
    switch (k) {
    case ENGINE_LUA:
        return strcmp(error, "not enough memory") == 0;
    case ENGINE_DUKTAPE:
        return strstr(error, "alloc failed") != NULL &&
               (strncmp(error, "Error", 5) == 0 || strncmp(error, "RangeError", 10) == 0);
    default:
        return strncmp(error, "NoMemoryError", 13) == 0;
    }
}

TEST(an_unbounded_script_gets_the_engines_out_of_memory_error_within_32_mb)
{
    if (!load_sources()) {
        CHECKF(0, "the scripts of tests/engines/ could not be read");
        return;
    }
    const int next = 3; /* trees: what the host runs next, in a fresh engine */
    for (int k = 0; k < ENGINE_KINDS; k++) {
        struct limit_calls calls = {0, 0, 0, 0};
        shard_heap_options opt = {OOM_LIMIT, on_limit, &calls};
        shard_heap *heap = shard_heap_create(&opt);
        CHECKF(heap != NULL, "shard_heap_create with a limit failed");
        if (heap == NULL)
            continue;
        struct engine e;
        int opened = engine_open(&e, k, heap);
        CHECKF(opened == 0, "%s: the engine could not be made under the limit: %s", engine_name[k], e.error);
        if (opened == 0) {
            int rc = engine_run(&e, "oom", sources[k][SCRIPT_OOM].text, sources[k][SCRIPT_OOM].len, 0);
            CHECKF(rc != 0, "%s: the unbounded script ended without an error", engine_name[k]);
            CHECKF(is_out_of_memory(k, e.error), "%s: the error is '%s', not the engine's out of memory",
                   engine_name[k], e.error);
            printf("  %s: '%s' after %d refusals, the largest %zu bytes\n", engine_name[k], e.error, calls.calls,
                   calls.largest);
        }
        shard_heap_stats st = heap_stats(heap);
        CHECKF(calls.calls > 0, "%s: on_limit was never called", engine_name[k]);
        CHECKF(st.committed_peak <= OOM_LIMIT && st.committed <= OOM_LIMIT,
               "%s: the heap held %.1f MB (peak %.1f MB), over the limit of %.0f MB", engine_name[k],
               in_mb(st.committed), in_mb(st.committed_peak), in_mb(OOM_LIMIT));
        CHECKF(st.committed_peak > OOM_LIMIT / 2, "%s: the heap's peak was %.1f MB: the script stopped before "
               "nearing the limit", engine_name[k], in_mb(st.committed_peak));
        CHECK_EQ(st.limit, OOM_LIMIT);
        engine_close(&e); /* the engine survives its out of memory: it closes, every block goes back */
        CHECKF(heap_live_blocks(heap) == 0, "%s: the engine closed after its out of memory left %zu blocks",
               engine_name[k], heap_live_blocks(heap));
        shard_heap_destroy(heap);

        /* The host goes on: the next script in a fresh engine, on a fresh heap with the same limit. */
        char *expected = run_closed(k, next, engine_scripts[next].n, NULL);
        heap = shard_heap_create(&opt);
        CHECKF(heap != NULL, "shard_heap_create with a limit failed");
        if (heap == NULL) {
            free(expected);
            continue;
        }
        int before = calls.calls;
        char *got = run_closed(k, next, engine_scripts[next].n, heap);
        CHECKF(got != NULL && expected != NULL && strcmp(got, expected) == 0,
               "%s: after the out of memory, %s printed '%s', on malloc '%s'", engine_name[k], script_name(next),
               got ? got : "(nothing)", expected ? expected : "(nothing)");
        CHECKF(calls.calls == before, "%s: %s hit the limit %d times", engine_name[k], script_name(next),
               calls.calls - before);
        shard_heap_destroy(heap);
        free(expected);
        free(got);
    }
    CHECK_EQ(shard_check(), 0);
}

TEST(a_callback_that_raises_the_limit_lets_the_script_finish)
{
    if (!load_sources()) {
        CHECKF(0, "the scripts of tests/engines/ could not be read");
        return;
    }
    const int script = 3; /* trees: a few MB in every engine */
    for (int k = 0; k < ENGINE_KINDS; k++) {
        long n = engine_scripts[script].n;
        char *expected = run_closed(k, script, n, NULL);
        struct limit_calls calls = {0, 0, MB, 256 * MB};
        shard_heap_options opt = {MB, on_limit, &calls};
        shard_heap *heap = shard_heap_create(&opt);
        CHECKF(heap != NULL, "shard_heap_create with a limit failed");
        if (heap == NULL) {
            free(expected);
            continue;
        }
        char *got = run_closed(k, script, n, heap);
        CHECKF(got != NULL && expected != NULL && strcmp(got, expected) == 0,
               "%s: with the limit raised on demand %s printed '%s', on malloc '%s'", engine_name[k],
               script_name(script), got ? got : "(nothing)", expected ? expected : "(nothing)");
        shard_heap_stats st = heap_stats(heap);
        CHECKF(calls.calls > 0 && st.limit > MB, "%s: on_limit called %d times, the limit now %.0f MB",
               engine_name[k], calls.calls, in_mb(st.limit));
        CHECKF(st.committed_peak <= st.limit, "%s: the heap held %.1f MB at its peak, over its limit of %.0f MB",
               engine_name[k], in_mb(st.committed_peak), in_mb(st.limit));
        printf("  %s: the limit raised %d times to %.0f MB, peak %.1f MB\n", engine_name[k], calls.calls,
               in_mb(st.limit), in_mb(st.committed_peak));
        shard_heap_destroy(heap);
        free(expected);
        free(got);
    }
}

/* ---- engines dropped without closing ---- */

/* One round: a heap, an engine of kind k that keeps ABANDON_N entries and fails in mid-script, dropped
 * without closing; the heap destroyed. Returns the heap's live bytes just before the destroy. */
static size_t abandon_round(int k)
{
    shard_heap *heap = shard_heap_create(NULL);
    CHECKF(heap != NULL, "shard_heap_create(NULL) failed");
    if (heap == NULL)
        return 0;
    struct engine e;
    if (engine_open(&e, k, heap) == 0) {
        int rc = engine_run(&e, "abandon", sources[k][SCRIPT_ABANDON].text, sources[k][SCRIPT_ABANDON].len,
                            ABANDON_N);
        CHECKF(rc != 0 && strstr(e.error, "abandoned after") != NULL, "%s: the abandoned script's error is '%s'",
               engine_name[k], rc ? e.error : "(none)");
    } else {
        CHECKF(0, "%s: the engine could not be made: %s", engine_name[k], e.error);
    }
    size_t live = heap_live_bytes(heap);
    engine_forget(&e); /* no lua_close, duk_destroy_heap, mrb_close: the heap goes whole */
    shard_heap_destroy(heap);
    return live;
}

TEST(engines_dropped_in_mid_script_are_reclaimed_by_destroying_their_heap)
{
    if (!load_sources()) {
        CHECKF(0, "the scripts of tests/engines/ could not be read");
        return;
    }
    for (int k = 0; k < ENGINE_KINDS; k++) /* warm: the libraries' and the allocator's first-use memory */
        abandon_round(k);
    size_t base = rss_now(), highest = base, least_live = SIZE_MAX;
    for (int round = 0; round < ABANDON_ROUNDS; round++) {
        int k = round % ENGINE_KINDS;
        size_t live = abandon_round(k);
        if (live < least_live)
            least_live = live;
        size_t rss = rss_now();
        if (rss > highest)
            highest = rss;
        CHECKF(rss <= base + RSS_SLACK, "round %d (%s): resident %.1f MB, %.1f MB above the %.1f MB before",
               round, engine_name[k], in_mb(rss), in_mb(rss - base), in_mb(base));
    }
    printf("  %d rounds, each dropping at least %.1f MB of live blocks: resident memory at most %+.1f MB from "
           "%.1f MB, %+.1f MB at the end\n", ABANDON_ROUNDS, in_mb(least_live),
           (double)signed_delta(base, highest) / (double)MB, in_mb(base),
           (double)signed_delta(base, rss_now()) / (double)MB);
    CHECKF(least_live >= 4 * MB, "an abandoned engine held only %.1f MB: the rounds prove little",
           in_mb(least_live));
    CHECK_EQ(shard_check(), 0);
}

/* ---- 1000 engines on 4 threads ---- */

enum fate {
    FATE_CLOSE,      /* created, run and closed on one thread */
    FATE_DROP,       /* the same, but dropped without closing */
    FATE_MOVE_CLOSE, /* created on one thread, run on the next, closed on the one after */
    FATE_MOVE_DROP,  /* the same, dropped on the third */
    FATES
};

struct job {
    struct job *next;
    int index, kind, script, fate;
    int stage;              /* the next stage: 0 create, 1 run, 2 end */
    int thread[3];          /* the worker of each stage */
    shard_heap *heap;
    struct engine e;
    int failed;             /* the engine could not be made or the script failed */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_barrier_t phase;
    struct job *queue[WORKERS];     /* jobs handed to each worker */
    int next_index, phase_end, done;
    int fate_count[FATES];
    int heaps_alive, heaps_most;    /* engines' heaps alive now, and at the most */
    char *expected[ENGINE_KINDS][ENGINE_SCRIPTS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static long instance_n(int script)
{
    long n = engine_scripts[script].n / INSTANCE_N_DIVISOR;
    return n > 0 ? n : 1;
}

static void hand_over(struct job *j, int worker)
{
    pthread_mutex_lock(&pool.lock);
    j->next = pool.queue[worker];
    pool.queue[worker] = j;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
}

/* One stage of a job on worker w; a moving job goes to the next worker after its first two stages. */
static void job_stage(struct job *j, int w)
{
    j->thread[j->stage] = w;
    if (j->stage == 0) {
        j->heap = shard_heap_create(NULL);
        if (j->heap != NULL) { /* heaps alive at once, and their most */
            int alive = __atomic_add_fetch(&pool.heaps_alive, 1, __ATOMIC_RELAXED);
            int most = __atomic_load_n(&pool.heaps_most, __ATOMIC_RELAXED);
            while (alive > most &&
                   !__atomic_compare_exchange_n(&pool.heaps_most, &most, alive, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
        }
        j->failed = j->heap == NULL || engine_open(&j->e, j->kind, j->heap) != 0;
        CHECKF(!j->failed, "instance %d (%s): no heap or no engine: %s", j->index, engine_name[j->kind],
               j->heap ? j->e.error : "shard_heap_create failed");
    } else if (j->stage == 1 && !j->failed) {
        int s = j->script;
        int rc = engine_run(&j->e, script_name(s), sources[j->kind][s].text, sources[j->kind][s].len,
                            instance_n(s));
        CHECKF(rc == 0 && strcmp(j->e.out, pool.expected[j->kind][s]) == 0,
               "instance %d (%s %s, fate %d): printed '%s' (error '%s'), on malloc '%s'", j->index,
               engine_name[j->kind], script_name(s), j->fate, j->e.out, j->e.error, pool.expected[j->kind][s]);
    } else if (j->stage == 2) {
        if (j->fate == FATE_CLOSE || j->fate == FATE_MOVE_CLOSE) {
            engine_close(&j->e);
            CHECKF(j->heap == NULL || heap_live_blocks(j->heap) == 0,
                   "instance %d (%s): the closed engine left %zu blocks", j->index, engine_name[j->kind],
                   heap_live_blocks(j->heap));
        } else {
            engine_forget(&j->e);
        }
        if (j->heap != NULL) {
            shard_heap_destroy(j->heap);
            __atomic_sub_fetch(&pool.heaps_alive, 1, __ATOMIC_RELAXED);
        }
        if (j->fate == FATE_MOVE_CLOSE || j->fate == FATE_MOVE_DROP)
            CHECKF(j->thread[0] != j->thread[1] && j->thread[1] != j->thread[2] && j->thread[0] != j->thread[2],
                   "instance %d moved between workers %d, %d, %d", j->index, j->thread[0], j->thread[1],
                   j->thread[2]);
    }
    j->stage++;
}

/* Runs a job from creation to its end, handing it over between stages when it moves. */
static void job_work(struct job *j, int w)
{
    int moves = j->fate == FATE_MOVE_CLOSE || j->fate == FATE_MOVE_DROP;
    while (j->stage < 3) {
        job_stage(j, w);
        if (moves && j->stage < 3) {
            hand_over(j, (w + 1) % WORKERS);
            return;
        }
    }
    pthread_mutex_lock(&pool.lock);
    pool.fate_count[j->fate]++;
    pool.done++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    free(j);
}

static void *worker(void *arg)
{
    int w = (int)(intptr_t)arg;
    for (int phase = 0; phase < 2; phase++) {
        pthread_mutex_lock(&pool.lock);
        for (;;) {
            struct job *j = pool.queue[w];
            if (j != NULL) {
                pool.queue[w] = j->next;
            } else if (pool.next_index < pool.phase_end) {
                int i = pool.next_index++;
                j = calloc(1, sizeof *j);
                if (j == NULL)
                    abort();
                j->index = i;
                j->kind = i % ENGINE_KINDS;
                j->script = (i / ENGINE_KINDS) % ENGINE_SCRIPTS;
                j->fate = (i / (ENGINE_KINDS * ENGINE_SCRIPTS)) % FATES;
            } else if (pool.done == pool.phase_end) {
                break;
            } else {
                pthread_cond_wait(&pool.wake, &pool.lock);
                continue;
            }
            pthread_mutex_unlock(&pool.lock);
            job_work(j, w);
            pthread_mutex_lock(&pool.lock);
        }
        pthread_mutex_unlock(&pool.lock);
        pthread_barrier_wait(&pool.phase); /* the phase is over: main looks */
        pthread_barrier_wait(&pool.phase); /* main has looked and set the next phase */
    }
    return NULL;
}

TEST(a_thousand_engines_on_four_threads_some_moved_some_dropped)
{
    if (!load_sources()) {
        CHECKF(0, "the scripts of tests/engines/ could not be read");
        return;
    }
    for (int k = 0; k < ENGINE_KINDS; k++)
        for (int s = 0; s < ENGINE_SCRIPTS; s++) {
            pool.expected[k][s] = run_closed(k, s, instance_n(s), NULL);
            CHECKF(looks_like_output(pool.expected[k][s], s), "%s %s on malloc printed '%s'", engine_name[k],
                   script_name(s), pool.expected[k][s] ? pool.expected[k][s] : "(nothing)");
            if (pool.expected[k][s] == NULL)
                return;
        }
    size_t heaps_before = process_stats().heaps;
    pthread_barrier_init(&pool.phase, NULL, WORKERS + 1);
    pool.phase_end = INSTANCES / 2;
    pthread_t threads[WORKERS];
    int started = 0;
    for (; started < WORKERS; started++)
        if (pthread_create(&threads[started], NULL, worker, (void *)(intptr_t)started) != 0)
            break;
    CHECKF(started == WORKERS, "only %d worker threads started", started);
    if (started != WORKERS)
        abort(); /* the barrier would wait for the missing ones forever */

    pthread_barrier_wait(&pool.phase);
    size_t rss_half = rss_now();
    shard_stats half = process_stats();
    pool.phase_end = INSTANCES;
    pthread_barrier_wait(&pool.phase);

    pthread_barrier_wait(&pool.phase);
    size_t rss_end = rss_now();
    shard_stats end = process_stats();
    pthread_barrier_wait(&pool.phase);
    for (int t = 0; t < WORKERS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&pool.phase);

    printf("  %d engines: %d closed, %d dropped, %d moved and closed, %d moved and dropped; resident %.1f MB after "
           "the first half, %+.1f MB after the second; heaps %zu then %zu (at most %d engines' heaps at once)\n", pool.done,
           pool.fate_count[FATE_CLOSE], pool.fate_count[FATE_DROP], pool.fate_count[FATE_MOVE_CLOSE],
           pool.fate_count[FATE_MOVE_DROP], in_mb(rss_half), (double)signed_delta(rss_half, rss_end) / (double)MB,
           half.heaps, end.heaps, pool.heaps_most);
    CHECK_EQ(pool.done, INSTANCES);
    for (int f = 0; f < FATES; f++)
        CHECKF(pool.fate_count[f] >= INSTANCES / FATES - ENGINE_KINDS * ENGINE_SCRIPTS,
               "only %d engines of fate %d", pool.fate_count[f], f);
    CHECKF(rss_end <= rss_half + RSS_SLACK, "resident memory grew from %.1f MB to %.1f MB over the second 500",
           in_mb(rss_half), in_mb(rss_end));
    /* Heap structures are reused: no more are ever made than the workers' own and the engines' heaps
     * alive at once at the most (which depends on how the hand-overs queue up, not on the run's length). */
    CHECKF(end.heaps <= heaps_before + WORKERS + (size_t)pool.heaps_most,
           "%zu heaps after 1000 engines: %zu before, %d workers, at most %d engines' heaps alive at once", end.heaps,
           heaps_before, WORKERS, pool.heaps_most);
    CHECK_EQ(shard_check(), 0);
    for (int k = 0; k < ENGINE_KINDS; k++)
        for (int s = 0; s < ENGINE_SCRIPTS; s++)
            free(pool.expected[k][s]);
}
