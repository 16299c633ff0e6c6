/* bench/shapes.c - the allocation patterns where other allocators lead: one scenario each, a binary per
 * allocator.
 *
 * What it measures: the wall time of a fixed amount of work shaped like a published allocator benchmark
 * (mimalloc-bench's programs, glibc's and rpmalloc's benchmarks), or like a pattern of our own issue, and
 * the memory the process took for it. The programs here are our own, written from what the benchmarks do
 * with the arguments mimalloc-bench's bench.sh gives them (sizes, counts, what is written, who frees
 * what); only the amount of work differs, where a scenario below says no more, and each block's pattern
 * is checked before its free. A scenario's work at -scale 1 is a total, split evenly between its threads,
 * so a run on 8 threads takes about as long as one on 2 on this 2-core machine, and a row compares
 * allocators, not thread counts. Scenarios (one function each, scenario_<name>; the constants at their
 * code size them):
 *
 *   larson        Larson and Krishnan's server simulation as mimalloc-bench runs it (`larson 5 8 1000
 *                 5000 100 4141 N`): each thread holds a window of 5000 blocks of 8-999 bytes (uniform)
 *                 and replaces random slots: free the block there, allocate a new one, write its first
 *                 bytes. After 100 rounds of 5000 replacements a thread starts its successor, hands it
 *                 the window and exits. Before the clock starts the main thread makes every window's
 *                 blocks, shuffles them across the windows and replaces four times as many at random;
 *                 it empties the windows after the clock stops.
 *   larson-sized  the same, each free told the block's size (bench_free_sized in allocator.h: the
 *                 allocator's sized free, or C23's free_sized, or free where there is neither).
 *   xmalloc       Lever and Boreham's xmalloc-test as mimalloc-bench runs it (`-w N -t 5 -s 64`):
 *                 producer threads fill batches of 4096 objects of 64 bytes, each written whole, and push
 *                 them onto one stack under a lock (at most 100 batches wait); consumer threads pop them
 *                 and free every object and the batch. -threads N runs max(1, N/2) producers and as many
 *                 consumers (its -w N/2).
 *   cache-thrash  Hoard's active false sharing test as mimalloc-bench runs it (`cache-thrash N 1000 1
 *                 2000000 N`): each thread allocates a 1-byte object, writes it and reads it back many
 *                 times (the repetitions split between the threads), frees it, 1000 times; an allocator
 *                 that gives two threads objects in one cache line makes every write a cache miss.
 *   cache-scratch Hoard's passive false sharing test: the main thread allocates one small object per
 *                 thread, side by side (8 bytes here, for the pattern; 1 there); each thread frees the
 *                 one it was given, then works as in cache-thrash: an allocator that hands a thread back
 *                 the freed object shares its line.
 *   alloc-test    OLogN's alloc-test as mimalloc-bench runs it: 2^18 slots split between the threads,
 *                 every other one filled at the start; each step picks a slot with a Pareto 80/20 skew
 *                 (a quarter of the steps go to 16 slots of 262144) and frees its block, read whole
 *                 first, or fills it with a block of 5-1024 B (half of them 8 B or less) written whole.
 *   glibc-simple  glibc's bench-malloc-simple as mimalloc-bench runs it (no argument: sizes 16, 32 and
 *                 64 B): tight loops of one size at a time, allocating 25, 100, 400 or 1600 blocks, every
 *                 word written, and freeing them in turn.
 *   glibc-thread  glibc's bench-malloc-thread as mimalloc-bench runs it: each thread replaces random
 *                 slots of a working set of 1024 (empty at first) with blocks of 4 B - 32 KB drawn from
 *                 an inverse-square distribution (half of them 8 B or less, one in a hundred above
 *                 400 B), every byte written; the sizes and slots come round from tables of 8000 and
 *                 4096 draws, the same for every thread, as there.
 *   glibc-thread-fixed  our variant of glibc-thread's loop with one fixed size at a time (16, 64,
 *                 256, 1024 B), written at both ends: 1024 blocks of 1 KB fill 16 pages of shardmm's,
 *                 and nearly every free lands in a full one (bench/results/2026-12-06-lifo-reuse.md).
 *   rptest        rpmalloc's benchmark as mimalloc-bench runs it: each thread holds 1000 slots of blocks
 *                 of 8-16000 B (its "linear" drop-off: median about 1.8 KB), each made by calloc or by
 *                 memalign(8 or 16) and a memset; each loop frees 24-79 slots and fills 30-99, walking
 *                 them with strides of 11 and 7, and every second loop it sends a batch of 30-99 new
 *                 blocks to the next other thread in turn, which frees them at its next loop.
 *   malloc-large  mimalloc-bench's malloc-large: 20 slots of blocks of 5-25 MB (uniform), random slots
 *                 replaced, each new block made and zeroed whole before the slot's old one is freed.
 *   large-ends    the same sizes in 4 slots, each block written only at its two ends (a header and a
 *                 trailer, as a buffer sized for the largest message is): what a large block costs
 *                 beside the pages a program writes, and which of its freed pages a block gets again.
 *   turnover      buffers turned over among smaller blocks: 8 slots per thread, random slots replaced, a
 *                 quarter of the new blocks 1-2 MB and the rest 16 B - 100 KB (uniform), every byte of
 *                 each written (memset) as a buffer is filled: which freed memory a block gets decides
 *                 whether its writes hit the processor's caches.
 *   requests      request buffers: 2 slots per thread, random slots replaced by blocks of 1-2 MB (uniform)
 *                 of which a request uses 1-64 KB (written and checked), as a buffer sized for the largest
 *                 message serves mostly small ones: what a large block costs beyond its pages.
 *   large-heads   the starts of many large blocks used in turn: 16 slots per thread of blocks of 1-2 MB
 *                 (uniform) of which the first 1-16 KB are used (written and checked), as an engine's
 *                 arrays or buffers whose headers it reads and updates; each round reads the first word
 *                 of every block and adds one to its fifth, and every 4096 rounds a random slot is
 *                 replaced. Where every block starts at the same offset of a 4 KB page, their first
 *                 lines share one set of each cache.
 *   ring          a ring of threads: each makes blocks of 16 B - 256 KB (97 % 16 B - 16 KB, 3 % 16-256 KB,
 *                 log-uniform) and hands them to the next through a lock-free ring of 1024; the receiver
 *                 resizes an eighth of them by realloc first, then frees every one. On one thread the ring
 *                 closes on itself.
 *   mixed         one thread churning 8192 slots with every call of the family: malloc, calloc,
 *                 posix_memalign (16 B - 4 KB alignments) and aligned_alloc (32 B - 4 KB), realloc growing
 *                 by half and shrinking by half, frees; sizes 16 B - 4 MB (94.9 % up to 4 KB, 5 % 4-256
 *                 KB, 0.1 % 256 KB - 4 MB, log-uniform within each band).
 *   strings       a runtime building large strings and arrays: a string appended to piece by piece (16-256
 *                 bytes), its buffer grown by realloc to 1.5 times when full, up to 1 KB - 4 MB; an array
 *                 of pointers to 16-128-byte objects grown by doubling, up to 16-65536 elements; the 16
 *                 newest of each kept, the older dropped. Peak RSS counts here.
 * mimalloc-bench's mstress is bench/churn.c. Scenarios that do not hand blocks between threads run
 * independent copies on -threads N, each with its share of the work.
 *
 * How: the same source is compiled once per allocator, chosen by one ALLOC_* define (allocator.h); the
 * system build is also the one a runner preloads other libraries into. The threads meet the main thread
 * at a barrier; the time is from the first thread's start after it to the last thread's end, each read
 * by the thread itself (larson: from the main thread starting the first threads to its joining the last
 * thread of every window, thread starts and exits included). Every thread draws from its own xorshift64*
 * generator, seeded by the scenario and the thread's index, so the work does not depend on the allocator.
 *
 * Checking: every block is filled with a pattern of 64-bit words derived from a per-block cookie and the
 * word's index - its first 4 words, one word per 4 KB page and its last word (so every page is used) -
 * and checked before its free, and after a realloc over the part that was kept; calloc's blocks are
 * checked zero at those words first, aligned blocks for their alignment; strings are checked a byte per
 * 4 KB and at both ends; cache-thrash's objects for the sum of their writes. Each block that fails counts
 * one error; any error makes the exit status 1. (Debian 12's mimalloc 2.0.9 fails mixed: its
 * mi_aligned_alloc and mi_posix_memalign return blocks misaligned for 256-1024-byte alignments when the
 * size is a multiple of the alignment, about a third of them; mimalloc 2.4.1 preloaded does not.)
 *
 * Usage: shapes-<alloc> <scenario> [-threads N] [-scale F]   (N: the scenario's default, up to 1024)
 *        shapes-<alloc> -list                                  (the scenario names, one a line)
 *   -scale multiplies the scenario's work. At scale 1 each scenario takes 0.2-1.5 s on its default
 *   threads with glibc's malloc on the 2-core VM this was written on.
 *   Prints one line on stdout, "shapes <scenario> ms peak_rss_mb minor_faults errors": wall ms of the
 *   work, peak RSS of the program in MB (VmHWM of /proc/self/status: getrusage's ru_maxrss would also
 *   count the process before its exec, a runner's Python of 16 MB), minor page faults of the whole
 *   process (getrusage ru_minflt) and the number of blocks that failed a check. Errors go to stderr:
 *   bad arguments with exit status 2, failed checks and failed allocations 1.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "shapes"
#include "allocator.h" /* the allocator under test (one ALLOC_* define) and now_ns() */
#include "options.h"   /* -name value options */
#include "rng.h"       /* mix64, rng_next */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- Parameters ---- */

