/* bench/large.c - benchmark of large blocks (above 1 MB), one binary per allocator.
 *
 * Scenarios (one per process, so peak RSS and page faults are that scenario's alone):
 *
 *   grow   One buffer: p = malloc(1 MB) and write it; then n += n / 16 and p = realloc(p, n), writing
 *          the new part [old n, n), until n >= 1 GB (115 steps, to 1066 MB: 10 doublings); then shrink
 *          it back: n -= n / 16 and p = realloc(p, n) until n <= 1 MB (109 steps), touching nothing.
 *          A move is a realloc that returned another address (glibc's mremap may move a mapping
 *          without copying it: a move is not always a copy); moves are counted apart for growth and
 *          shrink. The whole cycle, ending with free, repeats -cycles times in the process (default
 *          2), so the later cycles show what an allocator keeps from the first. -fill memset (the
 *          default) writes every byte of the new part, as a buffer being filled is; -fill page writes
 *          one 8-byte word per 4 KB page. Either way every page holds one sample word, at an offset in
 *          the page that varies from page to page, whose value is derived from its offset and the
 *          cycle; after the growth and after the shrink (both untimed) every sample word inside the
 *          buffer is read back, so a realloc that lost or shifted contents shows (exit code 1).
 *          Growth is timed from the malloc to the last growth step, writes included; shrink over its
 *          reallocs; the final free is not timed.
 *   burst  2 threads, each doing 8 rounds: allocate 8 blocks of random size (uniform in 1 MB + 1 ..
 *          64 MB), write each (one byte per 4 KB page, and the last byte), then free them in a random
 *          order (a random permutation). About 260 MB live per thread at the end of a round; 128
 *          blocks and about 4 GB written in all.
 *   churn  The interleaved form of burst: each thread keeps a window of 8 live blocks (filled first)
 *          and at each of 96 steps frees a random one and allocates a new block of random size into
 *          its slot, writing it as burst does; then frees the window. All of it is timed.
 * In burst and churn every block's first and last bytes carry a tag that is checked before its free,
 * and the bytes read back go into a checksum that must equal that of the bytes written (exit code 1
 * if not). Random numbers come from xorshift64* with a fixed seed per thread and scenario, so every
 * allocator sees the same sizes and orders. Each thread is timed from a common start (a barrier) to
 * its end; the wall time runs from the barrier to the join of both.
 * Page faults are most of the cost here (a fresh page costs a fault and its zeroing, a few us on our
 * VMs): an allocator that keeps and reuses memory pays few, one that maps fresh memory for every block
 * or copies a buffer to fresh memory when it grows pays one per page each time.
 *
 * How: the same source is compiled once per allocator, chosen by one ALLOC_* define (allocator.h);
 * bench_realloc, which allocator.h does not have, is picked below the same way.
 *
 * Usage: large-<alloc> grow|burst|churn [-scale F] [-cycles K] [-fill memset|page] [-blocks B]
 *   -scale multiplies the top size of grow (1 GB at 1; at least 2 MB) and the rounds or steps of
 *   burst and churn; -blocks sets the blocks per round (burst) or the window (churn) of each thread,
 *   1..64, default 8. Prints one line on stdout: the scenario, then key=value fields:
 *     grow:        ms (all cycles, growth + shrink), ms1 (cycle 1), msr (mean of cycles 2..K, or 0),
 *                  up1, down1 (cycle 1's growth and shrink ms), moves_up, moves_down (cycle 1),
 *                  moves_up_last, moves_down_last (cycle K), steps_up, steps_down, doublings,
 *                  top_mb (the largest n), cycles, fill
 *     burst/churn: ms (wall), slow_ms (the slower thread), threads, blocks, rounds (burst) or steps
 *                  (churn) per thread, allocated (blocks allocated by all threads)
 *   then for all: peak_mb (getrusage ru_maxrss), faults (minor + major, whole process).
 *   Errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "large"
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

#if defined(ALLOC_SHARD)
#define bench_realloc(p, n) shard_realloc(p, n)
#elif defined(ALLOC_MIMALLOC)
#define bench_realloc(p, n) mi_realloc(p, n)
#elif defined(ALLOC_TCMALLOC)
#define bench_realloc(p, n) tc_realloc(p, n)
#else /* jemalloc (which replaces realloc) or glibc */
#define bench_realloc(p, n) realloc(p, n)
#endif

