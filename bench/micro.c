/* bench/micro.c - micro benchmark of malloc/free pairs of small sizes, one binary per allocator.
 *
 * What it measures: the average wall-clock cost, in nanoseconds, of one allocation plus its free
 * ("ns per pair") for a few access patterns (rows), each stressing a different path of an allocator:
 *   fixed-32        malloc(32) and free at once: the thread-local fast path.
 *   mixed-lifo      batches of 100 mixed sizes (16..1024, skewed to small), freed newest first.
 *   mixed-fifo      the same batches, freed oldest first.
 *   lifo-1000       1000 blocks of 64 bytes, freed newest first.
 *   fifo-1000       1000 blocks of 64 bytes, freed oldest first.
 *   fill-free       batches of 100000 mixed sizes (16..1024, skewed to small), about 30 MB: each fills
 *                   many pages and segments before it is freed, oldest first.
 *   random-replace  10000 live blocks of 16..2048 bytes; each step frees a random one and allocates a
 *                   new random size into its slot (a fragmented steady state, cache-missing).
 *   replace-64, replace-256, replace-1024
 *                   1024 live blocks of one size; each step frees a random one and allocates a block of
 *                   that size into its slot, its first and last words written (bench/shapes.c's
 *                   glibc-thread-fixed). At 256 and 1024 bytes the blocks fill 4 and 16
 *                   pages of 64 KB: which block a malloc gets back after a free into a full page decides
 *                   the row (bench/results/2026-12-06-lifo-reuse.md).
 *   foreign-free    a producer thread allocates 64-byte blocks, a consumer thread frees them (the
 *                   cross-thread free path); they are handed over through a lock-free SPSC ring.
 *
 * How: the same source is compiled once per allocator, chosen by one ALLOC_* define (the macro block
 * below). Random sizes come from a fixed-seed xorshift generator and are drawn into tables before the
 * clock starts, so every allocator sees the same sequence. Each row first runs untimed on 1/16 of its
 * work (warm-up: first page faults, heap creation), then runs its full work between two readings of
 * clock_gettime(CLOCK_MONOTONIC); ns per pair = elapsed / number of malloc/free pairs. Setup and
 * teardown (filling the 10000 live blocks, freeing them at the end) are outside the timed span.
 * Every block gets a value written into it that is read back just before its free; a mismatch is
 * counted and makes the exit code 1.
 *
 * Usage: micro-<alloc> [row] [-scale F]
 *   Runs every row, or only the named one; -scale multiplies the iteration counts (default 1, tuned
 *   so that each row takes roughly 0.1-0.3 s with glibc malloc on a 2-core VM). Prints one line
 *   "row-name ns_per_pair" per row on stdout and nothing else; errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "micro"
#include "allocator.h" /* the allocator under test (one ALLOC_* define) and now_ns() */
#include "options.h"   /* -name value options */

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Helpers ---- */


/* Content-check mismatches of the single-threaded rows (foreign-free adds its consumer's count). */
static long check_failures;

/* xorshift64, reseeded by each table so that a row sees the same numbers whether it runs alone or
 * after the others. */
static uint64_t rng_state;
static void rng_seed(uint64_t seed) { rng_state = seed ? seed : 1; }
static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* A size in [lo, hi], log-uniform: first a doubling range [lo*2^k, lo*2^(k+1)] uniformly, then a size
 * uniformly inside it. Every doubling is about equally likely, so small sizes dominate as they do in
 * real programs (half of the sizes in 16..1024 are below 128; the mean is about 250). */
static size_t random_size(size_t lo, size_t hi)
{
    unsigned doublings = 0;
    while ((lo << doublings) < hi)
        doublings++;
    size_t base = lo << (rng_next() % doublings);
    size_t size = base + rng_next() % (base + 1);
    return size < hi ? size : hi;
}

/* ---- Batch rows: allocate a batch of blocks, write a byte in each, free them all ---- */

#define MIXED_BATCH 100
#define MIXED_TABLE (MIXED_BATCH * 256)   /* sizes cycled through by the mixed rows */
#define SAME_BATCH 1000
#define FILL_BATCH 100000
#define SAME_SIZE 64

static uint16_t mixed_sizes[MIXED_TABLE];
static uint16_t same_sizes[SAME_BATCH];
static uint16_t fill_sizes[FILL_BATCH];
static unsigned char *batch_ptr[FILL_BATCH]; /* a global: the blocks escape, nothing can be folded */