#define MAX_THREADS 1024
#define HEAD_WORDS 4               /* words of pattern at a block's start */
#define PAGE_WORDS (4096 / 8)      /* one word of pattern per 4 KB page */
#define CACHE_LINE 64
#define SEED 0x7368617065733031u   /* "shapes01": the base of every thread's seed */

/* ---- Helpers ---- */

__attribute__((noreturn, cold)) static void fail(const char *what, int err)
{
    fprintf(stderr, "shapes: %s: %s\n", what, strerror(err));
    exit(1);
}

/* A number in [0, n), n below 2^32 (the high half of the draw, multiplied: no division). */
static inline size_t rng_below(uint64_t *state, size_t n)
{
    return (size_t)(((rng_next(state) >> 32) * (uint64_t)n) >> 32);
}

static inline size_t rng_between(uint64_t *state, size_t lo, size_t hi) /* [lo, hi] */
{
    return lo + rng_below(state, hi - lo + 1);
}

/* A size mix: bands, each a share of the blocks and a range [2^lo, 2^hi) drawn log-uniformly (an
 * exponent e uniform in [lo, hi), then a size uniform in [2^e, 2^(e+1))), as bench/churn.c draws. */
struct band {
    unsigned per_1000;             /* share of the blocks; a mix's shares add up to 1000 */
    unsigned lo, hi;
};

static inline size_t draw_size(const struct band *b, uint64_t *rng)
{
    uint64_t x = rng_next(rng);
    unsigned pick = (unsigned)((x >> 40) % 1000);
    while (pick >= b->per_1000) {
        pick -= b->per_1000;
        b++;
    }
    unsigned e = b->lo + (unsigned)((x >> 32 & 0xff) % (b->hi - b->lo));
    size_t base = (size_t)1 << e;
    return base + (size_t)((x & 0xffffffffu) % base);
}

/* ---- Blocks and their pattern ---- */

struct block {
    uint64_t *p;                   /* NULL: empty */
    uint32_t size;                 /* bytes asked for, at least 8 */
    uint32_t cookie;
};

static inline uint64_t pattern(uint32_t cookie, size_t word)
{
    return ((uint64_t)cookie << 32 | (uint32_t)word) * 0x9e3779b97f4a7c15u;
}

/* The words of a block's pattern: 0 .. HEAD_WORDS-1, every PAGE_WORDS-th, and the last. */
static inline void fill(uint64_t *w, size_t size, uint32_t cookie)
{
    size_t n = size / 8;
    for (size_t i = 0; i < HEAD_WORDS && i < n; i++)
        w[i] = pattern(cookie, i);
    for (size_t i = PAGE_WORDS; i < n; i += PAGE_WORDS)
        w[i] = pattern(cookie, i);
    w[n - 1] = pattern(cookie, n - 1);
}

/* 1 when a word of the pattern among the first `kept` bytes of a block of `size` bytes is wrong. */
static inline int check_kept(const uint64_t *w, size_t size, size_t kept, uint32_t cookie)
{
    size_t n = size / 8, k = (kept < size ? kept : size) / 8;
    uint64_t bad = 0;
    for (size_t i = 0; i < HEAD_WORDS && i < k; i++)
        bad |= w[i] ^ pattern(cookie, i);
    for (size_t i = PAGE_WORDS; i < k; i += PAGE_WORDS)
        bad |= w[i] ^ pattern(cookie, i);
    if (n - 1 < k)
        bad |= w[n - 1] ^ pattern(cookie, n - 1);
    return bad != 0;
}

static inline int check(const uint64_t *w, size_t size, uint32_t cookie)
{
    return check_kept(w, size, size, cookie);
}

/* 1 when a word calloc must have zeroed, at the pattern's places, is not zero. */
static inline int check_zero(const uint64_t *w, size_t size)
{
    size_t n = size / 8;
    uint64_t bad = 0;
    for (size_t i = 0; i < HEAD_WORDS && i < n; i++)
        bad |= w[i];
    for (size_t i = PAGE_WORDS; i < n; i += PAGE_WORDS)
        bad |= w[i];
    return (bad | w[n - 1]) != 0;
}

/* A new block of `size` bytes (at least 8) in b, filled. */
static inline void make(struct block *b, size_t size, uint64_t *rng)
{
    b->p = alloc_block(size);
    b->size = (uint32_t)size;
    b->cookie = (uint32_t)rng_next(rng);
    fill(b->p, size, b->cookie);
}

/* Checks and frees b's block (there is one); returns 1 when its check failed. */
static inline int release(struct block *b)
{
    int bad = check(b->p, b->size, b->cookie);
    bench_free(b->p);
    b->p = NULL;
    return bad;
}

/* release() of every slot that holds a block; returns how many failed their check. */
static long release_slots(struct block *slots, size_t n)
{
    long bad = 0;
    for (size_t k = 0; k < n; k++)
        if (slots[k].p != NULL)
            bad += release(&slots[k]);
    return bad;
}

/* Resizes b's block by realloc, checks the part kept and fills the rest; returns 1 when the check failed. */
static inline int resize(struct block *b, size_t size)
{
    uint64_t *p = bench_realloc(b->p, size);
    if (__builtin_expect(p == NULL, 0))
        out_of_memory(size);
    int bad = check_kept(p, b->size, size, b->cookie);
    b->p = p;
    b->size = (uint32_t)size;
    fill(p, size, b->cookie);
    return bad;
}

/* ---- Threads ---- */

/* One thread of a scenario; its own cache lines, so that the harness shares none between threads. */
struct worker {
    pthread_t id;
    int index;
    long share;                    /* its part of the scenario's work (steps, blocks, rounds) */
    uint64_t rng;
    long errors;
    struct queue *in, *out;        /* the rings it receives from and sends to, where the scenario has them */
    struct block given;            /* cache-scratch: the object the main thread gave it */
    uint64_t started, finished;    /* now_ns() after the start barrier and after its work */
} __attribute__((aligned(2 * CACHE_LINE)));

static long threads;               /* -threads */
static struct worker *workers;     /* `threads` of them, made by main */
static pthread_barrier_t start_line;

static void barrier_wait(pthread_barrier_t *b)
{
    int e = pthread_barrier_wait(b);
    if (e != 0 && e != PTHREAD_BARRIER_SERIAL_THREAD)
        fail("pthread_barrier_wait", e);
}

static void (*thread_work)(struct worker *);

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    barrier_wait(&start_line);
    w->started = now_ns();
    thread_work(w);
    w->finished = now_ns();
    return NULL;
}

/* Each worker's share of `total` steps at `scale`: an equal part, at least one. */
static void share_out(long total, double scale)
{
    double share = (double)total * scale / (double)threads;
    for (long i = 0; i < threads; i++)
        workers[i].share = share < 1 ? 1 : (long)share;
}

/* Runs work on every worker, each on a thread of its own; returns the ms from the first thread's start
 * to the last one's end. Each thread reads the clock itself: with more threads than cores, the main
 * thread may not run again, to read it, before some worker has finished. */
static double run_team(void (*work)(struct worker *))
{
    thread_work = work;
    int e = pthread_barrier_init(&start_line, NULL, (unsigned)threads + 1);
    if (e != 0)
        fail("pthread_barrier_init", e);
    for (long i = 0; i < threads; i++)
        if ((e = pthread_create(&workers[i].id, NULL, worker_main, &workers[i])) != 0)
            fail("pthread_create", e);
    barrier_wait(&start_line);
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (long i = 0; i < threads; i++) {
        if ((e = pthread_join(workers[i].id, NULL)) != 0)
            fail("pthread_join", e);
        t0 = workers[i].started < t0 ? workers[i].started : t0;
        t1 = workers[i].finished > t1 ? workers[i].finished : t1;
    }
    pthread_barrier_destroy(&start_line);
    return (double)(t1 - t0) / 1e6;
}

/* ---- Rings between threads ----
 * A bounded lock-free ring of blocks with one sender and one receiver. Each side keeps its position and
 * what it last saw of the other's, and publishes its own every RING_BATCH blocks (and when it would wait),
 * so the two share a cache line once per batch rather than per block. */

#define RING_BATCH 32

struct queue {
    _Alignas(CACHE_LINE) _Atomic size_t tail;  /* blocks sent so far (published) */
    _Alignas(CACHE_LINE) _Atomic size_t head;  /* blocks received so far (published) */
    _Atomic int done;                          /* the sender has sent its last block */
    _Alignas(CACHE_LINE) size_t sent, head_seen;         /* the sender's */
    _Alignas(CACHE_LINE) size_t received, tail_seen;     /* the receiver's */
    _Alignas(CACHE_LINE) struct block *slots;
    size_t mask;
};

static struct queue *queues_make(long count, size_t slots)
{
    struct queue *q = aligned_alloc(CACHE_LINE, (size_t)count * sizeof *q);
    if (q == NULL)
        out_of_memory((size_t)count * sizeof *q);
    memset(q, 0, (size_t)count * sizeof *q);
    for (long i = 0; i < count; i++) {
        q[i].slots = calloc(slots, sizeof *q[i].slots);
        if (q[i].slots == NULL)
            out_of_memory(slots * sizeof *q[i].slots);
        q[i].mask = slots - 1;
    }
    return q;
}

