/* bench/churn.c - thread-churn benchmark: rounds of threads that allocate, hand blocks to the next
 * round and exit; one binary per allocator.
 *
 * What it measures: the cost of threads that come and go. Each round starts `threads` threads and
 * waits for all of them; each thread does its work and exits, and the next round starts. The shape
 * is that of mimalloc-bench's mstress (the program here is our own):
 *   - thread i of a round owns row i of a global table of slots (its live objects, at most `live`);
 *   - it makes `steps` random steps: pick a slot, check and free the object there (if any), and,
 *     7 times in 8, allocate a new object of a size drawn from the mix and fill it;
 *   - at exit it frees three quarters of its live objects and leaves the rest in its row, where
 *     thread i of the next round finds them: that thread frees them as it replaces them, or hands
 *     them on again. So every round frees blocks that threads already gone allocated (frees into a
 *     heap whose thread exited), and each new thread finds the memory of exited threads to reuse -
 *     or the allocator gave it back at exit, and the new thread pays page faults to get it again.
 * steps = objects * scale and live = steps / 4 (each slot is touched about 4 times per thread).
 *
 * Sizes: a mix is a few bands, each a share of the objects and a range [2^lo, 2^hi) drawn
 * log-uniformly (an exponent e uniform in [lo, hi), then a size uniform in [2^e, 2^(e+1))):
 *   small   all 8 B .. 1 KB
 *   mixed   89.5 % 8 B .. 1 KB, 9.5 % 1 KB .. 16 KB, 1 % 16 KB .. 256 KB (1.6 KB on average: about 7 MB
 *           live per thread at the default -objects; the default)
 *   medium  60 % 8 B .. 1 KB, 30 % 1 KB .. 16 KB, 10 % 16 KB .. 256 KB (11 KB on average, 48 MB live)
 *
 * Same work for every allocator: each (round, thread) has its own xorshift64* generator, seeded from
 * the pair, which draws its slots, sizes and decisions; the rows pass between rounds by index. Only
 * the allocator (and scheduling) differs between binaries.
 *
 * Checking: each object is filled with a pattern of 64-bit words derived from a per-object cookie and
 * the word's index: its first 4 words, its last word and one word per 4 KB page between (so every
 * page of the object is really used and, on fresh memory, faulted in). Every free checks those words
 * first; a wrong word counts one error per object. Any error makes the exit code 1.
 *
 * Usage: churn-<alloc> [-threads N] [-rounds N] [-objects N] [-mix small|mixed|medium] [-scale F]
 *   Defaults: -threads 4 -rounds 200 -objects 20000 -mix mixed -scale 1 (about 1 s with shardmm on a
 *   2-core VM, 16 million steps, 800 threads).
 *   Prints one line on stdout, "churn ms peak_rss_mb minor_faults errors": wall ms from the start of
 *   the first round to the end of the last (thread creation and exit included), peak RSS of the
 *   process in MB (getrusage ru_maxrss), minor page faults of the whole process (ru_minflt: rounds and
 *   the untimed final frees) and the number of objects that failed their check. Errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "churn"
#include "allocator.h" /* the allocator under test (one ALLOC_* define) and now_ns() */
#include "options.h"   /* -name value options */
#include "rng.h"       /* mix64, rng_next */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* ---- Parameters ---- */

#define DEFAULT_THREADS 4
#define DEFAULT_ROUNDS 200
#define DEFAULT_OBJECTS 20000      /* steps per thread per round at scale 1 */
#define MAX_THREADS 1024
#define MAX_STEPS 1000000000L      /* per thread per round, after -scale */
#define STEPS_PER_SLOT 4           /* live = steps / STEPS_PER_SLOT */
#define REFILL_PER_8 7             /* a step refills its slot 7 times in 8, else only frees */
#define HAND_ON_PER_4 1            /* a quarter of the live objects at exit go to the next round */
#define HEAD_WORDS 4               /* words of pattern at an object's start */
#define PAGE_WORDS (4096 / 8)      /* one word of pattern per 4 KB page */
#define SEED 0x636875726e303031u   /* "churn001": the base of every thread's seed */