static void batch_tables(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    rng_seed(0x6d697865645f7231u);
    for (size_t i = 0; i < MIXED_TABLE; i++)
        mixed_sizes[i] = (uint16_t)random_size(16, 1024);
    for (size_t i = 0; i < SAME_BATCH; i++)
        same_sizes[i] = SAME_SIZE;
    for (size_t i = 0; i < FILL_BATCH; i++)
        fill_sizes[i] = (uint16_t)random_size(16, 1024);
}

/* Runs batches of `batch` blocks whose sizes are read in turn from sizes[0..table_len) (a multiple of
 * batch), freeing each batch newest first (lifo) or oldest first. Returns ns per pair. */
static double batch_row(long pairs, int batch, const uint16_t *sizes, size_t table_len, bool lifo)
{
    long batches = pairs / batch > 0 ? pairs / batch : 1;
    size_t next = 0;
    long bad = 0; /* a local, so that it can live in a register across the calls */
    uint64_t t0 = now_ns();
    for (long b = 0; b < batches; b++) {
        const uint16_t *sz = sizes + next;
        next = next + (size_t)batch < table_len ? next + (size_t)batch : 0;
        for (int i = 0; i < batch; i++) {
            unsigned char *p = alloc_block(sz[i]);
            p[0] = (unsigned char)(b + i);
            batch_ptr[i] = p;
        }
        if (lifo) {
            for (int i = batch - 1; i >= 0; i--) {
                bad += batch_ptr[i][0] != (unsigned char)(b + i);
                bench_free(batch_ptr[i]);
            }
        } else {
            for (int i = 0; i < batch; i++) {
                bad += batch_ptr[i][0] != (unsigned char)(b + i);
                bench_free(batch_ptr[i]);
            }
        }
    }
    uint64_t t1 = now_ns();
    check_failures += bad;
    return (double)(t1 - t0) / ((double)batches * batch);
}

static double row_mixed_lifo(long pairs)
{
    batch_tables();
    return batch_row(pairs, MIXED_BATCH, mixed_sizes, MIXED_TABLE, true);
}

static double row_mixed_fifo(long pairs)
{
    batch_tables();
    return batch_row(pairs, MIXED_BATCH, mixed_sizes, MIXED_TABLE, false);
}

static double row_lifo_1000(long pairs)
{
    batch_tables();
    return batch_row(pairs, SAME_BATCH, same_sizes, SAME_BATCH, true);
}

static double row_fifo_1000(long pairs)
{
    batch_tables();
    return batch_row(pairs, SAME_BATCH, same_sizes, SAME_BATCH, false);
}

static double row_fill_free(long pairs)
{
    batch_tables();
    return batch_row(pairs, FILL_BATCH, fill_sizes, FILL_BATCH, false);
}

/* ---- fixed-32: malloc(32), touch, free ---- */

static unsigned char *volatile sink;

static double row_fixed_32(long pairs)
{
    long bad = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        unsigned char *p = alloc_block(32);
        p[0] = (unsigned char)i;
        sink = p;   /* the pointer escapes, so the pair cannot be folded away ... */
        p = sink;   /* ... and comes back unknown, so the byte is really read back */
        bad += p[0] != (unsigned char)i;
        bench_free(p);
    }
    uint64_t t1 = now_ns();
    check_failures += bad;
    return (double)(t1 - t0) / (double)pairs;
}

/* ---- random-replace: a pool of live blocks, free a random one and allocate into its slot ---- */

#define LIVE_BLOCKS 10000
#define REPLACE_TABLE 65536               /* power of two: the (slot, size) steps cycled through */
#define REPLACE_MIN 16
#define REPLACE_MAX 2048

static uint16_t fill_size[LIVE_BLOCKS];
static uint16_t step_slot[REPLACE_TABLE];
static uint16_t step_size[REPLACE_TABLE];
static unsigned char *live_ptr[LIVE_BLOCKS];
static unsigned char live_tag[LIVE_BLOCKS];