static void queues_free(struct queue *q, long count)
{
    for (long i = 0; i < count; i++)
        free(q[i].slots);
    free(q);
}

static inline void ring_publish(struct queue *q)
{
    atomic_store_explicit(&q->tail, q->sent, memory_order_release);
}

/* Puts b in the ring; false when it is full (b stays the caller's). */
static inline bool ring_send(struct queue *q, struct block b)
{
    if (q->sent - q->head_seen > q->mask) {
        q->head_seen = atomic_load_explicit(&q->head, memory_order_acquire);
        if (q->sent - q->head_seen > q->mask) {
            ring_publish(q);
            return false;
        }
    }
    q->slots[q->sent & q->mask] = b;
    if (++q->sent % RING_BATCH == 0)
        ring_publish(q);
    return true;
}

/* The sender's last block is in: publish, and say so. */
static void ring_close(struct queue *q)
{
    ring_publish(q);
    atomic_store_explicit(&q->done, 1, memory_order_release);
}

/* Takes the next block into *b; false when there is none published. */
static inline bool ring_receive(struct queue *q, struct block *b)
{
    if (q->received == q->tail_seen) {
        atomic_store_explicit(&q->head, q->received, memory_order_release);
        q->tail_seen = atomic_load_explicit(&q->tail, memory_order_acquire);
        if (q->received == q->tail_seen)
            return false;
    }
    *b = q->slots[q->received & q->mask];
    if (++q->received % RING_BATCH == 0)
        atomic_store_explicit(&q->head, q->received, memory_order_release);
    return true;
}

/* Sends b, receiving (with `take`) what arrives for w meanwhile when the ring is full. */
static void send_waiting(struct worker *w, struct block b, long (*take)(struct worker *))
{
    while (!ring_send(w->out, b))
        if (take(w) == 0)
            sched_yield();
}

/* After w's last send: receives (with `take`) until the sender to w has closed its ring and it is empty. */
static void drain_to_end(struct worker *w, long (*take)(struct worker *))
{
    ring_close(w->out);
    for (;;) {
        int closed = atomic_load_explicit(&w->in->done, memory_order_acquire);
        if (take(w) == 0) {
            if (closed)
                return;
            sched_yield();
        }
    }
}

/* Sets each worker's rings: thread i sends to thread i+1, the last to the first. */
static struct queue *ring_of_threads(size_t slots)
{
    struct queue *q = queues_make(threads, slots);
    for (long i = 0; i < threads; i++) {
        workers[i].out = &q[i];
        workers[i].in = &q[(i + threads - 1) % threads];
    }
    return q;
}

/* A team on a ring of queues of `slots` each, `total` steps shared out at `scale`: ms, as run_team. */
static double run_ring(size_t slots, long total, double scale, void (*work)(struct worker *))
{
    struct queue *q = ring_of_threads(slots);
    share_out(total, scale);
    double ms = run_team(work);
    queues_free(q, threads);
    return ms;
}

/* ---- larson ---- */

#define LARSON_STEPS 4000000L      /* replacements in all, at scale 1 */
#define LARSON_WINDOW 5000         /* blocks a thread holds */
#define LARSON_HANDOVER (100L * LARSON_WINDOW) /* replacements before a thread hands its window on */
#define LARSON_MIN 8
#define LARSON_MAX 1000            /* exclusive, as its min + r % (max - min) */

/* A window and the chain of threads that work on it, one after the other. */
struct lineage {
    struct block *window;
    long generation, generations, steps;   /* steps: replacements per generation */
    uint64_t seed;
    long errors;
    bool sized;                             /* larson-sized: free with the size */
    pthread_t previous;                     /* the thread that started this one, to join */
    pthread_t last;                         /* the last generation's thread, for main to join */
} __attribute__((aligned(2 * CACHE_LINE)));

static pthread_mutex_t larson_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t larson_finished = PTHREAD_COND_INITIALIZER;
static long larson_done;

/* Larson writes two bytes of each new block (and reads one back): here its first word, the pattern's. */
static inline void larson_make(struct block *b, size_t size, uint64_t *rng)
{
    b->p = alloc_block(size);
    b->size = (uint32_t)size;
    b->cookie = (uint32_t)rng_next(rng);
    b->p[0] = pattern(b->cookie, 0);
}

static inline int larson_release(struct block *b, bool sized)
{
    int bad = b->p[0] != pattern(b->cookie, 0);
    if (sized)
        bench_free_sized(b->p, b->size);
    else
        bench_free(b->p);
    b->p = NULL;
    return bad;
}

static void *larson_thread(void *arg)
{
    struct lineage *l = arg;
    int e;
    if (l->generation > 0 && (e = pthread_join(l->previous, NULL)) != 0)
        fail("pthread_join", e);
    uint64_t rng = mix64(l->seed ^ (uint64_t)l->generation) | 1;
    long errors = 0;
    for (long i = 0; i < l->steps; i++) {
        struct block *b = &l->window[rng_below(&rng, LARSON_WINDOW)];
        errors += larson_release(b, l->sized);
        larson_make(b, rng_between(&rng, LARSON_MIN, LARSON_MAX - 1), &rng);
    }
    l->errors += errors;
    if (++l->generation < l->generations) {
        pthread_t next;
        l->previous = pthread_self();
        if ((e = pthread_create(&next, NULL, larson_thread, l)) != 0)
            fail("pthread_create", e);
        return NULL;
    }
    l->last = pthread_self();
    pthread_mutex_lock(&larson_lock);
    larson_done++;
    pthread_cond_signal(&larson_finished);
    pthread_mutex_unlock(&larson_lock);
    return NULL;
}

static double larson_run(double scale, long *errors, bool sized)
{
    double total = (double)LARSON_STEPS * scale / (double)threads;
    long per_thread = total < 1 ? 1 : (long)total;
    long generations = (per_thread + LARSON_HANDOVER - 1) / LARSON_HANDOVER;
    struct lineage *lines = aligned_alloc(2 * CACHE_LINE, (size_t)threads * sizeof *lines);
    if (lines == NULL)
        out_of_memory((size_t)threads * sizeof *lines);
    uint64_t rng = mix64(SEED ^ (sized ? 2 : 1)) | 1;
    /* Untimed, larson's warm-up: the main thread makes every window's blocks, shuffles them across the
     * windows and replaces four times as many as there are, at random. */
    size_t all = (size_t)threads * LARSON_WINDOW;
    struct block *blocks = calloc(all, sizeof *blocks);
    if (blocks == NULL)
        out_of_memory(all * sizeof *blocks);
    for (size_t k = 0; k < all; k++)
        larson_make(&blocks[k], rng_between(&rng, LARSON_MIN, LARSON_MAX - 1), &rng);
    for (size_t k = all; k > 1; k--) {
        size_t j = rng_below(&rng, k);
        struct block t = blocks[j];
        blocks[j] = blocks[k - 1];
        blocks[k - 1] = t;
    }
    for (size_t k = 0; k < 4 * all; k++) {
        struct block *b = &blocks[rng_below(&rng, all)];
        *errors += larson_release(b, sized);
        larson_make(b, rng_between(&rng, LARSON_MIN, LARSON_MAX - 1), &rng);
    }
    for (long i = 0; i < threads; i++) {
        struct lineage *l = &lines[i];
        *l = (struct lineage){.generations = generations, .steps = per_thread / generations,
                              .seed = mix64(SEED ^ (uint64_t)i << 32), .sized = sized,
                              .window = &blocks[(size_t)i * LARSON_WINDOW]};
    }
    larson_done = 0;
    uint64_t t0 = now_ns();
    for (long i = 0; i < threads; i++) {
        pthread_t first;
        int e = pthread_create(&first, NULL, larson_thread, &lines[i]);
        if (e != 0)
            fail("pthread_create", e);
    }
    pthread_mutex_lock(&larson_lock);
    while (larson_done < threads)
        pthread_cond_wait(&larson_finished, &larson_lock);
    pthread_mutex_unlock(&larson_lock);
    for (long i = 0; i < threads; i++) {
        int e = pthread_join(lines[i].last, NULL);
        if (e != 0)
            fail("pthread_join", e);
    }
    uint64_t t1 = now_ns();
    for (long i = 0; i < threads; i++) /* untimed: the main thread empties the windows */
        *errors += lines[i].errors;
    for (size_t k = 0; k < all; k++)
        *errors += larson_release(&blocks[k], sized);
    free(blocks);
    free(lines);
    return (double)(t1 - t0) / 1e6;
}

static double scenario_larson(double scale, long *errors) { return larson_run(scale, errors, false); }
static double scenario_larson_sized(double scale, long *errors) { return larson_run(scale, errors, true); }

/* ---- xmalloc ---- */

/* xmalloc-test as mimalloc-bench runs it (`-w N -t 5 -s 64`): producers fill batches of 4096 objects of 64
 * bytes, each written whole, and push them onto one stack that every consumer pops from, under a lock;
 * at most 100 batches wait. A consumer frees a batch's objects and the batch. */
#define XMALLOC_BLOCKS 6000000L    /* objects in all, at scale 1 */
#define XMALLOC_BATCH 4096
#define XMALLOC_SIZE 64
#define XMALLOC_WAITING 100