#define MB ((size_t)1 << 20)
#define GB ((size_t)1 << 30)
#define PAGE ((size_t)4096)

/* ---- Helpers ---- */

static inline unsigned char *resize_block(unsigned char *p, size_t size)
{
    void *q = bench_realloc(p, size);
    if (__builtin_expect(q == NULL, 0))
        out_of_memory(size);
    return q;
}

/* A 64-bit mix (the splitmix64 finaliser): the value of a sample word from its offset. */
static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* ---- grow ---- */

#define GROW_START MB
#define GROW_TOP GB                        /* at scale 1 */

/* The sample word of page k: at a multiple of 8 in the page that changes from page to page. */
static inline size_t sample_offset(size_t k)
{
    return k * PAGE + (((k * 2654435761u) >> 7) & (PAGE - 8));
}

static inline uint64_t sample_value(size_t offset, unsigned cycle)
{
    return mix(offset + ((uint64_t)cycle << 48) + 0x6c61726765u);
}

/* Writes the sample words that end in (from, to]: each is written once, when it first fits. */
static void write_samples(unsigned char *p, size_t from, size_t to, unsigned cycle)
{
    for (size_t k = from / PAGE;; k++) {
        size_t s = sample_offset(k);
        if (s + 8 > to)
            break;
        if (s + 8 > from) {
            uint64_t v = sample_value(s, cycle);
            memcpy(p + s, &v, 8);
        }
    }
}

/* The sample words inside [0, n) that do not hold their value. */
static long check_samples(const unsigned char *p, size_t n, unsigned cycle)
{
    long bad = 0;
    for (size_t k = 0;; k++) {
        size_t s = sample_offset(k);
        if (s + 8 > n)
            break;
        uint64_t v;
        memcpy(&v, p + s, 8);
        bad += v != sample_value(s, cycle);
    }
    return bad;
}

enum fill { FILL_MEMSET, FILL_PAGE };

struct grow_cycle {
    double up_ms, down_ms;
    long moves_up, moves_down, steps_up, steps_down;
    size_t top;
};

static long grow_failures;

/* Writes the new part [from, to) of the buffer. */
static inline void fill_part(unsigned char *p, size_t from, size_t to, enum fill fill, unsigned cycle)
{
    if (fill == FILL_MEMSET)
        memset(p + from, (int)(0x41 + cycle), to - from);
    write_samples(p, from, to, cycle);
}

static struct grow_cycle grow_once(size_t top, enum fill fill, unsigned cycle)
{
    struct grow_cycle c = {0};
    size_t n = GROW_START;
    uint64_t t0 = now_ns();
    unsigned char *p = alloc_block(n);
    fill_part(p, 0, n, fill, cycle);
    while (n < top) {
        size_t old = n;
        n += n / 16;
        unsigned char *q = resize_block(p, n);
        c.moves_up += q != p;
        c.steps_up++;
        p = q;
        fill_part(p, old, n, fill, cycle);
    }
    uint64_t t1 = now_ns();
    c.up_ms = (double)(t1 - t0) / 1e6;
    c.top = n;
    grow_failures += check_samples(p, n, cycle); /* untimed */

    uint64_t t2 = now_ns();
    while (n > GROW_START) {
        n -= n / 16;
        unsigned char *q = resize_block(p, n);
        c.moves_down += q != p;
        c.steps_down++;
        p = q;
    }
    uint64_t t3 = now_ns();
    c.down_ms = (double)(t3 - t2) / 1e6;
    grow_failures += check_samples(p, n, cycle);
    bench_free(p);
    return c;
}

static int doublings(size_t top)
{
    int d = 0;
    while ((GROW_START << (d + 1)) <= top)
        d++;
    return d;
}