static double row_random_replace(long pairs)
{
    static bool tables_done;
    if (!tables_done) {
        tables_done = true;
        rng_seed(0x7265706c6163655fu);
        for (size_t i = 0; i < LIVE_BLOCKS; i++)
            fill_size[i] = (uint16_t)random_size(REPLACE_MIN, REPLACE_MAX);
        for (size_t i = 0; i < REPLACE_TABLE; i++) {
            step_slot[i] = (uint16_t)(rng_next() % LIVE_BLOCKS);
            step_size[i] = (uint16_t)random_size(REPLACE_MIN, REPLACE_MAX);
        }
    }
    for (size_t s = 0; s < LIVE_BLOCKS; s++) {  /* untimed fill */
        live_ptr[s] = alloc_block(fill_size[s]);
        live_tag[s] = (unsigned char)s;
        live_ptr[s][0] = live_tag[s];
    }
    long bad = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        size_t k = (size_t)i & (REPLACE_TABLE - 1);
        size_t s = step_slot[k];
        bad += live_ptr[s][0] != live_tag[s];
        bench_free(live_ptr[s]);
        unsigned char *p = alloc_block(step_size[k]);
        p[0] = live_tag[s] = (unsigned char)i;
        live_ptr[s] = p;
    }
    uint64_t t1 = now_ns();
    check_failures += bad;
    for (size_t s = 0; s < LIVE_BLOCKS; s++) {  /* untimed teardown */
        check_failures += live_ptr[s][0] != live_tag[s];
        bench_free(live_ptr[s]);
    }
    return (double)(t1 - t0) / (double)pairs;
}

/* ---- replace-N: one size, a random slot freed and made again ---- */

#define ONE_SIZE_BLOCKS 1024

static uint16_t one_size_step[REPLACE_TABLE];
static uint64_t *one_size_ptr[ONE_SIZE_BLOCKS];
static uint64_t one_size_tag[ONE_SIZE_BLOCKS];

/* Runs `pairs` replacements among ONE_SIZE_BLOCKS blocks of `size` bytes (a multiple of 8, at least 16);
 * returns ns per pair. Each block holds its tag in its first word and the tag's complement in its last,
 * checked before its free. */
static double one_size_row(long pairs, size_t size)
{
    static bool steps_done;
    if (!steps_done) {
        steps_done = true;
        rng_seed(0x6f6e655f73697a65u);
        for (size_t i = 0; i < REPLACE_TABLE; i++)
            one_size_step[i] = (uint16_t)(rng_next() % ONE_SIZE_BLOCKS);
    }
    size_t last = size / 8 - 1;
    for (size_t s = 0; s < ONE_SIZE_BLOCKS; s++) { /* untimed fill */
        uint64_t *p = alloc_block(size);
        p[0] = one_size_tag[s] = s;
        p[last] = ~(uint64_t)s;
        one_size_ptr[s] = p;
    }
    long bad = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        size_t s = one_size_step[(size_t)i & (REPLACE_TABLE - 1)];
        uint64_t *p = one_size_ptr[s];
        bad += p[0] != one_size_tag[s] || p[last] != ~one_size_tag[s];
        bench_free(p);
        p = alloc_block(size);
        p[0] = one_size_tag[s] = (uint64_t)i;
        p[last] = ~(uint64_t)i;
        one_size_ptr[s] = p;
    }
    uint64_t t1 = now_ns();
    for (size_t s = 0; s < ONE_SIZE_BLOCKS; s++) { /* untimed teardown */
        uint64_t *p = one_size_ptr[s];
        bad += p[0] != one_size_tag[s] || p[last] != ~one_size_tag[s];
        bench_free(p);
    }
    check_failures += bad;
    return (double)(t1 - t0) / (double)pairs;
}

static double row_replace_64(long pairs) { return one_size_row(pairs, 64); }
static double row_replace_256(long pairs) { return one_size_row(pairs, 256); }
static double row_replace_1024(long pairs) { return one_size_row(pairs, 1024); }

/* ---- foreign-free: allocate in one thread, free in another ---- */

#define RING_SLOTS 256                    /* power of two */
#define FOREIGN_SIZE 64

/* Single-producer/single-consumer ring. head counts blocks put in (written by the producer only),
 * tail counts blocks taken out (written by the consumer only); each on its own cache line. */
static struct {
    alignas(64) atomic_size_t head;
    alignas(64) atomic_size_t tail;
    alignas(64) uint64_t *slot[RING_SLOTS];
} ring;

struct foreign_job {
    long blocks;
    long failures; /* consumer's content-check mismatches */
};

/* Waiting for the other side: spin briefly, then yield (the VM may have descheduled the peer). */
static void wait_a_little(unsigned *spins)
{
    if (++*spins < 100) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    } else {
        sched_yield();
    }
}