struct xmalloc_batch {
    struct xmalloc_batch *next;
    uint8_t *objects[XMALLOC_BATCH];
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t empty, full;
    struct xmalloc_batch *top;
    long waiting, producing;       /* batches on the stack; producers not done yet */
} xm = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0};

static void xmalloc_push(struct xmalloc_batch *b)
{
    pthread_mutex_lock(&xm.lock);
    while (xm.waiting >= XMALLOC_WAITING)
        pthread_cond_wait(&xm.full, &xm.lock);
    b->next = xm.top;
    xm.top = b;
    xm.waiting++;
    pthread_cond_signal(&xm.empty);
    pthread_mutex_unlock(&xm.lock);
}

/* The next batch, or NULL once every producer is done and none waits. */
static struct xmalloc_batch *xmalloc_pop(void)
{
    pthread_mutex_lock(&xm.lock);
    while (xm.top == NULL && xm.producing > 0)
        pthread_cond_wait(&xm.empty, &xm.lock);
    struct xmalloc_batch *b = xm.top;
    if (b != NULL) {
        xm.top = b->next;
        xm.waiting--;
        pthread_cond_signal(&xm.full);
    }
    pthread_mutex_unlock(&xm.lock);
    return b;
}

static void xmalloc_thread(struct worker *w)
{
    if (w->index % 2 == 0) { /* a producer */
        for (long n = 0; n < w->share; n++) {
            struct xmalloc_batch *b = alloc_block(sizeof *b);
            for (int i = 0; i < XMALLOC_BATCH; i++) {
                b->objects[i] = alloc_block(XMALLOC_SIZE);
                memset(b->objects[i], i % 256, XMALLOC_SIZE);
            }
            xmalloc_push(b);
        }
        pthread_mutex_lock(&xm.lock);
        if (--xm.producing == 0)
            pthread_cond_broadcast(&xm.empty);
        pthread_mutex_unlock(&xm.lock);
        return;
    }
    struct xmalloc_batch *b;
    while ((b = xmalloc_pop()) != NULL) { /* a consumer */
        for (int i = 0; i < XMALLOC_BATCH; i++) {
            uint8_t *o = b->objects[i];
            w->errors += o[0] != i % 256 || o[XMALLOC_SIZE - 1] != i % 256;
            bench_free(o);
        }
        bench_free(b);
    }
}

static double scenario_xmalloc(double scale, long *errors)
{
    (void)errors;
    long pairs = threads / 2 > 1 ? threads / 2 : 1;
    threads = 2 * pairs;
    double batches = (double)XMALLOC_BLOCKS * scale / XMALLOC_BATCH / (double)pairs;
    for (long i = 0; i < threads; i++)
        workers[i].share = batches < 1 ? 1 : (long)batches;
    xm.top = NULL;
    xm.waiting = 0;
    xm.producing = pairs;
    return run_team(xmalloc_thread);
}

/* ---- cache-thrash and cache-scratch ---- */

#define CACHE_ITERATIONS 1000      /* objects each thread makes, writes and frees, one at a time */
#define CACHE_REPETITIONS 800000L  /* writes to each object, in all (split between the threads), at
                                    * scale 1: mimalloc-bench's runs 2000000 */
#define CACHE_OBJECT_SIZE 1

/* Makes, writes (w->share times, a write and a read back each) and frees its CACHE_ITERATIONS objects
 * of one byte, as Hoard's tests do with objects of the size given; returns the errors. */
static long cache_objects(struct worker *w)
{
    long errors = 0;
    for (long i = 0; i < CACHE_ITERATIONS; i++) {
        volatile uint8_t *p = alloc_block(CACHE_OBJECT_SIZE);
        uint8_t seen = 0;
        long writes = w->share; /* a local: a byte store through p could alias w->share */
        for (long k = 0; k < writes; k++) {
            *p = (uint8_t)k;
            seen = *p;
        }
        errors += seen != (uint8_t)(writes - 1);
        bench_free((void *)p);
    }
    return errors;
}

static void thrash_thread(struct worker *w) { w->errors += cache_objects(w); }

static void scratch_thread(struct worker *w)
{
    w->errors += release(&w->given);
    w->errors += cache_objects(w);
}

static double scenario_cache_thrash(double scale, long *errors)
{
    (void)errors;
    share_out(CACHE_REPETITIONS, scale);
    return run_team(thrash_thread);
}

static double scenario_cache_scratch(double scale, long *errors)
{
    (void)errors;
    share_out(CACHE_REPETITIONS, scale);
    uint64_t rng = mix64(SEED ^ 3) | 1;
    for (long i = 0; i < threads; i++) /* untimed: the main thread's objects, one after the other */
        make(&workers[i].given, 8, &rng);
    return run_team(scratch_thread);
}

/* ---- alloc-test ---- */

/* OLogN's alloc-test as mimalloc-bench builds it (BENCH: 2^18 slots split between the threads, sizes up
 * to 2^10, every byte written when made and read before the free). */
#define ALLOC_TEST_STEPS 6000000L  /* operations in all, at scale 1 (alloc-test: 100 million a thread) */
#define ALLOC_TEST_ITEMS (1L << 18) /* slots in all */
#define ALLOC_TEST_LEVELS 7         /* its Pareto 80/20 over 6 halvings */

/* Its size: a class k in [2, 9] from the trailing zeros of 7 random bits plus one (k = 2 half the time,
 * each next class half as often, 9 as often as 8), then a size uniform in (2^k, 2^(k+1)]: 5-8 B half
 * the time, 513-1024 B once in 128. */
static inline size_t alloc_test_size(uint64_t r)
{
    unsigned k = (unsigned)__builtin_ctz((unsigned)(r & 127) + 1) + 2;
    r >>= 7;
    return (size_t)(r & ((1u << k) - 1)) + 1 + ((size_t)1 << k);
}

/* Its slot choice: level i (0-6) with chance C(6, i) 0.8^(6-i) 0.2^i, and the slots of level i, a share
 * of them as level 6 - i has of the chance: a quarter of the steps go to 16 of 262144 slots. */
struct alloc_test_levels {
    uint32_t below[ALLOC_TEST_LEVELS - 1]; /* a 32-bit draw below below[i] picks level i (or lower) */
    uint32_t first[ALLOC_TEST_LEVELS + 1]; /* level i's slots: [first[i], first[i + 1]) */
};

static void alloc_test_levels_make(struct alloc_test_levels *l, uint32_t items)
{
    double p[ALLOC_TEST_LEVELS];
    for (int i = 0; i < ALLOC_TEST_LEVELS; i++) {
        double c = 1;
        for (int k = 0; k < i; k++)
            c = c * (6 - k) / (k + 1);
        p[i] = c;
        for (int k = 0; k < 6 - i; k++)
            p[i] *= 0.8;
        for (int k = 0; k < i; k++)
            p[i] *= 0.2;
    }
    double below = 0;
    for (int i = 0; i < ALLOC_TEST_LEVELS - 1; i++) {
        below += p[i];
        l->below[i] = (uint32_t)(UINT32_MAX * below);
    }
    l->first[0] = 0;
    for (int i = 0; i < ALLOC_TEST_LEVELS - 1; i++)
        l->first[i + 1] = l->first[i] + (uint32_t)(items * p[ALLOC_TEST_LEVELS - 1 - i]);
    l->first[ALLOC_TEST_LEVELS] = items;
}

static inline size_t alloc_test_slot(const struct alloc_test_levels *l, uint64_t r)
{
    uint32_t pick = (uint32_t)r, at = (uint32_t)(r >> 32);
    int i = 0;
    while (i < ALLOC_TEST_LEVELS - 1 && pick >= l->below[i])
        i++;
    uint32_t n = l->first[i + 1] - l->first[i];
    return l->first[i] + (n != 0 ? at % n : 0);
}

struct alloc_test_item {
    uint8_t *p;
    uint32_t size;
};

/* A block filled with its size's low byte, as alloc-test's memset; read back whole before its free. */
static uint8_t *alloc_test_make(size_t size)
{
    uint8_t *p = alloc_block(size);
    memset(p, (uint8_t)size, size);
    return p;
}

static int alloc_test_release(struct alloc_test_item *it)
{
    uint64_t fill = 0x0101010101010101u * (uint8_t)it->size, bad = 0;
    size_t words = it->size / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t v;
        memcpy(&v, it->p + i * 8, 8);
        bad |= v ^ fill;
    }
    for (size_t i = words * 8; i < it->size; i++)
        bad |= it->p[i] ^ (uint8_t)it->size;
    bench_free(it->p);
    it->p = NULL;
    return bad != 0;
}

static void alloc_test_thread(struct worker *w)
{
    uint32_t items = (uint32_t)(ALLOC_TEST_ITEMS / threads);
    struct alloc_test_item *slots = calloc(items, sizeof *slots);
    if (slots == NULL)
        out_of_memory(items * sizeof *slots);
    struct alloc_test_levels levels;
    alloc_test_levels_make(&levels, items);
    long errors = 0;
    for (uint32_t i = 0; i < items; i++) /* its setup: every other slot filled, at random */
        if (rng_next(&w->rng) & 1) {
            size_t size = alloc_test_size(rng_next(&w->rng));
            slots[i] = (struct alloc_test_item){alloc_test_make(size), (uint32_t)size};
        }
    for (long k = 0; k < w->share; k++) {
        struct alloc_test_item *it = &slots[alloc_test_slot(&levels, rng_next(&w->rng))];
        if (it->p != NULL) {
            errors += alloc_test_release(it);
        } else {
            size_t size = alloc_test_size(rng_next(&w->rng));
            *it = (struct alloc_test_item){alloc_test_make(size), (uint32_t)size};
        }
    }
    for (uint32_t i = 0; i < items; i++)
        if (slots[i].p != NULL)
            errors += alloc_test_release(&slots[i]);
    free(slots);
    w->errors += errors;
}