struct band {
    unsigned per_1000;             /* share of the objects */
    unsigned lo, hi;               /* sizes in [2^lo, 2^hi) */
};

#define MAX_BANDS 3
struct mix {
    const char *name;
    struct band bands[MAX_BANDS];  /* shares add up to 1000 */
};

static const struct mix mixes[] = {
    {"small", {{1000, 3, 10}}},
    {"mixed", {{895, 3, 10}, {95, 10, 14}, {10, 14, 18}}},
    {"medium", {{600, 3, 10}, {300, 10, 14}, {100, 14, 18}}},
};

/* ---- Helpers ---- */

/* ---- Objects ---- */

struct slot {
    uint64_t *p;                   /* NULL: empty */
    uint32_t size;
    uint32_t cookie;
};

static inline uint64_t pattern(uint32_t cookie, size_t word)
{
    return ((uint64_t)cookie << 32 | (uint32_t)word) * 0x9e3779b97f4a7c15u;
}

/* The words of an object's pattern: 0 .. HEAD_WORDS-1, every PAGE_WORDS-th, and the last. */
static inline void fill(uint64_t *w, size_t size, uint32_t cookie)
{
    size_t n = size / 8;
    for (size_t i = 0; i < HEAD_WORDS && i < n; i++)
        w[i] = pattern(cookie, i);
    for (size_t i = PAGE_WORDS; i < n; i += PAGE_WORDS)
        w[i] = pattern(cookie, i);
    w[n - 1] = pattern(cookie, n - 1);
}

/* 1 when a word of the pattern is wrong. */
static inline int check(const uint64_t *w, size_t size, uint32_t cookie)
{
    size_t n = size / 8;
    uint64_t bad = 0;
    for (size_t i = 0; i < HEAD_WORDS && i < n; i++)
        bad |= w[i] ^ pattern(cookie, i);
    for (size_t i = PAGE_WORDS; i < n; i += PAGE_WORDS)
        bad |= w[i] ^ pattern(cookie, i);
    bad |= w[n - 1] ^ pattern(cookie, n - 1);
    return bad != 0;
}

/* Checks and frees the object in s (which holds one); returns 1 when its check failed. */
static inline int release(struct slot *s)
{
    int bad = check(s->p, s->size, s->cookie);
    bench_free(s->p);
    s->p = NULL;
    return bad;
}

static inline size_t draw_size(const struct mix *m, uint64_t *rng)
{
    uint64_t x = rng_next(rng);
    unsigned pick = (unsigned)((x >> 40) % 1000);
    const struct band *b = m->bands;
    while (pick >= b->per_1000) {
        pick -= b->per_1000;
        b++;
    }
    unsigned e = b->lo + (unsigned)((x >> 32 & 0xff) % (b->hi - b->lo));
    size_t base = (size_t)1 << e;
    return base + (size_t)((x & 0xffffffffu) % base);
}

/* ---- Rounds of threads ---- */

static const struct mix *mix;
static long steps;                 /* per thread per round */
static size_t live;                /* slots per thread */
static struct slot *slots;         /* threads rows of live slots, passed from round to round */

struct worker {
    pthread_t id;
    size_t row;
    uint64_t seed;
    long errors;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct slot *mine = slots + w->row * live;
    uint64_t rng = w->seed;
    long errors = 0;
    for (long i = 0; i < steps; i++) {
        uint64_t x = rng_next(&rng);
        struct slot *s = &mine[(x >> 32) % live];
        if (s->p != NULL)
            errors += release(s);
        if ((x >> 8 & 7) >= REFILL_PER_8)
            continue;
        size_t size = draw_size(mix, &rng);
        uint64_t *p = bench_malloc(size);
        if (__builtin_expect(p == NULL, 0))
            out_of_memory(size);
        s->p = p;
        s->size = (uint32_t)size;
        s->cookie = (uint32_t)x;
        fill(p, size, s->cookie);
    }
    for (size_t k = 0; k < live; k++) /* exit: hand a quarter on, free the rest */
        if (mine[k].p != NULL && (rng_next(&rng) >> 40 & 3) >= HAND_ON_PER_4)
            errors += release(&mine[k]);
    w->errors = errors;
    return NULL;
}