static void run_grow(double scale, int cycles, enum fill fill)
{
    double top_d = (double)GROW_TOP * scale;
    size_t top = top_d < (double)(2 * MB) ? 2 * MB : (size_t)top_d;
    struct grow_cycle first = {0}, last = {0};
    double total = 0, rest = 0;
    for (int i = 0; i < cycles; i++) {
        struct grow_cycle c = grow_once(top, fill, (unsigned)i);
        double ms = c.up_ms + c.down_ms;
        total += ms;
        if (i == 0)
            first = c;
        else
            rest += ms;
        last = c;
    }
    printf("grow ms=%.1f ms1=%.1f msr=%.1f up1=%.1f down1=%.1f moves_up=%ld moves_down=%ld "
           "moves_up_last=%ld moves_down_last=%ld steps_up=%ld steps_down=%ld doublings=%d top_mb=%.1f "
           "cycles=%d fill=%s",
           total, first.up_ms + first.down_ms, cycles > 1 ? rest / (cycles - 1) : 0.0, first.up_ms,
           first.down_ms, first.moves_up, first.moves_down, last.moves_up, last.moves_down,
           first.steps_up, first.steps_down, doublings(first.top), (double)first.top / (double)MB,
           cycles, fill == FILL_MEMSET ? "memset" : "page");
}

/* ---- burst and churn ---- */

#define THREADS 2
#define BLOCKS 8                           /* per thread, by default: per round (burst), the window (churn) */
#define BLOCKS_MAX 64
#define BLOCK_MIN (MB + 1)
#define BLOCK_MAX (64 * MB)
#define BURST_ROUNDS 8                    /* per thread, at scale 1 */
#define CHURN_STEPS 96                     /* replacements per thread, at scale 1 */

struct worker {
    pthread_t thread;
    int churn;
    long rounds;                           /* burst: rounds; churn: replacements */
    uint64_t rng;
    uint64_t ns;
    long allocated, failures;
    uint64_t sum_written, sum_read;
    unsigned char *ptr[BLOCKS_MAX];
    size_t size[BLOCKS_MAX];
    unsigned char tag[BLOCKS_MAX];
};

static pthread_barrier_t start_line;
static size_t blocks = BLOCKS;

static inline size_t random_size(uint64_t *rng)
{
    return BLOCK_MIN + (size_t)(rng_next(rng) % (BLOCK_MAX - BLOCK_MIN + 1));
}

/* Allocates a block of a random size into slot s and writes one byte per page and the last byte. */
static inline void place(struct worker *w, size_t s)
{
    size_t size = random_size(&w->rng);
    unsigned char tag = (unsigned char)(rng_next(&w->rng) >> 56);
    unsigned char *p = alloc_block(size);
    for (size_t off = 0; off < size; off += PAGE)
        p[off] = tag;
    p[size - 1] = tag;
    w->ptr[s] = p;
    w->size[s] = size;
    w->tag[s] = tag;
    w->sum_written += 2u * tag;
    w->allocated++;
}

/* Checks the block in slot s and frees it. */
static inline void release(struct worker *w, size_t s)
{
    unsigned char *p = w->ptr[s];
    unsigned char first = p[0], last = p[w->size[s] - 1];
    w->failures += (first != w->tag[s]) + (last != w->tag[s]);
    w->sum_read += first + last;
    bench_free(p);
    w->ptr[s] = NULL;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    pthread_barrier_wait(&start_line);
    uint64_t t0 = now_ns();
    if (!w->churn) {
        size_t order[BLOCKS_MAX];
        for (long r = 0; r < w->rounds; r++) {
            for (size_t s = 0; s < blocks; s++)
                place(w, s);
            for (size_t s = 0; s < blocks; s++) /* a random permutation (Fisher-Yates) */
                order[s] = s;
            for (size_t s = blocks - 1; s > 0; s--) {
                size_t j = (size_t)(rng_next(&w->rng) % (s + 1));
                size_t t = order[s];
                order[s] = order[j];
                order[j] = t;
            }
            for (size_t s = 0; s < blocks; s++)
                release(w, order[s]);
        }
    } else {
        for (size_t s = 0; s < blocks; s++)
            place(w, s);
        for (long i = 0; i < w->rounds; i++) {
            size_t s = (size_t)(rng_next(&w->rng) % blocks);
            release(w, s);
            place(w, s);
        }
        for (size_t s = 0; s < blocks; s++)
            release(w, s);
    }
    w->ns = now_ns() - t0;
    return NULL;
}

static struct worker workers[THREADS];