static void *foreign_producer(void *arg)
{
    struct foreign_job *job = arg;
    size_t head = 0, tail_seen = 0; /* tail is re-read only when the ring looks full */
    for (long i = 0; i < job->blocks; i++) {
        uint64_t *p = alloc_block(FOREIGN_SIZE);
        p[0] = (uint64_t)i;
        unsigned spins = 0;
        while (head - tail_seen == RING_SLOTS) {
            tail_seen = atomic_load_explicit(&ring.tail, memory_order_acquire);
            if (head - tail_seen == RING_SLOTS)
                wait_a_little(&spins);
        }
        ring.slot[head & (RING_SLOTS - 1)] = p;
        head++;
        atomic_store_explicit(&ring.head, head, memory_order_release);
    }
    return NULL;
}

static void *foreign_consumer(void *arg)
{
    struct foreign_job *job = arg;
    size_t tail = 0, head_seen = 0; /* head is re-read only when the ring looks empty */
    long bad = 0;
    for (long i = 0; i < job->blocks; i++) {
        unsigned spins = 0;
        while (tail == head_seen) {
            head_seen = atomic_load_explicit(&ring.head, memory_order_acquire);
            if (tail == head_seen)
                wait_a_little(&spins);
        }
        uint64_t *p = ring.slot[tail & (RING_SLOTS - 1)];
        tail++;
        atomic_store_explicit(&ring.tail, tail, memory_order_release);
        bad += p[0] != (uint64_t)i; /* the ring is FIFO: blocks come in order */
        bench_free(p);
    }
    job->failures = bad;
    return NULL;
}

static pthread_t start_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    int err = pthread_create(&t, NULL, fn, arg);
    if (err != 0) {
        fprintf(stderr, "micro: pthread_create: %s\n", strerror(err));
        exit(1);
    }
    return t;
}

/* Wall time from starting both threads to joining both (thread start-up is some tens of
 * microseconds, negligible against the run), divided by the number of blocks. */
static double row_foreign_free(long pairs)
{
    struct foreign_job job = {.blocks = pairs, .failures = 0};
    atomic_store(&ring.head, 0);
    atomic_store(&ring.tail, 0);
    uint64_t t0 = now_ns();
    pthread_t consumer = start_thread(foreign_consumer, &job);
    pthread_t producer = start_thread(foreign_producer, &job);
    pthread_join(producer, NULL);
    pthread_join(consumer, NULL);
    uint64_t t1 = now_ns();
    check_failures += job.failures;
    return (double)(t1 - t0) / (double)pairs;
}

/* ---- Rows and main ---- */

struct row {
    const char *name;
    double (*run)(long pairs); /* returns ns per pair */
    long pairs;                /* malloc/free pairs at scale 1 */
};

static const struct row rows[] = {
    {"fixed-32", row_fixed_32, 10000000},
    {"mixed-lifo", row_mixed_lifo, 6000000},
    {"mixed-fifo", row_mixed_fifo, 6000000},
    {"lifo-1000", row_lifo_1000, 8000000},
    {"fifo-1000", row_fifo_1000, 8000000},
    {"fill-free", row_fill_free, 2000000},
    {"random-replace", row_random_replace, 2000000},
    {"replace-64", row_replace_64, 8000000},
    {"replace-256", row_replace_256, 8000000},
    {"replace-1024", row_replace_1024, 8000000},
    {"foreign-free", row_foreign_free, 1000000},
};
#define ROW_COUNT (sizeof rows / sizeof rows[0])

static void usage(FILE *to)
{
    fprintf(to, "usage: micro [row] [-scale F]\nrows:");
    OPTION_LIST(to, rows);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    double scale = 1.0;
    int status = options_name_scale(argc, argv, &only, &scale, usage);
    if (status >= 0)
        return status;
    const struct row *only_row = OPTION_FIND(rows, only, "row", usage);

    for (size_t r = 0; r < ROW_COUNT; r++) {
        if (only_row != NULL && only_row != &rows[r])
            continue;
        long pairs = (long)((double)rows[r].pairs * scale);
        if (pairs < 1)
            pairs = 1;
        rows[r].run(pairs / 16 > 0 ? pairs / 16 : 1); /* warm-up, untimed */
        double ns = rows[r].run(pairs);
        printf("%s %.2f\n", rows[r].name, ns);
        fflush(stdout);
    }
    if (check_failures != 0) {
        fprintf(stderr, "micro: %ld content check failures\n", check_failures);
        return 1;
    }
    return 0;
}