static double scenario_alloc_test(double scale, long *errors)
{
    (void)errors;
    share_out(ALLOC_TEST_STEPS, scale);
    return run_team(alloc_test_thread);
}

/* ---- glibc-simple and glibc-thread ---- */

#define GLIBC_SIMPLE_BLOCKS 12000000L  /* blocks in all, at scale 1 */
#define GLIBC_THREAD_STEPS 8000000L    /* glibc-thread's replacements in all, at scale 1 */
#define GLIBC_FIXED_BLOCKS 40000000L   /* glibc-thread-fixed's replacements in all, at scale 1 */
#define GLIBC_WORKING_SET 1024         /* slots per thread of both glibc-thread loops */
static const size_t glibc_simple_sizes[] = {16, 32, 64};
static const size_t glibc_fixed_sizes[] = {16, 64, 256, 1024};
static const size_t glibc_counts[] = {25, 100, 400, 1600};
#define GLIBC_COUNTS (sizeof glibc_counts / sizeof glibc_counts[0])

/* glibc-simple writes every word of a block (bench-malloc-simple writes every int) and checks its first
 * and last. */
static inline uint64_t *glibc_fill(size_t size, uint64_t tag)
{
    uint64_t *p = alloc_block(size);
    for (size_t i = 0; i < size / 8; i++)
        p[i] = tag + i;
    return p;
}

/* glibc-thread-fixed writes and checks two words of a block: its first and its last. */
static inline uint64_t *glibc_make(size_t size, uint64_t tag)
{
    uint64_t *p = alloc_block(size);
    p[0] = tag;
    p[size / 8 - 1] = ~tag;
    return p;
}

static inline int glibc_free(uint64_t *p, size_t size, uint64_t tag, uint64_t last)
{
    int bad = p[0] != tag || p[size / 8 - 1] != last;
    bench_free(p);
    return bad;
}

static void glibc_simple_thread(struct worker *w)
{
    uint64_t *blocks[1600];
    long errors = 0;
    size_t sizes = sizeof glibc_simple_sizes / sizeof glibc_simple_sizes[0];
    long per_phase = w->share / (long)(sizes * GLIBC_COUNTS);
    for (size_t s = 0; s < sizes; s++)
        for (size_t c = 0; c < GLIBC_COUNTS; c++) {
            size_t size = glibc_simple_sizes[s], count = glibc_counts[c];
            long reps = per_phase / (long)count > 0 ? per_phase / (long)count : 1;
            uint64_t tag = rng_next(&w->rng);
            for (long r = 0; r < reps; r++) {
                for (size_t i = 0; i < count; i++)
                    blocks[i] = glibc_fill(size, tag + (i << 8));
                for (size_t i = 0; i < count; i++)
                    errors += glibc_free(blocks[i], size, tag + (i << 8), tag + (i << 8) + size / 8 - 1);
            }
        }
    w->errors += errors;
}

/* glibc-thread's tables, made once before the threads start: NUM_BLOCK_SIZES sizes and NUM_OFFSETS slots
 * of bench-malloc-thread, drawn from SEED (it draws them from rand()). A size is the inverse-square
 * distribution's over [4, 32768]: the inverse of a uniform draw between 1/4 and 1/32768. */
#define GLIBC_SIZE_DRAWS 8000
#define GLIBC_SLOT_DRAWS (4 * GLIBC_WORKING_SET)
static uint32_t glibc_sizes_drawn[GLIBC_SIZE_DRAWS];
static uint16_t glibc_slots_drawn[GLIBC_SLOT_DRAWS];

static void glibc_thread_draw(void)
{
    uint64_t rng = SEED ^ 0x676c69626374u;
    const double lo = 1.0 / 32768, hi = 1.0 / 4;
    for (size_t i = 0; i < GLIBC_SIZE_DRAWS; i++) {
        double r = (double)(rng_next(&rng) >> 11) / (double)(1ull << 53); /* [0, 1) */
        size_t size = (size_t)(1.0 / (hi - (hi - lo) * r));
        glibc_sizes_drawn[i] = (uint32_t)(size < 4 ? 4 : size > 32768 ? 32768 : size);
    }
    for (size_t i = 0; i < GLIBC_SLOT_DRAWS; i++)
        glibc_slots_drawn[i] = (uint16_t)rng_below(&rng, GLIBC_WORKING_SET);
}

/* The byte at offset i of a glibc-thread block tagged t (it writes (char)i). */
static inline uint8_t glibc_byte(uint32_t t, size_t i) { return (uint8_t)(t + i); }

static int glibc_thread_check(const uint8_t *p, uint32_t size, uint32_t t)
{
    return p[0] != glibc_byte(t, 0) || p[size / 2] != glibc_byte(t, size / 2) ||
           p[size - 1] != glibc_byte(t, size - 1);
}

static void glibc_thread_thread(struct worker *w)
{
    uint8_t *blocks[GLIBC_WORKING_SET] = {0};
    uint32_t sizes[GLIBC_WORKING_SET], tags[GLIBC_WORKING_SET];
    long errors = 0;
    size_t next_size = 0, next_slot = 0;
    for (long r = 0; r < w->share; r++) {
        size_t i = glibc_slots_drawn[next_slot];
        next_slot = next_slot + 1 < GLIBC_SLOT_DRAWS ? next_slot + 1 : 0;
        uint32_t size = glibc_sizes_drawn[next_size];
        next_size = next_size + 1 < GLIBC_SIZE_DRAWS ? next_size + 1 : 0;
        if (blocks[i] != NULL) {
            errors += glibc_thread_check(blocks[i], sizes[i], tags[i]);
            bench_free(blocks[i]);
        }
        uint8_t *p = alloc_block(size);
        uint32_t t = (uint32_t)r;
        for (size_t b = 0; b < size; b++)
            p[b] = glibc_byte(t, b);
        blocks[i] = p;
        sizes[i] = size;
        tags[i] = t;
    }
    for (size_t i = 0; i < GLIBC_WORKING_SET; i++)
        if (blocks[i] != NULL) {
            errors += glibc_thread_check(blocks[i], sizes[i], tags[i]);
            bench_free(blocks[i]);
        }
    w->errors += errors;
}

static void glibc_fixed_thread(struct worker *w)
{
    uint64_t *blocks[GLIBC_WORKING_SET];
    long errors = 0;
    size_t sizes = sizeof glibc_fixed_sizes / sizeof glibc_fixed_sizes[0];
    long per_size = w->share / (long)sizes;
    for (size_t s = 0; s < sizes; s++) {
        size_t size = glibc_fixed_sizes[s];
        uint64_t tags[GLIBC_WORKING_SET];
        for (size_t i = 0; i < GLIBC_WORKING_SET; i++)
            blocks[i] = glibc_make(size, tags[i] = rng_next(&w->rng));
        for (long r = 0; r < per_size; r++) {
            size_t i = rng_below(&w->rng, GLIBC_WORKING_SET);
            errors += glibc_free(blocks[i], size, tags[i], ~tags[i]);
            blocks[i] = glibc_make(size, ++tags[i]);
        }
        for (size_t i = 0; i < GLIBC_WORKING_SET; i++)
            errors += glibc_free(blocks[i], size, tags[i], ~tags[i]);
    }
    w->errors += errors;
}

static double scenario_glibc_simple(double scale, long *errors)
{
    (void)errors;
    share_out(GLIBC_SIMPLE_BLOCKS, scale);
    return run_team(glibc_simple_thread);
}

static double scenario_glibc_thread(double scale, long *errors)
{
    (void)errors;
    glibc_thread_draw();
    share_out(GLIBC_THREAD_STEPS, scale);
    return run_team(glibc_thread_thread);
}

static double scenario_glibc_thread_fixed(double scale, long *errors)
{
    (void)errors;
    share_out(GLIBC_FIXED_BLOCKS, scale);
    return run_team(glibc_fixed_thread);
}

/* ---- rptest ---- */

/* rpmalloc's benchmark as mimalloc-bench runs it (`rptest N 0 1 2 500 1000 100 8 16000`): random sizes
 * of 8-16000 B with its "linear" drop-off, a cross-thread batch every second loop, 500 loops of each of 2
 * iterations, 1000 slots per thread, loops of 30-99 allocations and 24-79 frees. */
#define RPTEST_LOOPS 32000L        /* loops in all, at scale 1 (rptest: 1000 per thread) */
#define RPTEST_SLOTS 1000
#define RPTEST_MIN 8
#define RPTEST_MAX 16000
#define RPTEST_CROSS_RATE 2
#define RPTEST_ALLOC_SCATTER 7     /* its slot strides: the first two of its primes that do not divide */
#define RPTEST_FREE_SCATTER 11     /* RPTEST_SLOTS */
#define RPTEST_SIZE_DRAWS 2000
#define RPTEST_ALLOC_DRAWS 311
#define RPTEST_FREE_DRAWS 257