static int run_threads(int churn, double scale)
{
    long count = (long)((double)(churn ? CHURN_STEPS : BURST_ROUNDS) * scale + 0.5);
    if (count < 1)
        count = 1;
    if (pthread_barrier_init(&start_line, NULL, THREADS + 1) != 0) {
        fprintf(stderr, "large: pthread_barrier_init failed\n");
        return 1;
    }
    for (int t = 0; t < THREADS; t++) {
        struct worker *w = &workers[t];
        w->churn = churn;
        w->rounds = count;
        w->rng = 0x6275727374000001u + (uint64_t)t * 0x9e3779b97f4a7c15u + (uint64_t)churn * 0x100;
        int e = pthread_create(&w->thread, NULL, work, w);
        if (e != 0) {
            fprintf(stderr, "large: pthread_create: %s\n", strerror(e));
            return 1;
        }
    }
    pthread_barrier_wait(&start_line);
    uint64_t t0 = now_ns();
    uint64_t slowest = 0;
    long allocated = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(workers[t].thread, NULL);
        if (workers[t].ns > slowest)
            slowest = workers[t].ns;
        allocated += workers[t].allocated;
    }
    uint64_t wall = now_ns() - t0;
    printf("%s ms=%.1f slow_ms=%.1f threads=%d blocks=%zu %s=%ld allocated=%ld", churn ? "churn" : "burst",
           (double)wall / 1e6, (double)slowest / 1e6, THREADS, blocks, churn ? "steps" : "rounds", count,
           allocated);
    return 0;
}

/* ---- main ---- */

static void usage(FILE *to)
{
    fprintf(to, "usage: large grow|burst|churn [-scale F] [-cycles K] [-fill memset|page] [-blocks B]\n");
}

int main(int argc, char **argv)
{
    const char *scenario = NULL;
    double scale = 1.0;
    long cycles = 2;
    enum fill fill = FILL_MEMSET;
    for (int a = 1; a < argc; a++) {
        const char *value;
        if ((value = option_value(argc, argv, &a, "-scale")) != NULL) {
            scale = option_positive("-scale", value);
        } else if ((value = option_value(argc, argv, &a, "-cycles")) != NULL) {
            cycles = option_count("-cycles", value, 1, 1000);
        } else if ((value = option_value(argc, argv, &a, "-blocks")) != NULL) {
            blocks = (size_t)option_count("-blocks", value, 1, BLOCKS_MAX);
        } else if ((value = option_value(argc, argv, &a, "-fill")) != NULL) {
            if (strcmp(value, "memset") == 0) {
                fill = FILL_MEMSET;
            } else if (strcmp(value, "page") == 0) {
                fill = FILL_PAGE;
            } else {
                fprintf(stderr, "large: bad -fill value '%s' (memset or page)\n", value);
                return 2;
            }
        } else {
            int status = option_other(argv[a], &scenario, usage);
            if (status >= 0)
                return status;
        }
    }
    if (scenario == NULL) {
        usage(stderr);
        return 2;
    }

    long failures;
    uint64_t written = 0, read = 0;
    if (strcmp(scenario, "grow") == 0) {
        run_grow(scale, (int)cycles, fill);
        failures = grow_failures;
    } else if (strcmp(scenario, "burst") == 0 || strcmp(scenario, "churn") == 0) {
        if (run_threads(strcmp(scenario, "churn") == 0, scale) != 0)
            return 1;
        failures = 0;
        for (int t = 0; t < THREADS; t++) {
            failures += workers[t].failures;
            written += workers[t].sum_written;
            read += workers[t].sum_read;
        }
    } else {
        fprintf(stderr, "large: no scenario named '%s'\n", scenario);
        usage(stderr);
        return 2;
    }

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("large: getrusage");
        return 1;
    }
    printf(" peak_mb=%.1f faults=%ld\n", (double)ru.ru_maxrss / 1024.0, (long)(ru.ru_minflt + ru.ru_majflt));
    fflush(stdout);
    if (failures != 0 || read != written) {
        fprintf(stderr, "large: %s: %ld content mismatches, checksum read %llu, written %llu\n", scenario,
                failures, (unsigned long long)read, (unsigned long long)written);
        return 1;
    }
    return 0;
}