/* Runs the rounds; returns their wall ms and adds the check failures to *errors. */
static double run_rounds(size_t threads, long rounds, long *errors)
{
    struct worker *workers = calloc(threads, sizeof *workers);
    if (workers == NULL) {
        fprintf(stderr, "churn: out of memory for the workers\n");
        exit(1);
    }
    uint64_t t0 = now_ns();
    for (long r = 0; r < rounds; r++) {
        for (size_t i = 0; i < threads; i++) {
            workers[i].row = i;
            workers[i].seed = mix64(SEED ^ ((uint64_t)r << 20 | i)) | 1;
            int e = pthread_create(&workers[i].id, NULL, worker_main, &workers[i]);
            if (e != 0) {
                fprintf(stderr, "churn: pthread_create: %s\n", strerror(e));
                exit(1);
            }
        }
        for (size_t i = 0; i < threads; i++) {
            int e = pthread_join(workers[i].id, NULL);
            if (e != 0) {
                fprintf(stderr, "churn: pthread_join: %s\n", strerror(e));
                exit(1);
            }
            *errors += workers[i].errors;
        }
    }
    uint64_t t1 = now_ns();
    free(workers);
    return (double)(t1 - t0) / 1e6;
}

/* ---- Command line ---- */

static void usage(FILE *to)
{
    fprintf(to, "usage: churn [-threads N] [-rounds N] [-objects N] [-mix NAME] [-scale F]\n"
                "defaults: -threads %d -rounds %d -objects %d -mix mixed -scale 1\nmixes:",
            DEFAULT_THREADS, DEFAULT_ROUNDS, DEFAULT_OBJECTS);
    OPTION_LIST(to, mixes);
}

int main(int argc, char **argv)
{
    long threads = DEFAULT_THREADS, rounds = DEFAULT_ROUNDS, objects = DEFAULT_OBJECTS;
    double scale = 1.0;
    mix = &mixes[1];
    for (int a = 1; a < argc; a++) {
        const char *opt = argv[a];
        if (option_help(opt)) {
            usage(stdout);
            return 0;
        }
        if (a + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const char *val = argv[++a];
        if (strcmp(opt, "-threads") == 0) {
            threads = option_count(opt, val, 1, MAX_THREADS);
        } else if (strcmp(opt, "-rounds") == 0) {
            rounds = option_count(opt, val, 1, 1000000);
        } else if (strcmp(opt, "-objects") == 0) {
            objects = option_count(opt, val, STEPS_PER_SLOT, MAX_STEPS);
        } else if (strcmp(opt, "-mix") == 0) {
            mix = OPTION_FIND(mixes, val, "mix", usage);
        } else if (strcmp(opt, "-scale") == 0) {
            scale = option_positive(opt, val);
        } else {
            usage(stderr);
            return 2;
        }
    }

    double scaled = (double)objects * scale + 0.5;
    if (scaled > MAX_STEPS) {
        fprintf(stderr, "churn: -objects x -scale above %ld\n", (long)MAX_STEPS);
        return 2;
    }
    steps = scaled < STEPS_PER_SLOT ? STEPS_PER_SLOT : (long)scaled;
    live = (size_t)steps / STEPS_PER_SLOT;
    slots = calloc((size_t)threads * live, sizeof *slots); /* the harness's memory: libc's, untimed */
    if (slots == NULL) {
        fprintf(stderr, "churn: out of memory for %ld x %zu slots\n", threads, live);
        return 1;
    }

    long errors = 0;
    double ms = run_rounds((size_t)threads, rounds, &errors);
    for (size_t k = 0; k < (size_t)threads * live; k++) /* untimed: what the last round handed on */
        if (slots[k].p != NULL)
            errors += release(&slots[k]);
    free(slots);

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("churn: getrusage");
        return 1;
    }
    printf("churn %.1f %.1f %ld %ld\n", ms, (double)ru.ru_maxrss / 1024.0, (long)ru.ru_minflt, errors);
    fflush(stdout);
    if (errors != 0) {
        fprintf(stderr, "churn: %ld objects failed their pattern check\n", errors);
        return 1;
    }
    return 0;
}