static uint32_t rptest_sizes_drawn[RPTEST_SIZE_DRAWS];
static uint8_t rptest_allocs_drawn[RPTEST_ALLOC_DRAWS], rptest_frees_drawn[RPTEST_FREE_DRAWS];

/* A batch of blocks one thread makes and sends to another, which frees them and the batch. */
struct rptest_batch {
    struct rptest_batch *next;
    void **blocks;
    uint32_t count;
};

/* Each thread's inbox: a stack of batches that others push onto and it takes whole. */
struct rptest_inbox {
    _Atomic(struct rptest_batch *) top;
} __attribute__((aligned(CACHE_LINE)));
static struct rptest_inbox *rptest_inboxes;
static atomic_long rptest_finished; /* threads done with their loops: the others send no more */

/* Its tables, drawn once from SEED (rptest reads fixed tables of uniform draws): a size is 8 B plus
 * the range times u * |1 - v - w|, three uniform draws, as its linear mode makes one from three entries
 * of its table. */
static void rptest_draw(void)
{
    uint64_t rng = SEED ^ 0x7270746573747631u;
    for (size_t i = 0; i < RPTEST_SIZE_DRAWS; i++) {
        double u[3];
        for (int k = 0; k < 3; k++)
            u[k] = (double)(rng_next(&rng) >> 11) / (double)(1ull << 53);
        double d = 1.0 - u[1] - u[2];
        rptest_sizes_drawn[i] = RPTEST_MIN + (uint32_t)((RPTEST_MAX - RPTEST_MIN) * u[0] * (d < 0 ? -d : d));
    }
    for (size_t i = 0; i < RPTEST_ALLOC_DRAWS; i++)
        rptest_allocs_drawn[i] = (uint8_t)rng_between(&rng, 30, 99);
    for (size_t i = 0; i < RPTEST_FREE_DRAWS; i++)
        rptest_frees_drawn[i] = (uint8_t)(rng_between(&rng, 30, 99) * 8 / 10);
}

/* A block as rptest makes one: below 4 KB by memalign(8 or 16) and a memset, or by calloc (the third
 * pick, and every larger one); then its size in its first word, a byte in each page and its last byte. */
static void *rptest_make(size_t size, unsigned pick)
{
    void *p = NULL;
    if (size < 4096 && pick != 0) {
        if (bench_posix_memalign(&p, pick == 1 ? 8 : 16, size) != 0)
            p = NULL;
        if (p != NULL)
            memset(p, 0xcd, size);
    } else {
        p = bench_calloc(1, size);
    }
    if (p == NULL)
        out_of_memory(size);
    *(int32_t *)p = (int32_t)size;
    for (size_t page = 1; page < (size - 1) / 4096; page++)
        ((uint8_t *)p)[page * 4096] = 1;
    ((uint8_t *)p)[size - 1] = 1;
    return p;
}

/* Frees one of rptest_make's blocks: 1 when its marks are not as made. */
static int rptest_release(void *p)
{
    int32_t size = *(int32_t *)p;
    int bad = size < RPTEST_MIN || size > RPTEST_MAX || ((uint8_t *)p)[size - 1] != 1;
    bench_free(p);
    return bad;
}

static long rptest_take(struct worker *w)
{
    struct rptest_batch *b = atomic_exchange_explicit(&rptest_inboxes[w->index].top, NULL, memory_order_acquire);
    long n = 0;
    while (b != NULL) {
        struct rptest_batch *next = b->next;
        for (uint32_t i = 0; i < b->count; i++)
            w->errors += rptest_release(b->blocks[i]);
        bench_free(b->blocks);
        bench_free(b);
        b = next;
        n++;
    }
    return n;
}

static void rptest_send(long to, struct rptest_batch *b)
{
    struct rptest_batch *top = atomic_load_explicit(&rptest_inboxes[to].top, memory_order_relaxed);
    do {
        b->next = top;
    } while (!atomic_compare_exchange_weak_explicit(&rptest_inboxes[to].top, &top, b, memory_order_release,
                                                    memory_order_relaxed));
}

static void rptest_thread(struct worker *w)
{
    void **slots = alloc_block(RPTEST_SLOTS * sizeof(void *));
    memset(slots, 0, RPTEST_SLOTS * sizeof(void *));
    size_t size_at = (size_t)(w->index + 1) * 37 % RPTEST_SIZE_DRAWS, alloc_at = 0, free_at = 0;
    long to = w->index;
    for (long loop = 0; loop < w->share; loop++) {
        size_t frees = rptest_frees_drawn[loop % RPTEST_FREE_DRAWS];
        size_t allocs = rptest_allocs_drawn[loop % RPTEST_ALLOC_DRAWS];
        for (size_t k = 0; k < frees; k++) {
            if (slots[free_at] != NULL) {
                w->errors += rptest_release(slots[free_at]);
                slots[free_at] = NULL;
            }
            free_at = (free_at + RPTEST_FREE_SCATTER) % RPTEST_SLOTS;
        }
        rptest_take(w);
        for (size_t k = 0; k < allocs; k++) {
            if (slots[alloc_at] != NULL)
                w->errors += rptest_release(slots[alloc_at]);
            slots[alloc_at] = rptest_make(rptest_sizes_drawn[(size_at + 2) % RPTEST_SIZE_DRAWS],
                                          (unsigned)((size_at + k) % 3));
            alloc_at = (alloc_at + RPTEST_ALLOC_SCATTER) % RPTEST_SLOTS;
            size_at = (size_at + 1) % RPTEST_SIZE_DRAWS;
        }
        if (threads > 1 && loop % RPTEST_CROSS_RATE == 0 &&
            atomic_load_explicit(&rptest_finished, memory_order_acquire) == 0) {
            struct rptest_batch *b = alloc_block(sizeof *b);
            b->blocks = alloc_block(allocs * sizeof(void *));
            b->count = (uint32_t)allocs;
            for (size_t k = 0; k < allocs; k++) {
                b->blocks[k] = rptest_make(rptest_sizes_drawn[(size_at + 2) % RPTEST_SIZE_DRAWS],
                                           (unsigned)((size_at + k) % 3));
                size_at = (size_at + 1) % RPTEST_SIZE_DRAWS;
            }
            to = (to + 1) % threads; /* round robin over the other threads */
            if (to == w->index)
                to = (to + 1) % threads;
            rptest_send(to, b);
        }
    }
    /* Done: no thread sends from now on; take what was sent until every thread is done, then the rest. */
    atomic_fetch_add_explicit(&rptest_finished, 1, memory_order_acq_rel);
    while (atomic_load_explicit(&rptest_finished, memory_order_acquire) < threads)
        if (rptest_take(w) == 0)
            sched_yield();
    rptest_take(w);
    for (size_t i = 0; i < RPTEST_SLOTS; i++)
        if (slots[i] != NULL)
            w->errors += rptest_release(slots[i]);
    bench_free(slots);
}

static double scenario_rptest(double scale, long *errors)
{
    (void)errors;
    rptest_draw();
    rptest_inboxes = aligned_alloc(CACHE_LINE, (size_t)threads * sizeof *rptest_inboxes);
    if (rptest_inboxes == NULL)
        out_of_memory((size_t)threads * sizeof *rptest_inboxes);
    for (long i = 0; i < threads; i++)
        atomic_init(&rptest_inboxes[i].top, NULL);
    atomic_store(&rptest_finished, 0);
    share_out(RPTEST_LOOPS, scale);
    double ms = run_team(rptest_thread);
    free(rptest_inboxes);
    return ms;
}

/* ---- malloc-large ---- */

#define LARGE_STEPS 200L           /* replacements in all, at scale 1 (malloc-large: 2000) */
#define LARGE_SLOTS 20
#define LARGE_MIN (5u << 20)
#define LARGE_MAX (25u << 20)

/* The pattern in a block's first HEAD_WORDS words and its last word only. */
static void fill_ends(uint64_t *w, size_t size, uint32_t cookie)
{
    size_t n = size / 8;
    for (size_t i = 0; i < HEAD_WORDS; i++)
        w[i] = pattern(cookie, i);
    w[n - 1] = pattern(cookie, n - 1);
}

static int check_ends(const uint64_t *w, size_t size, uint32_t cookie)
{
    size_t n = size / 8;
    uint64_t bad = w[n - 1] ^ pattern(cookie, n - 1);
    for (size_t i = 0; i < HEAD_WORDS; i++)
        bad |= w[i] ^ pattern(cookie, i);
    return bad != 0;
}

/* memset through a volatile pointer: a compiler may otherwise make malloc and a memset of 0 one calloc,
 * which skips the writes that malloc-large's zeroing makes (a value-initialized new char[]). */
static void *(*volatile zero_fill)(void *, int, size_t) = memset;

static void malloc_large_thread(struct worker *w)
{
    struct block slots[LARGE_SLOTS] = {{0}};
    for (long i = 0; i < w->share; i++) {
        struct block *b = &slots[rng_below(&w->rng, LARGE_SLOTS)];
        /* The new block is made and zeroed before the slot's old one goes, as there: up to 21 live. */
        size_t size = rng_between(&w->rng, LARGE_MIN, LARGE_MAX);
        uint64_t *p = zero_fill(alloc_block(size), 0, size);
        uint32_t cookie = (uint32_t)rng_next(&w->rng);
        fill_ends(p, size, cookie);
        if (b->p != NULL) {
            w->errors += check_ends(b->p, b->size, b->cookie);
            bench_free(b->p);
        }
        *b = (struct block){p, (uint32_t)size, cookie};
    }
    for (size_t i = 0; i < LARGE_SLOTS; i++)
        if (slots[i].p != NULL) {
            w->errors += check_ends(slots[i].p, slots[i].size, slots[i].cookie);
            bench_free(slots[i].p);
        }
}

static double scenario_malloc_large(double scale, long *errors)
{
    (void)errors;
    share_out(LARGE_STEPS, scale);
    return run_team(malloc_large_thread);
}

/* ---- large-ends ---- */

#define LARGE_ENDS_STEPS 100000L   /* replacements in all, at scale 1 */
#define LARGE_ENDS_SLOTS 4

static void large_ends_thread(struct worker *w)
{
    struct block slots[LARGE_ENDS_SLOTS] = {{0}};
    for (long i = 0; i < w->share; i++) {
        struct block *b = &slots[rng_below(&w->rng, LARGE_ENDS_SLOTS)];
        if (b->p != NULL) {
            w->errors += check_ends(b->p, b->size, b->cookie);
            bench_free(b->p);
        }
        b->size = (uint32_t)rng_between(&w->rng, LARGE_MIN, LARGE_MAX);
        b->p = alloc_block(b->size);
        b->cookie = (uint32_t)rng_next(&w->rng);
        fill_ends(b->p, b->size, b->cookie);
    }
    for (size_t k = 0; k < LARGE_ENDS_SLOTS; k++)
        if (slots[k].p != NULL) {
            w->errors += check_ends(slots[k].p, slots[k].size, slots[k].cookie);
            bench_free(slots[k].p);
        }
}

static double scenario_large_ends(double scale, long *errors)
{
    (void)errors;
    share_out(LARGE_ENDS_STEPS, scale);
    return run_team(large_ends_thread);
}

/* ---- turnover ---- */

#define TURNOVER_STEPS 32000L      /* replacements in all, at scale 1 */
#define TURNOVER_SLOTS 8

static void turnover_thread(struct worker *w)
{
    struct block slots[TURNOVER_SLOTS] = {{0}};
    for (long i = 0; i < w->share; i++) {
        struct block *b = &slots[rng_below(&w->rng, TURNOVER_SLOTS)];
        if (b->p != NULL)
            w->errors += release(b);
        size_t size = rng_below(&w->rng, 4) == 0 ? rng_between(&w->rng, 1u << 20, 2u << 20)
                                                 : rng_between(&w->rng, 16, 100000);
        b->p = alloc_block(size);
        memset(b->p, (int)i, size); /* the buffer filled, then marked for the check */
        b->size = (uint32_t)size;
        b->cookie = (uint32_t)rng_next(&w->rng);
        fill(b->p, size, b->cookie);
    }
    w->errors += release_slots(slots, TURNOVER_SLOTS);
}

static double scenario_turnover(double scale, long *errors)
{
    (void)errors;
    share_out(TURNOVER_STEPS, scale);
    return run_team(turnover_thread);
}

/* ---- ring ---- */

#define RING_BLOCKS 2000000L       /* blocks in all, at scale 1 */
#define RING_SLOTS 1024
#define RING_TAKE_EVERY 32         /* blocks made between looks at the ring from the previous thread */
static const struct band ring_sizes[] = {{970, 4, 14}, {30, 14, 18}};

static long ring_take(struct worker *w)
{
    struct block b;
    long n = 0;
    while (ring_receive(w->in, &b)) {
        if (rng_below(&w->rng, 8) == 0)
            w->errors += resize(&b, draw_size(ring_sizes, &w->rng));
        w->errors += release(&b);
        n++;
    }
    return n;
}

static void ring_thread(struct worker *w)
{
    for (long i = 0; i < w->share; i++) {
        struct block b;
        make(&b, draw_size(ring_sizes, &w->rng), &w->rng);
        send_waiting(w, b, ring_take);
        if (i % RING_TAKE_EVERY == 0)
            ring_take(w);
    }
    drain_to_end(w, ring_take);
}

static double scenario_ring(double scale, long *errors)
{
    (void)errors;
    return run_ring(RING_SLOTS, RING_BLOCKS, scale, ring_thread);
}

/* ---- mixed ---- */

#define MIXED_STEPS 1500000L       /* steps in all, at scale 1 */
#define MIXED_SLOTS 8192
#define MIXED_MAX (8u << 20)       /* realloc grows a block up to this */
static const struct band mixed_sizes[] = {{949, 4, 12}, {50, 12, 18}, {1, 18, 22}};

/* A new block for b by one of the family's calls; returns 1 when calloc's zeros or an alignment are wrong. */
static int mixed_make(struct block *b, uint64_t *rng)
{
    size_t size = draw_size(mixed_sizes, rng);
    unsigned call = (unsigned)rng_below(rng, 20); /* 12 malloc, 3 calloc, 3 posix_memalign, 2 aligned_alloc */
    void *p;
    int bad = 0;
    if (call < 12) {
        p = alloc_block(size);
    } else if (call < 15) {
        p = bench_calloc(1, size);
        if (p == NULL)
            out_of_memory(size);
        bad = check_zero(p, size);
    } else {
        size_t align = (size_t)(call < 18 ? 16 : 32) << rng_below(rng, call < 18 ? 9 : 8);
        if (call < 18) {
            if (bench_posix_memalign(&p, align, size) != 0)
                out_of_memory(size);
        } else {
            size = (size + align - 1) & ~(align - 1); /* C11 asks for a multiple of the alignment */
            if ((p = bench_aligned_alloc(align, size)) == NULL)
                out_of_memory(size);
        }
        bad = ((uintptr_t)p & (align - 1)) != 0;
    }
    b->p = p;
    b->size = (uint32_t)size;
    b->cookie = (uint32_t)rng_next(rng);
    fill(b->p, size, b->cookie);
    return bad;
}

static void mixed_thread(struct worker *w)
{
    struct block *slots = calloc(MIXED_SLOTS, sizeof *slots);
    if (slots == NULL)
        out_of_memory(MIXED_SLOTS * sizeof *slots);
    long errors = 0;
    for (long i = 0; i < w->share; i++) {
        uint64_t x = rng_next(&w->rng);
        struct block *b = &slots[(x >> 32) % MIXED_SLOTS];
        unsigned what = x >> 8 & 7; /* 0: grow by half, 1: shrink by half, 2: free only, else replace */
        if (b->p != NULL && what == 0 && b->size + b->size / 2 <= MIXED_MAX) {
            errors += resize(b, b->size + b->size / 2);
            continue;
        }
        if (b->p != NULL && what == 1 && b->size >= 32) {
            errors += resize(b, b->size / 2);
            continue;
        }
        if (b->p != NULL)
            errors += release(b);
        if (what != 2)
            errors += mixed_make(b, &w->rng);
    }
    errors += release_slots(slots, MIXED_SLOTS);
    free(slots);
    w->errors += errors;
}

static double scenario_mixed(double scale, long *errors)
{
    (void)errors;
    share_out(MIXED_STEPS, scale);
    return run_team(mixed_thread);
}

/* ---- strings ---- */

#define STRINGS_ROUNDS 400L        /* strings and arrays built in all, at scale 1 */
#define STRINGS_KEPT 16            /* the newest kept of each */
#define STRINGS_PIECE_MAX 256
static const struct band string_lengths[] = {{1000, 10, 22}};   /* 1 KB .. 4 MB */
static const struct band array_lengths[] = {{1000, 4, 16}};     /* 16 .. 65536 elements */

/* A string's byte at index i is text_bytes[(i + cookie) % 256]: the table twice over, so that a piece
 * of up to 256 bytes is one memcpy from it. */
static unsigned char text_bytes[2 * 256 + STRINGS_PIECE_MAX];

struct text {
    unsigned char *s;              /* NULL: empty */
    size_t length;
    unsigned cookie;
};

struct array {
    uint64_t **items;              /* each: word 0 its size and cookie, then the pattern */
    size_t count;
};

static int text_check(const struct text *t)
{
    const unsigned char *want = text_bytes + (t->cookie & 255);
    int bad = 0;
    for (size_t i = 0; i < t->length && i < 64; i++)
        bad |= t->s[i] != want[i & 255];
    for (size_t i = 4096; i < t->length; i += 4096)
        bad |= t->s[i] != want[i & 255];
    return bad | (t->s[t->length - 1] != want[(t->length - 1) & 255]);
}

static void text_build(struct text *t, uint64_t *rng)
{
    size_t target = draw_size(string_lengths, rng), capacity = 64;
    t->cookie = (unsigned)rng_next(rng);
    t->s = alloc_block(capacity);
    t->length = 0;
    while (t->length < target) {
        size_t piece = rng_between(rng, 16, STRINGS_PIECE_MAX);
        if (t->length + piece > capacity) {
            while (t->length + piece > capacity)
                capacity += capacity / 2;
            t->s = bench_realloc(t->s, capacity);
            if (t->s == NULL)
                out_of_memory(capacity);
        }
        memcpy(t->s + t->length, text_bytes + ((t->length + t->cookie) & 255), piece);
        t->length += piece;
    }
}

static void array_build(struct array *a, uint64_t *rng)
{
    size_t target = draw_size(array_lengths, rng), capacity = 8;
    a->items = alloc_block(capacity * sizeof *a->items);
    for (a->count = 0; a->count < target; a->count++) {
        if (a->count == capacity) {
            capacity *= 2;
            a->items = bench_realloc(a->items, capacity * sizeof *a->items);
            if (a->items == NULL)
                out_of_memory(capacity * sizeof *a->items);
        }
        size_t size = rng_between(rng, 2, 16) * 8;
        uint32_t cookie = (uint32_t)rng_next(rng);
        uint64_t *p = alloc_block(size);
        fill(p, size, cookie);
        p[0] = (uint64_t)size << 32 | cookie;
        a->items[a->count] = p;
    }
}

static long array_drop(struct array *a)
{
    long errors = 0;
    for (size_t i = 0; i < a->count; i++) {
        uint64_t *p = a->items[i];
        size_t size = p[0] >> 32;
        uint32_t cookie = (uint32_t)p[0];
        p[0] = pattern(cookie, 0);
        errors += size < 16 || size > 128 || check(p, size, cookie);
        bench_free(p);
    }
    bench_free(a->items);
    a->items = NULL;
    return errors;
}

static void strings_thread(struct worker *w)
{
    struct text texts[STRINGS_KEPT] = {{0}};
    struct array arrays[STRINGS_KEPT] = {{0}};
    long errors = 0;
    for (long r = 0; r < w->share; r++) {
        struct text *t = &texts[r % STRINGS_KEPT];
        struct array *a = &arrays[r % STRINGS_KEPT];
        if (t->s != NULL) { /* the oldest dropped */
            errors += text_check(t);
            bench_free(t->s);
            errors += array_drop(a);
        }
        text_build(t, &w->rng);
        array_build(a, &w->rng);
    }
    for (size_t k = 0; k < STRINGS_KEPT; k++)
        if (texts[k].s != NULL) {
            errors += text_check(&texts[k]);
            bench_free(texts[k].s);
            errors += array_drop(&arrays[k]);
        }
    w->errors += errors;
}

static double scenario_strings(double scale, long *errors)
{
    (void)errors;
    for (size_t i = 0; i < sizeof text_bytes; i++)
        text_bytes[i] = (unsigned char)((i & 255) * 167 + 13);
    share_out(STRINGS_ROUNDS, scale);
    return run_team(strings_thread);
}

/* ---- Command line ---- */

/* VmHWM of /proc/self/status in KB: the high-water mark of the memory map that exec made (read without
 * allocating). */
static long peak_rss_kb(void)
{
    char text[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        fail("/proc/self/status", errno);
    ssize_t n = read(fd, text, sizeof text - 1);
    int err = errno;
    close(fd);
    if (n <= 0)
        fail("/proc/self/status", n < 0 ? err : EIO);
    text[n] = '\0';
    const char *peak = strstr(text, "VmHWM:");
    if (peak == NULL)
        fail("/proc/self/status: no VmHWM", EINVAL);
    return strtol(peak + 6, NULL, 10);
}

/* ---- requests ---- */

#define REQUESTS_STEPS 200000L /* replacements in all, at scale 1 */
#define REQUESTS_SLOTS 2

static void requests_thread(struct worker *w)
{
    struct block slots[REQUESTS_SLOTS] = {{0}};
    for (long i = 0; i < w->share; i++) {
        struct block *b = &slots[rng_below(&w->rng, REQUESTS_SLOTS)];
        if (b->p != NULL)
            w->errors += release(b);
        b->p = alloc_block(rng_between(&w->rng, (1u << 20) + 1, 2u << 20));
        b->size = (uint32_t)rng_between(&w->rng, 1024, 65536); /* the part the request uses */
        b->cookie = (uint32_t)rng_next(&w->rng);
        fill(b->p, b->size, b->cookie);
    }
    w->errors += release_slots(slots, REQUESTS_SLOTS);
}

static double scenario_requests(double scale, long *errors)
{
    (void)errors;
    share_out(REQUESTS_STEPS, scale);
    return run_team(requests_thread);
}

/* ---- large-heads ---- */

#define HEADS_ROUNDS 1000000L      /* rounds in all, at scale 1 (each uses every slot's block) */
#define HEADS_SLOTS 16
#define HEADS_REPLACE 4096         /* rounds between two replacements */

static void large_heads_thread(struct worker *w)
{
    struct block slots[HEADS_SLOTS];
    for (int k = 0; k < HEADS_SLOTS; k++) {
        slots[k].p = alloc_block(rng_between(&w->rng, (1u << 20) + 1, 2u << 20));
        slots[k].size = (uint32_t)rng_between(&w->rng, 1024, 16384); /* the part in use */
        slots[k].cookie = (uint32_t)rng_next(&w->rng);
        fill(slots[k].p, slots[k].size, slots[k].cookie);
        slots[k].p[HEAD_WORDS] = 0;
    }
    uint64_t bad = 0;
    for (long i = 0; i < w->share; i++) {
        for (int k = 0; k < HEADS_SLOTS; k++) {
            const struct block *b = &slots[k];
            bad |= b->p[0] ^ pattern(b->cookie, 0);
            b->p[HEAD_WORDS]++; /* a count beside the pattern, which the checks leave alone */
        }
        if (i % HEADS_REPLACE == HEADS_REPLACE - 1) {
            struct block *b = &slots[rng_below(&w->rng, HEADS_SLOTS)];
            w->errors += release(b);
            b->p = alloc_block(rng_between(&w->rng, (1u << 20) + 1, 2u << 20));
            b->size = (uint32_t)rng_between(&w->rng, 1024, 16384);
            b->cookie = (uint32_t)rng_next(&w->rng);
            fill(b->p, b->size, b->cookie);
            b->p[HEAD_WORDS] = 0;
        }
    }
    w->errors += bad != 0;
    w->errors += release_slots(slots, HEADS_SLOTS);
}

static double scenario_large_heads(double scale, long *errors)
{
    (void)errors;
    share_out(HEADS_ROUNDS, scale);
    return run_team(large_heads_thread);
}

struct scenario {
    const char *name;
    double (*run)(double scale, long *errors); /* the ms of its work; adds errors of its own to *errors */
    long threads;                              /* -threads by default */
};

static const struct scenario scenarios[] = {
    {"larson", scenario_larson, 2},
    {"larson-sized", scenario_larson_sized, 2},
    {"xmalloc", scenario_xmalloc, 2},
    {"cache-thrash", scenario_cache_thrash, 2},
    {"cache-scratch", scenario_cache_scratch, 2},
    {"alloc-test", scenario_alloc_test, 1},
    {"glibc-simple", scenario_glibc_simple, 1},
    {"glibc-thread", scenario_glibc_thread, 2},
    {"glibc-thread-fixed", scenario_glibc_thread_fixed, 2},
    {"rptest", scenario_rptest, 2},
    {"malloc-large", scenario_malloc_large, 1},
    {"large-ends", scenario_large_ends, 1},
    {"turnover", scenario_turnover, 1},
    {"requests", scenario_requests, 1},
    {"large-heads", scenario_large_heads, 1},
    {"ring", scenario_ring, 2},
    {"mixed", scenario_mixed, 1},
    {"strings", scenario_strings, 1},
};
#define SCENARIO_COUNT (sizeof scenarios / sizeof scenarios[0])

static void usage(FILE *to)
{
    fprintf(to, "usage: shapes <scenario> [-threads N] [-scale F]\n       shapes -list\nscenarios:");
    OPTION_LIST(to, scenarios);
}

int main(int argc, char **argv)
{
    const char *name = NULL;
    long given_threads = 0;
    double scale = 1.0;
    for (int a = 1; a < argc; a++) {
        const char *value;
        if (strcmp(argv[a], "-list") == 0 && argc == 2) {
            for (size_t k = 0; k < SCENARIO_COUNT; k++)
                printf("%s\n", scenarios[k].name);
            return 0;
        } else if ((value = option_value(argc, argv, &a, "-threads")) != NULL) {
            given_threads = option_count("-threads", value, 1, MAX_THREADS);
        } else if ((value = option_value(argc, argv, &a, "-scale")) != NULL) {
            scale = option_positive("-scale", value);
        } else {
            int status = option_other(argv[a], &name, usage);
            if (status >= 0)
                return status;
        }
    }
    const struct scenario *s = OPTION_NEED(scenarios, name, "scenario", usage);
    threads = given_threads != 0 ? given_threads : s->threads;

    /* The harness's memory, untimed: room for xmalloc's pairs, which may round threads up by one. */
    size_t room = (size_t)(threads + 1) * sizeof *workers;
    workers = aligned_alloc(_Alignof(struct worker), room);
    if (workers == NULL)
        out_of_memory(room);
    memset(workers, 0, room);
    for (long i = 0; i <= threads; i++) {
        workers[i].index = (int)i;
        workers[i].rng = mix64(SEED ^ mix64((uint64_t)(s - scenarios)) ^ (uint64_t)i) | 1;
    }

    long errors = 0;
    double ms = s->run(scale, &errors);
    for (long i = 0; i < threads; i++)
        errors += workers[i].errors;
    free(workers);

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("shapes: getrusage");
        return 1;
    }
    printf("shapes %s %.1f %.1f %ld %ld\n", s->name, ms, (double)peak_rss_kb() / 1024.0, (long)ru.ru_minflt,
           errors);
    fflush(stdout);
    if (errors != 0) {
        fprintf(stderr, "shapes: %ld blocks failed their check\n", errors);
        return 1;
    }
    return 0;
}
