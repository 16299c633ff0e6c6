/* bench/app.c - application benchmark: work shaped like a language runtime's, one binary per allocator.
 *
 * What it measures: the wall time a fixed amount of runtime-like work takes on N threads, and the memory
 * the process holds for it. The program calls only malloc, calloc, realloc and free, so the allocator is
 * chosen at link time: build/libshardmm.so (which exports malloc), Debian's libmimalloc, libjemalloc or
 * libtcmalloc (each replaces malloc when linked), or nothing for glibc's.
 *
 * How: every thread does the same work (the scenario's rounds), so with linear scaling the time stays
 * flat as N grows. The threads and the main thread start together at a barrier, where the clock starts.
 * A thread runs its rounds; each round builds its structures, uses them and frees them, except the last,
 * whose data the thread still holds when it meets the others at a second barrier. There the main thread
 * stops the clock and reads VmRSS and VmHWM of /proc/self/status; then it lets the threads free
 * everything and exit. ms is the span from the first barrier to the second (the frees are not in it).
 *
 * Checking: every thread draws from its own generator, seeded by the scenario's name and the thread's
 * index, so the work does not depend on the allocator or on timing. What a thread writes into a block it
 * reads back later (the work does) and compares with what it wrote; a mismatch is an error (a message on
 * stderr, exit status 1). The values read back are hashed into the thread's sum, and the sums of the
 * threads, in index order, into the checksum: it depends only on the scenario, the thread count and
 * -scale, never on an address, so checksums that differ between allocators mean corrupted memory.
 *
 * Scenarios (one function each, scenario_<name>; a round's size is given by the constants at its code):
 *   objects   reference-counted objects of 16-200 bytes (mostly 24-64), created zeroed by calloc, linked
 *             into small graphs (an object holds up to 4 others, at most 2 levels deep); retain and
 *             release are atomic read-modify-writes in the object, and the release that drops the count
 *             to 0 frees it and releases what it holds. Stresses: small calloc and free of mixed sizes,
 *             frees in an order set by the references, atomics on the allocator's cache lines.
 *   strings   strings appended a piece (1-40 bytes) at a time, each append a realloc to the exact new
 *             length as a naive runtime does, 64 of them growing interleaved; most end at up to 4 KB,
 *             a few at up to 100 KB; a finished string is concatenated with another or cut into
 *             substrings (new blocks), then freed. Stresses: realloc growth by small steps, in place or
 *             moving, across the small sizes into the medium ones.
 *   arrays    dynamic arrays of 4-, 8-, 16- or 24-byte elements grown one element at a time by
 *             realloc(p, (n + 1) * size) with no capacity of their own, 32 interleaved, up to 10000
 *             elements. Stresses: the allocator's own headroom and in-place growth.
 *   maps      chained hash maps with malloc'd string keys (and a block per entry) that grow by rehashing
 *             into a table twice the size, then shrink: half the keys deleted and the table rehashed to
 *             fit. Stresses: pairs of small blocks, bucket tables of growing and shrinking sizes, lookups
 *             that chase pointers through them.
 *   pack      msgpack-like messages (integers, strings, arrays of integers) written into buffers that
 *             double, then read back: the reader copies the packet first and copies each string into a
 *             new block, building a tree of values; the values are checked and everything is freed.
 *             Stresses: buffer doubling, bursts of small blocks that die together.
 *   json      a DOM of about 3000 nodes (objects, arrays, strings, numbers; each node, key, text and
 *             member array its own block, member arrays doubling), walked, serialized into a string that
 *             doubles, then freed. Stresses: a tree of small blocks freed at once, a growing text buffer.
 *   closures  tiny blocks (16-48 bytes) at a high rate: call frames' environments and closures made and
 *             freed last-in first-out as calls return, temporaries freed at once, and escaping closures
 *             kept in a table whose random slots are replaced (freed out of order). Stresses: the
 *             allocator's fast paths.
 *   mixed     rounds of one round each of objects, strings, arrays, maps, pack, json and closures (not the
 *             scenarios that need other threads or very large blocks). In the last round each dose runs
 *             inside the previous one's hold, so at the barrier the data of all seven is held at once.
 *             Stresses: many kinds of work sharing one heap.
 *   pipeline  producer-consumer pairs: -threads N runs max(1, N/2) pairs, that is 2 threads for N of 1
 *             or 2 (the line still says threads=N). The producer makes messages of 32-2000 bytes and
 *             hands them over through a bounded lock-free ring; the consumer checks each, keeps the
 *             latest 64 in a table and frees the one it replaces. Stresses: blocks freed by another
 *             thread than the one that allocated them.
 *   threads   short-lived threads: each worker starts a thread at a time, which allocates a few hundred
 *             blocks of 16-1024 bytes, hands a quarter of them back to the worker, frees the rest and
 *             exits; the worker joins it, then checks and frees the blocks it was given. Stresses: thread
 *             creation and exit (heaps made, abandoned, reused), frees into the heap of a thread that
 *             has exited.
 *   buffers   buffers of 1-64 MB grown from 1 MB by realloc, doubling or by an eighth at a time, each
 *             step written in full page by page and the old part checked; freed when done. Stresses:
 *             large blocks, in-place growth or moves by remapping, page faults, memory returned.
 *
 * Usage: app <scenario> [-threads N] [-scale F]      (N: 1 by default, up to 1024; F: 1 by default)
 *        app -list                                    (the scenario names, one a line)
 *   -scale multiplies the number of rounds (at least 1). At scale 1 each scenario takes about 0.2-0.5 s
 *   on one thread with glibc's malloc on the 2-core VM this was written on.
 *   Prints one line on stdout and nothing else:
 *     <scenario> threads=<N> ms=<wall ms> rss_kb=<VmRSS at the barrier> peak_kb=<VmHWM> checksum=<hex>
 *       ops=<allocator calls> [os_calls=<n> atomic_ops=<n> lock_acquisitions=<n> committed_peak_kb=<n>:
 *       linked with shardmm]
 *   Errors go to stderr: bad arguments with exit status 2, failed allocations and corrupted blocks 1.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */

#include <dlfcn.h>
#include <errno.h>

#include "shardmm.h" /* shard_stats only: the program calls no shard_ function directly (see main) */
#define BENCH_NAME "app"
#include "options.h"  /* -name value options */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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
#include <unistd.h>

#define MAX_THREADS 1024

/* ---- Allocator calls, counted ---- */

/* Every malloc, calloc, realloc and free of the scenarios is counted in a counter of its thread (no
 * shared write on the way), added up when the thread ends: the `ops` of the output line, which the runner
 * divides shardmm's own counters by. */
static _Thread_local unsigned long alloc_calls;
static atomic_ulong total_alloc_calls;
#define malloc(n) (alloc_calls++, malloc(n))
#define calloc(c, n) (alloc_calls++, calloc(c, n))
#define realloc(p, n) (alloc_calls++, realloc(p, n))
#define free(p) (alloc_calls++, free(p))
static void count_thread_calls(void) { atomic_fetch_add_explicit(&total_alloc_calls, alloc_calls, memory_order_relaxed); }

/* ---- Random numbers, hashes and patterns ---- */

#define GOLDEN64 0x9E3779B97F4A7C15u
#define GOLDEN32 0x9E3779B1u
#define HASH_START 0xCBF29CE484222325u   /* FNV-1a's offset basis */

/* splitmix64's output function: spreads a seed; also the checksum's mixing step. */
static uint64_t splitmix64(uint64_t x)
{
    x += GOLDEN64;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

static inline uint64_t mix(uint64_t h, uint64_t v) { return splitmix64(h ^ v); }

/* FNV-1a, a byte at a time: the hash of texts and serialized output. */
static inline uint64_t hash_byte(uint64_t h, unsigned char c) { return (h ^ c) * 0x100000001B3u; }

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t k = 0; k < n; k++)
        h = hash_byte(h, p[k]);
    return h;
}

/* xorshift64*: one generator per thread (or per message stream); the state is never 0. */
struct rng {
    uint64_t state;
};

static void rng_seed(struct rng *r, uint64_t seed) { r->state = splitmix64(seed) | 1; }

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t x = r->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->state = x;
    return x * 0x2545F4914F6CDD1Du;
}

static inline uint64_t rng_below(struct rng *r, uint64_t n) { return rng_next(r) % n; }

/* A size in [lo, hi], log-uniform: a doubling range [lo*2^k, lo*2^(k+1)] chosen uniformly, then a size
 * uniformly inside it (clamped to hi), so small sizes dominate as they do in programs. */
static size_t rng_log_size(struct rng *r, size_t lo, size_t hi)
{
    unsigned doublings = 1;
    while ((lo << doublings) < hi)
        doublings++;
    size_t base = lo << rng_below(r, doublings);
    size_t size = base + (size_t)rng_below(r, base + 1);
    return size < hi ? size : hi;
}

/* Texts (strings, keys' digits aside, packed and JSON strings): character i of the text of `seed`. */
static const char text_alphabet[] = "abcdefghijklmnopqrstuvwxyz012345"; /* 32 characters */

static inline char text_char(uint32_t seed, size_t i)
{
    return text_alphabet[(uint32_t)(seed + (uint32_t)i * GOLDEN32) >> 27];
}

static void text_write(char *to, uint32_t seed, size_t from, size_t n)
{
    for (size_t k = 0; k < n; k++)
        to[k] = text_char(seed, from + k);
}

/* Words of a filled block (closures, pipeline, threads): word j of the block of `value`. */
static inline uint64_t block_word(uint64_t value, size_t j) { return value + j * GOLDEN64; }

/* Writes x in decimal at `to` (room for 20 digits); returns the number of digits. */
static size_t format_u64(char *to, uint64_t x)
{
    char digits[20];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x != 0);
    for (size_t k = 0; k < n; k++)
        to[k] = digits[n - 1 - k];
    return n;
}

/* ---- Threads, errors and checked allocation ---- */

/* What a thread does with its data at the end of its last round (worker_hold). */
enum hold {
    HOLD_AT_BARRIER, /* meet the other threads at the barrier, then free */
    HOLD_NOTHING,    /* a dose of mixed before its last round: free at once */
    HOLD_NEXT_DOSE,  /* a dose of mixed in its last round: run the next dose first, then free */
};

struct pipe;

struct worker {
    const char *name;     /* the scenario's, for messages */
    int index;            /* 0 .. threads-1 */
    void (*run)(struct worker *w, long rounds);
    long rounds;
    struct rng rng;       /* seeded by the scenario's name and the index */
    uint64_t sum;         /* hash of what this thread read back */
    enum hold hold;
    int next_dose;        /* mixed: the dose to run next in its last round */
    struct pipe *pipe;    /* pipeline: the ring of this thread's pair */
    uint64_t pair_seed;   /* pipeline: seeds the messages, the same in both threads of a pair */
    bool consumer;        /* pipeline: this thread consumes */
    pthread_t thread;
};

/* Each worker has lines of its own (128 bytes: the adjacent-line prefetcher fetches pairs): the threads
 * write rng and sum all the time, and two workers on one line would make every run measure that false
 * sharing, at whatever offset the allocator put the array, instead of the allocator. */
struct worker_slot {
    alignas(128) struct worker w;
};

__attribute__((noreturn, cold)) static void corrupt(const struct worker *w, const char *what)
{
    fprintf(stderr, "app: %s, thread %d: %s\n", w->name, w->index, what);
    _Exit(1);
}

__attribute__((noreturn, cold)) static void out_of_memory(size_t size)
{
    fprintf(stderr, "app: allocation of %zu bytes failed\n", size);
    _Exit(1);
}

__attribute__((noreturn, cold)) static void fail(const char *what, int err)
{
    fprintf(stderr, "app: %s: %s\n", what, strerror(err));
    _Exit(1);
}

static inline void *xmalloc(size_t size)
{
    void *p = malloc(size);
    if (__builtin_expect(p == NULL, 0))
        out_of_memory(size);
    return p;
}

static inline void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count, size);
    if (__builtin_expect(p == NULL, 0))
        out_of_memory(count * size);
    return p;
}

static inline void *xrealloc(void *p, size_t size)
{
    void *q = realloc(p, size);
    if (__builtin_expect(q == NULL, 0))
        out_of_memory(size);
    return q;
}

static pthread_barrier_t start_line; /* the threads and main: the clock starts */
static pthread_barrier_t meeting;    /* the work is done, the data still held: the clock stops */
static pthread_barrier_t release;    /* the memory has been read: free everything and exit */

static void barrier_wait(pthread_barrier_t *b)
{
    int err = pthread_barrier_wait(b);
    if (err != 0 && err != PTHREAD_BARRIER_SERIAL_THREAD)
        fail("pthread_barrier_wait", err);
}

static void mixed_next_dose(struct worker *w);

/* Called once by every scenario, in its last round, while it holds that round's data. */
static void worker_hold(struct worker *w)
{
    switch (w->hold) {
    case HOLD_NOTHING:
        return;
    case HOLD_NEXT_DOSE:
        mixed_next_dose(w);
        return;
    case HOLD_AT_BARRIER:
        barrier_wait(&meeting);
        barrier_wait(&release);
        return;
    }
}

/* A block filled with the words of its value (closures, pipeline, threads). */
struct held_block {
    uint64_t *block; /* NULL: none */
    size_t size;     /* bytes, at least 16 */
    uint64_t value;
};

static void held_new(struct held_block *b, size_t size, uint64_t value)
{
    uint64_t *word = xmalloc(size);
    for (size_t j = 0; j < size / 8; j++)
        word[j] = block_word(value, j);
    *b = (struct held_block){word, size, value};
}

static void held_check(struct worker *w, const struct held_block *b, const char *what)
{
    for (size_t j = 0; j < b->size / 8; j++)
        if (b->block[j] != block_word(b->value, j))
            corrupt(w, what);
}

/* Checks the block, adds it to the thread's sum and frees it. */
static void held_free(struct worker *w, struct held_block *b, const char *what)
{
    held_check(w, b, what);
    w->sum = mix(w->sum, b->value ^ b->size);
    free(b->block);
    b->block = NULL;
}

/* ---- objects: reference-counted objects in small graphs ---- */

#define OBJECT_SLOTS 512       /* the objects the program refers to directly (a round's roots) */
#define OBJECT_STEPS 4096      /* per round: each makes an object and replaces a random root */
#define OBJECT_MAX_LINKS 4
#define OBJECT_MAX_DEPTH 2     /* only objects of a lower depth are linked: the graphs stay small */

/* Block layout: this header (16 bytes), `links` pointers, then payload bytes up to `size`. */
struct object {
    uint32_t refs;             /* changed by atomic read-modify-writes only */
    uint16_t size;             /* of the block: 16 .. 200, a multiple of 8 */
    uint8_t links;
    uint8_t depth;             /* 0: links nothing; else 1 + the largest depth of what it links */
    uint64_t value;
    struct object *link[];
};

static inline unsigned char object_byte(uint64_t value, size_t k)
{
    return (unsigned char)((value >> (k % 8 * 8)) + k);
}

static size_t object_payload(const struct object *o) { return sizeof *o + o->links * sizeof o->link[0]; }

static size_t object_size(struct rng *r)
{
    uint64_t pick = rng_below(r, 100);
    size_t size;
    if (pick < 70)
        size = 24 + rng_below(r, 41);
    else if (pick < 90)
        size = 16 + rng_below(r, 113);
    else
        size = 128 + rng_below(r, 73);
    return (size + 7) & ~(size_t)7;
}

static inline void object_retain(struct object *o) { __atomic_add_fetch(&o->refs, 1, __ATOMIC_RELAXED); }

static void object_release(struct worker *w, struct object *o)
{
    uint32_t left = __atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL);
    if (left != 0) {
        if (left == UINT32_MAX)
            corrupt(w, "an object was released more often than retained");
        return;
    }
    const unsigned char *bytes = (const unsigned char *)o;
    for (size_t k = object_payload(o); k < o->size; k++)
        if (bytes[k] != object_byte(o->value, k))
            corrupt(w, "an object's payload changed");
    w->sum = mix(w->sum, o->value + o->size);
    for (unsigned i = 0; i < o->links; i++)
        object_release(w, o->link[i]);
    free(o);
}

/* A new object (one reference, the caller's) linking some of the roots. */
static struct object *object_new(struct worker *w, struct object *const *roots)
{
    size_t size = object_size(&w->rng);
    uint64_t *word = xcalloc(1, size);
    for (size_t j = 0; j < size / 8; j++)
        if (word[j] != 0)
            corrupt(w, "calloc returned a block that is not zeroed");
    struct object *o = (struct object *)word;
    o->refs = 1;
    o->size = (uint16_t)size;
    o->value = rng_next(&w->rng);
    size_t room = (size - sizeof *o) / sizeof o->link[0];
    size_t tries = rng_below(&w->rng, (room < OBJECT_MAX_LINKS ? room : OBJECT_MAX_LINKS) + 1);
    for (size_t t = 0; t < tries; t++) {
        struct object *target = roots[rng_below(&w->rng, OBJECT_SLOTS)];
        if (target == NULL || target->depth >= OBJECT_MAX_DEPTH)
            continue;
        object_retain(target);
        o->link[o->links++] = target;
        if (target->depth + 1 > o->depth)
            o->depth = (uint8_t)(target->depth + 1);
    }
    unsigned char *bytes = (unsigned char *)o;
    for (size_t k = object_payload(o); k < size; k++)
        bytes[k] = object_byte(o->value, k);
    return o;
}

static void scenario_objects(struct worker *w, long rounds)
{
    struct object *roots[OBJECT_SLOTS];
    for (long r = 0; r < rounds; r++) {
        memset(roots, 0, sizeof roots);
        for (long step = 0; step < OBJECT_STEPS; step++) {
            struct object *o = object_new(w, roots);
            /* a method call: its arguments retained for the call, read, released */
            for (unsigned i = 0; i < o->links; i++) {
                object_retain(o->link[i]);
                w->sum += o->link[i]->value;
                object_release(w, o->link[i]);
            }
            struct object **root = &roots[rng_below(&w->rng, OBJECT_SLOTS)];
            if (*root != NULL)
                object_release(w, *root);
            *root = o;
        }
        if (r + 1 == rounds)
            worker_hold(w);
        for (size_t s = 0; s < OBJECT_SLOTS; s++)
            if (roots[s] != NULL)
                object_release(w, roots[s]);
    }
}

/* ---- strings: appended a piece at a time, concatenated, cut ---- */

#define STRING_SLOTS 64        /* strings growing at the same time */
#define STRING_STEPS 12288     /* appends per round */
#define STRING_PIECE_MAX 40

struct string {
    char *text;                /* NULL: the slot is free; else len characters and a NUL */
    size_t len, target;        /* finished when len reaches target */
    uint32_t seed;
};

static size_t string_target(struct rng *r)
{
    uint64_t pick = rng_below(r, 1000);
    if (pick < 5)
        return rng_log_size(r, 16384, 100000);
    if (pick < 60)
        return rng_log_size(r, 4096, 16384);
    return rng_log_size(r, 16, 4096);
}

/* Checks n characters at p against the text of seed from position `from`; returns h with them hashed. */
static uint64_t string_check(struct worker *w, const char *p, uint32_t seed, size_t from, size_t n, uint64_t h)
{
    for (size_t k = 0; k < n; k++) {
        if (p[k] != text_char(seed, from + k))
            corrupt(w, "a string changed");
        h = hash_byte(h, (unsigned char)p[k]);
    }
    return h;
}

/* A string reached its length: check it, use it in a concatenation or substrings, free it. */
static void string_finish(struct worker *w, struct string *s, const struct string *other)
{
    uint64_t h = string_check(w, s->text, s->seed, 0, s->len, HASH_START);
    if (s->text[s->len] != '\0')
        corrupt(w, "a string lost its terminator");
    switch (rng_below(&w->rng, 3)) {
    case 0: /* s + other, a new block */
        if (other->text != NULL && other != s) {
            size_t n = s->len + other->len;
            char *c = xmalloc(n + 1);
            memcpy(c, s->text, s->len);
            memcpy(c + s->len, other->text, other->len + 1);
            h = string_check(w, c, s->seed, 0, s->len, h);
            h = string_check(w, c + s->len, other->seed, 0, other->len, h);
            free(c);
        }
        break;
    case 1: /* four substrings, each a new block */
        for (int k = 0; k < 4; k++) {
            size_t from = rng_below(&w->rng, s->len);
            size_t n = 1 + rng_below(&w->rng, s->len - from);
            char *c = xmalloc(n + 1);
            memcpy(c, s->text + from, n);
            c[n] = '\0';
            h = string_check(w, c, s->seed, from, n, h);
            free(c);
        }
        break;
    default:
        break;
    }
    w->sum = mix(w->sum, h);
    free(s->text);
    s->text = NULL;
}

static void scenario_strings(struct worker *w, long rounds)
{
    struct string slot[STRING_SLOTS];
    for (long r = 0; r < rounds; r++) {
        memset(slot, 0, sizeof slot);
        for (long step = 0; step < STRING_STEPS; step++) {
            struct string *s = &slot[rng_below(&w->rng, STRING_SLOTS)];
            if (s->text == NULL) {
                s->len = 0;
                s->target = string_target(&w->rng);
                s->seed = (uint32_t)rng_next(&w->rng);
            }
            size_t piece = 1 + rng_below(&w->rng, STRING_PIECE_MAX);
            s->text = xrealloc(s->text, s->len + piece + 1); /* the exact new length */
            text_write(s->text + s->len, s->seed, s->len, piece);
            s->len += piece;
            s->text[s->len] = '\0';
            if (s->len >= s->target)
                string_finish(w, s, &slot[rng_below(&w->rng, STRING_SLOTS)]);
        }
        if (r + 1 == rounds)
            worker_hold(w);
        for (size_t i = 0; i < STRING_SLOTS; i++) {
            if (slot[i].text != NULL) {
                w->sum = mix(w->sum, string_check(w, slot[i].text, slot[i].seed, 0, slot[i].len, HASH_START));
                free(slot[i].text);
            }
        }
    }
}

/* ---- arrays: grown by one element per realloc ---- */

#define ARRAY_SLOTS 32         /* arrays growing at the same time */
#define ARRAY_STEPS 2048       /* bursts of appends per round */
#define ARRAY_BURST_MAX 32     /* appends to one array in a row */
#define ARRAY_MAX 10000        /* elements */

struct array {
    unsigned char *data;       /* NULL: the slot is free */
    size_t count, target, elem;
    uint32_t seed;
};

static const size_t array_elem_size[] = {4, 8, 16, 24};

/* Word j of element i of the array of seed. */
static inline uint32_t array_word(uint32_t seed, size_t i, size_t j)
{
    return seed + (uint32_t)i * GOLDEN32 + (uint32_t)j * 0x85EBCA77u;
}

static uint64_t array_check(struct worker *w, const struct array *a, size_t i, uint64_t h)
{
    const uint32_t *word = (const uint32_t *)(a->data + i * a->elem);
    for (size_t j = 0; j < a->elem / 4; j++) {
        if (word[j] != array_word(a->seed, i, j))
            corrupt(w, "an array element changed");
        h = h * 31 + word[j];
    }
    return h;
}

static uint64_t array_check_all(struct worker *w, const struct array *a)
{
    uint64_t h = a->count;
    for (size_t i = 0; i < a->count; i++)
        h = array_check(w, a, i, h);
    return h;
}

static void scenario_arrays(struct worker *w, long rounds)
{
    struct array slot[ARRAY_SLOTS];
    for (long r = 0; r < rounds; r++) {
        memset(slot, 0, sizeof slot);
        for (long step = 0; step < ARRAY_STEPS; step++) {
            struct array *a = &slot[rng_below(&w->rng, ARRAY_SLOTS)];
            if (a->data == NULL) {
                a->count = 0;
                a->elem = array_elem_size[rng_below(&w->rng, 4)];
                a->target = rng_log_size(&w->rng, 1, ARRAY_MAX);
                a->seed = (uint32_t)rng_next(&w->rng);
            }
            size_t burst = 1 + rng_below(&w->rng, ARRAY_BURST_MAX);
            for (size_t b = 0; b < burst && a->count < a->target; b++) {
                a->data = xrealloc(a->data, (a->count + 1) * a->elem);
                uint32_t *word = (uint32_t *)(a->data + a->count * a->elem);
                for (size_t j = 0; j < a->elem / 4; j++)
                    word[j] = array_word(a->seed, a->count, j);
                a->count++;
            }
            w->sum += array_check(w, a, rng_below(&w->rng, a->count), 0); /* an indexed read */
            if (a->count == a->target) {
                w->sum = mix(w->sum, array_check_all(w, a));
                free(a->data);
                a->data = NULL;
            }
        }
        if (r + 1 == rounds)
            worker_hold(w);
        for (size_t i = 0; i < ARRAY_SLOTS; i++) {
            if (slot[i].data != NULL) {
                w->sum = mix(w->sum, array_check_all(w, &slot[i]));
                free(slot[i].data);
            }
        }
    }
}

/* ---- maps: chained hash maps with string keys, growing and shrinking ---- */

#define MAP_KEYS 8192          /* keys inserted in each cycle */
#define MAP_CYCLES 3           /* per round: insert, look up, delete half, shrink */
#define MAP_MIN_BUCKETS 16

struct map_entry {
    struct map_entry *next;
    uint64_t hash;
    char *key;                 /* a block of its own */
    uint64_t value;
};

struct map {
    struct map_entry **bucket;
    size_t buckets;            /* a power of two; grows when count exceeds it */
    size_t count;
};

static const char *const map_key_prefix[4] = {"user.", "order:", "item/", "session-"};

/* The key of id at `to` (room for 32 bytes); returns its length. */
static size_t map_key(char *to, uint32_t id)
{
    const char *prefix = map_key_prefix[id & 3];
    size_t n = strlen(prefix);
    memcpy(to, prefix, n);
    n += format_u64(to + n, id >> 2);
    to[n] = '\0';
    return n;
}

static inline uint64_t map_value(uint32_t id) { return splitmix64(id); }

static uint64_t map_hash(const char *key, size_t len)
{
    return hash_bytes(HASH_START, (const unsigned char *)key, len);
}

static void map_init(struct map *m)
{
    m->bucket = xcalloc(MAP_MIN_BUCKETS, sizeof *m->bucket);
    m->buckets = MAP_MIN_BUCKETS;
    m->count = 0;
}

/* Moves every entry into a new table of `buckets` chains, frees the old one. */
static void map_rehash(struct map *m, size_t buckets)
{
    struct map_entry **bucket = xcalloc(buckets, sizeof *bucket);
    for (size_t b = 0; b < m->buckets; b++) {
        struct map_entry *next;
        for (struct map_entry *e = m->bucket[b]; e != NULL; e = next) {
            next = e->next;
            struct map_entry **chain = &bucket[e->hash & (buckets - 1)];
            e->next = *chain;
            *chain = e;
        }
    }
    free(m->bucket);
    m->bucket = bucket;
    m->buckets = buckets;
}

static struct map_entry *map_find(const struct map *m, const char *key, size_t len, uint64_t hash)
{
    for (struct map_entry *e = m->bucket[hash & (m->buckets - 1)]; e != NULL; e = e->next)
        if (e->hash == hash && memcmp(e->key, key, len + 1) == 0)
            return e;
    return NULL;
}

/* Sets key to value; a new key is copied into a block of its own. */
static void map_put(struct map *m, const char *key, size_t len, uint64_t value)
{
    uint64_t hash = map_hash(key, len);
    struct map_entry *e = map_find(m, key, len, hash);
    if (e != NULL) {
        e->value = value;
        return;
    }
    e = xmalloc(sizeof *e);
    e->key = xmalloc(len + 1);
    memcpy(e->key, key, len + 1);
    e->hash = hash;
    e->value = value;
    struct map_entry **chain = &m->bucket[hash & (m->buckets - 1)];
    e->next = *chain;
    *chain = e;
    if (++m->count > m->buckets)
        map_rehash(m, m->buckets * 2);
}

static bool map_remove(struct map *m, const char *key, size_t len)
{
    uint64_t hash = map_hash(key, len);
    for (struct map_entry **link = &m->bucket[hash & (m->buckets - 1)]; *link != NULL; link = &(*link)->next) {
        struct map_entry *e = *link;
        if (e->hash == hash && memcmp(e->key, key, len + 1) == 0) {
            *link = e->next;
            free(e->key);
            free(e);
            m->count--;
            return true;
        }
    }
    return false;
}

/* Rehashes into the smallest table that holds the entries, when that is smaller. */
static void map_trim(struct map *m)
{
    size_t buckets = MAP_MIN_BUCKETS;
    while (buckets < m->count)
        buckets *= 2;
    if (buckets < m->buckets)
        map_rehash(m, buckets);
}

/* Checks every entry (its key against its hash), adds it to the sum, frees the map. */
static void map_free(struct worker *w, struct map *m)
{
    for (size_t b = 0; b < m->buckets; b++) {
        struct map_entry *next;
        for (struct map_entry *e = m->bucket[b]; e != NULL; e = next) {
            next = e->next;
            if (map_hash(e->key, strlen(e->key)) != e->hash)
                corrupt(w, "a map key changed");
            w->sum += e->value;
            free(e->key);
            free(e);
        }
    }
    free(m->bucket);
}

static void scenario_maps(struct worker *w, long rounds)
{
    uint32_t *live = xmalloc(MAP_KEYS * MAP_CYCLES * sizeof *live); /* the ids in the map */
    char key[32];
    for (long r = 0; r < rounds; r++) {
        struct map m;
        map_init(&m);
        uint32_t base = (uint32_t)rng_next(&w->rng);
        uint32_t made = 0; /* the ids are base + k * GOLDEN32 for k < made: all different */
        size_t nlive = 0;
        for (int c = 0; c < MAP_CYCLES; c++) {
            for (int k = 0; k < MAP_KEYS; k++) {
                uint32_t id = base + made++ * GOLDEN32;
                live[nlive++] = id;
                map_put(&m, key, map_key(key, id), map_value(id));
            }
            for (size_t i = 0; i < nlive; i++) {
                size_t len = map_key(key, live[i]);
                struct map_entry *e = map_find(&m, key, len, map_hash(key, len));
                if (e == NULL || e->value != map_value(live[i]))
                    corrupt(w, "a map lost a key or its value");
                w->sum += e->value;
            }
            for (uint32_t k = 0; k < MAP_KEYS / 4; k++) { /* misses: ids not made yet */
                size_t len = map_key(key, base + (made + k) * GOLDEN32);
                if (map_find(&m, key, len, map_hash(key, len)) != NULL)
                    corrupt(w, "a map found a key never put in");
            }
            size_t kept = 0;
            for (size_t i = 0; i < nlive; i++) {
                if (i % 2 == 0)
                    live[kept++] = live[i];
                else if (!map_remove(&m, key, map_key(key, live[i])))
                    corrupt(w, "a map lost a key before its removal");
            }
            nlive = kept;
            map_trim(&m);
        }
        w->sum = mix(w->sum, m.count);
        if (r + 1 == rounds)
            worker_hold(w);
        map_free(w, &m);
    }
    free(live);
}

/* ---- pack: msgpack-like messages written, copied on read, decoded with copied strings ---- */

#define PACK_MESSAGES 192      /* per round, all written before any is read */
#define PACK_FIELDS_MIN 8
#define PACK_FIELDS_SPREAD 56  /* a message has 8 .. 63 fields */
#define PACK_ARRAY_MAX 16      /* integers in an array field */

/* A buffer that doubles (pack's messages, json's output). */
struct growbuf {
    unsigned char *data;
    size_t len, cap;
};

static void growbuf_grow(struct growbuf *b, size_t more)
{
    size_t cap = b->cap != 0 ? b->cap * 2 : 64;
    while (cap < b->len + more)
        cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

/* Room for `more` bytes at data + len. */
static inline unsigned char *growbuf_room(struct growbuf *b, size_t more)
{
    if (b->len + more > b->cap)
        growbuf_grow(b, more);
    return b->data + b->len;
}

static inline void growbuf_put(struct growbuf *b, const void *p, size_t n)
{
    memcpy(growbuf_room(b, n), p, n);
    b->len += n;
}

enum pack_kind { PACK_UINT, PACK_STR, PACK_ARRAY };

/* A field as the generator draws it; the writer packs it and the checker compares the decoded one. */
struct pack_field {
    enum pack_kind kind;
    uint64_t num;              /* PACK_UINT */
    uint32_t len;              /* PACK_STR: characters; PACK_ARRAY: integers */
    uint32_t seed;             /* PACK_STR: of the text; PACK_ARRAY: of the integers */
};

/* A decoded value: 32 bytes, each array of them a block, each string a block. */
struct pack_value {
    enum pack_kind kind;
    uint32_t count;            /* PACK_STR: characters; PACK_ARRAY: items */
    uint64_t num;
    char *str;
    struct pack_value *item;
};

/* An integer of any magnitude: one bit count out of 64 chosen uniformly. */
static inline uint64_t pack_random_uint(struct rng *r)
{
    uint64_t x = rng_next(r);
    return x >> (x & 63);
}

static void pack_next_field(struct rng *r, struct pack_field *f)
{
    uint64_t pick = rng_below(r, 100);
    if (pick < 40) {
        f->kind = PACK_UINT;
        f->num = pack_random_uint(r);
        return;
    }
    f->seed = (uint32_t)rng_next(r);
    if (pick < 75) {
        uint64_t band = rng_below(r, 100); /* fixstr, str8 or str16 */
        f->kind = PACK_STR;
        f->len = (uint32_t)(band < 70   ? rng_below(r, 32)
                            : band < 95 ? rng_log_size(r, 32, 255)
                                        : rng_log_size(r, 256, 1000));
    } else {
        f->kind = PACK_ARRAY;
        f->len = (uint32_t)(1 + rng_below(r, PACK_ARRAY_MAX));
    }
}

static void pack_uint(struct growbuf *b, uint64_t v)
{
    unsigned char *p = growbuf_room(b, 9);
    if (v < 0x80) {
        p[0] = (unsigned char)v;
        b->len += 1;
        return;
    }
    unsigned bytes = v <= 0xFF ? 1 : v <= 0xFFFF ? 2 : v <= 0xFFFFFFFF ? 4 : 8;
    p[0] = (unsigned char)(bytes == 1 ? 0xCC : bytes == 2 ? 0xCD : bytes == 4 ? 0xCE : 0xCF);
    for (unsigned k = 0; k < bytes; k++)
        p[1 + k] = (unsigned char)(v >> (8 * (bytes - 1 - k)));
    b->len += 1 + bytes;
}

static void pack_str(struct growbuf *b, uint32_t seed, size_t len)
{
    unsigned char *p = growbuf_room(b, 3 + len);
    size_t head;
    if (len < 32) {
        p[0] = (unsigned char)(0xA0 | len);
        head = 1;
    } else if (len <= 0xFF) {
        p[0] = 0xD9;
        p[1] = (unsigned char)len;
        head = 2;
    } else {
        p[0] = 0xDA;
        p[1] = (unsigned char)(len >> 8);
        p[2] = (unsigned char)len;
        head = 3;
    }
    text_write((char *)p + head, seed, 0, len);
    b->len += head + len;
}

static void pack_array_header(struct growbuf *b, size_t n)
{
    unsigned char *p = growbuf_room(b, 3);
    if (n < 16) {
        p[0] = (unsigned char)(0x90 | n);
        b->len += 1;
    } else {
        p[0] = 0xDC;
        p[1] = (unsigned char)(n >> 8);
        p[2] = (unsigned char)n;
        b->len += 3;
    }
}

static void pack_message_write(struct growbuf *b, uint64_t seed)
{
    struct rng r;
    rng_seed(&r, seed);
    size_t fields = PACK_FIELDS_MIN + rng_below(&r, PACK_FIELDS_SPREAD);
    pack_array_header(b, fields);
    for (size_t i = 0; i < fields; i++) {
        struct pack_field f;
        pack_next_field(&r, &f);
        if (f.kind == PACK_UINT) {
            pack_uint(b, f.num);
        } else if (f.kind == PACK_STR) {
            pack_str(b, f.seed, f.len);
        } else {
            struct rng items;
            rng_seed(&items, f.seed);
            pack_array_header(b, f.len);
            for (uint32_t k = 0; k < f.len; k++)
                pack_uint(b, pack_random_uint(&items));
        }
    }
}

struct pack_reader {
    struct worker *w;
    const unsigned char *at, *end;
};

static const unsigned char *pack_take(struct pack_reader *rd, size_t n)
{
    if ((size_t)(rd->end - rd->at) < n)
        corrupt(rd->w, "a packet ends early");
    const unsigned char *p = rd->at;
    rd->at += n;
    return p;
}

static uint64_t pack_read_be(struct pack_reader *rd, unsigned bytes)
{
    const unsigned char *p = pack_take(rd, bytes);
    uint64_t v = 0;
    for (unsigned k = 0; k < bytes; k++)
        v = v << 8 | p[k];
    return v;
}

/* Decodes one value into v: strings copied into new blocks, arrays into new blocks of values. */
static void pack_read(struct pack_reader *rd, struct pack_value *v, int depth)
{
    unsigned tag = *pack_take(rd, 1);
    if (tag < 0x80 || (tag >= 0xCC && tag <= 0xCF)) {
        v->kind = PACK_UINT;
        v->num = tag < 0x80 ? tag : pack_read_be(rd, 1u << (tag - 0xCC));
    } else if ((tag & 0xE0) == 0xA0 || tag == 0xD9 || tag == 0xDA) {
        size_t len = (tag & 0xE0) == 0xA0 ? (tag & 0x1F) : pack_read_be(rd, tag == 0xD9 ? 1 : 2);
        const unsigned char *s = pack_take(rd, len);
        v->kind = PACK_STR;
        v->count = (uint32_t)len;
        v->str = xmalloc(len + 1);
        memcpy(v->str, s, len);
        v->str[len] = '\0';
    } else if ((tag & 0xF0) == 0x90 || tag == 0xDC) {
        if (depth >= 2)
            corrupt(rd->w, "a packet nests too deep");
        size_t n = (tag & 0xF0) == 0x90 ? (tag & 0x0F) : pack_read_be(rd, 2);
        v->kind = PACK_ARRAY;
        v->count = (uint32_t)n;
        v->item = n != 0 ? xmalloc(n * sizeof *v->item) : NULL;
        for (size_t i = 0; i < n; i++)
            pack_read(rd, &v->item[i], depth + 1);
    } else {
        corrupt(rd->w, "a packet holds an unknown tag");
    }
}

static void pack_value_free(struct pack_value *v)
{
    if (v->kind == PACK_STR) {
        free(v->str);
    } else if (v->kind == PACK_ARRAY) {
        for (uint32_t i = 0; i < v->count; i++)
            pack_value_free(&v->item[i]);
        free(v->item);
    }
}

/* Compares the decoded message with the one the generator of seed draws; returns h with it hashed. */
static uint64_t pack_message_check(struct worker *w, const struct pack_value *top, uint64_t seed, uint64_t h)
{
    struct rng r;
    rng_seed(&r, seed);
    size_t fields = PACK_FIELDS_MIN + rng_below(&r, PACK_FIELDS_SPREAD);
    if (top->kind != PACK_ARRAY || top->count != fields)
        corrupt(w, "a decoded message has the wrong number of fields");
    for (size_t i = 0; i < fields; i++) {
        struct pack_field f;
        pack_next_field(&r, &f);
        const struct pack_value *v = &top->item[i];
        if (v->kind != f.kind)
            corrupt(w, "a decoded field has the wrong kind");
        if (f.kind == PACK_UINT) {
            if (v->num != f.num)
                corrupt(w, "a decoded integer changed");
            h = mix(h, v->num);
        } else if (f.kind == PACK_STR) {
            if (v->count != f.len || v->str[f.len] != '\0')
                corrupt(w, "a decoded string has the wrong length");
            h = string_check(w, v->str, f.seed, 0, f.len, h);
        } else {
            struct rng items;
            rng_seed(&items, f.seed);
            if (v->count != f.len)
                corrupt(w, "a decoded array has the wrong length");
            for (uint32_t k = 0; k < f.len; k++) {
                const struct pack_value *e = &v->item[k];
                if (e->kind != PACK_UINT || e->num != pack_random_uint(&items))
                    corrupt(w, "a decoded array item changed");
                h = mix(h, e->num);
            }
        }
    }
    return h;
}

struct pack_message {
    uint64_t seed;
    struct growbuf packet;     /* as written */
    unsigned char *copy;       /* the reader's copy of the packet */
    struct pack_value top;     /* decoded from the copy */
};

static void scenario_pack(struct worker *w, long rounds)
{
    for (long r = 0; r < rounds; r++) {
        struct pack_message *msg = xcalloc(PACK_MESSAGES, sizeof *msg);
        for (size_t m = 0; m < PACK_MESSAGES; m++) {
            msg[m].seed = rng_next(&w->rng);
            pack_message_write(&msg[m].packet, msg[m].seed);
        }
        for (size_t m = 0; m < PACK_MESSAGES; m++) {
            size_t len = msg[m].packet.len;
            msg[m].copy = xmalloc(len);
            memcpy(msg[m].copy, msg[m].packet.data, len);
            struct pack_reader rd = {w, msg[m].copy, msg[m].copy + len};
            pack_read(&rd, &msg[m].top, 0);
            if (rd.at != rd.end)
                corrupt(w, "a packet is longer than its message");
        }
        for (size_t m = 0; m < PACK_MESSAGES; m++)
            w->sum = mix(w->sum, pack_message_check(w, &msg[m].top, msg[m].seed, msg[m].packet.len));
        if (r + 1 == rounds)
            worker_hold(w);
        for (size_t m = 0; m < PACK_MESSAGES; m++) {
            pack_value_free(&msg[m].top);
            free(msg[m].copy);
            free(msg[m].packet.data);
        }
        free(msg);
    }
}

/* ---- json: a DOM built, walked, serialized, freed ---- */

#define JSON_NODES 3000        /* per document, about */
#define JSON_MAX_DEPTH 6
#define JSON_STRING_MAX 80

enum json_kind { JSON_NULL, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

struct json_member {
    char *key;                 /* a block of its own */
    struct json *value;
};

/* A node: 32 bytes, made zeroed by calloc. */
struct json {
    uint8_t kind;
    uint32_t count;            /* JSON_STRING: characters; JSON_ARRAY, JSON_OBJECT: entries in use */
    uint32_t cap;              /* JSON_ARRAY, JSON_OBJECT: entries allocated (doubling from 4) */
    uint32_t check;            /* JSON_NUMBER: a hash of the number; JSON_STRING: the seed of its text */
    int64_t number;
    union {
        char *text;
        struct json **item;
        struct json_member *member;
    };
};

static const char *const json_names[16] = {
    "id", "name", "type", "value", "items", "children", "created", "modified",
    "owner", "tags", "status", "price", "quantity", "description", "url", "parent",
};

static inline uint32_t json_number_check(int64_t n) { return (uint32_t)(splitmix64((uint64_t)n) >> 32); }

static struct json *json_node(enum json_kind kind)
{
    struct json *j = xcalloc(1, sizeof *j);
    j->kind = (uint8_t)kind;
    return j;
}

static char *json_key(const char *name)
{
    size_t n = strlen(name);
    char *key = xmalloc(n + 1);
    memcpy(key, name, n + 1);
    return key;
}

static void json_object_add(struct json *o, char *key, struct json *value)
{
    if (o->count == o->cap) {
        o->cap = o->cap != 0 ? o->cap * 2 : 4;
        o->member = xrealloc(o->member, o->cap * sizeof *o->member);
    }
    o->member[o->count++] = (struct json_member){key, value};
}

static void json_array_add(struct json *a, struct json *value)
{
    if (a->count == a->cap) {
        a->cap = a->cap != 0 ? a->cap * 2 : 4;
        a->item = xrealloc(a->item, a->cap * sizeof *a->item);
    }
    a->item[a->count++] = value;
}

static struct json *json_number(int64_t n)
{
    struct json *j = json_node(JSON_NUMBER);
    j->number = n;
    j->check = json_number_check(n);
    return j;
}

/* A random value at depth (1: a record, always an object); each node made takes one from *budget. */
static struct json *json_build(struct worker *w, int depth, long *budget)
{
    struct rng *r = &w->rng;
    (*budget)--;
    uint64_t pick = depth == 1 ? 0 : rng_below(r, 100);
    bool nest = depth < JSON_MAX_DEPTH;
    if (pick < 12 && nest) {
        struct json *o = json_node(JSON_OBJECT);
        size_t n = 2 + rng_below(r, 10);
        for (size_t i = 0; i < n && *budget > 0; i++)
            json_object_add(o, json_key(json_names[rng_below(r, 16)]), json_build(w, depth + 1, budget));
        return o;
    }
    if (pick < 22 && nest) {
        struct json *a = json_node(JSON_ARRAY);
        size_t n = rng_below(r, 16);
        for (size_t i = 0; i < n && *budget > 0; i++)
            json_array_add(a, json_build(w, depth + 1, budget));
        return a;
    }
    if (pick < 60) {
        struct json *s = json_node(JSON_STRING);
        s->count = (uint32_t)rng_log_size(r, 1, JSON_STRING_MAX);
        s->check = (uint32_t)rng_next(r);
        s->text = xmalloc(s->count + 1);
        text_write(s->text, s->check, 0, s->count);
        s->text[s->count] = '\0';
        return s;
    }
    if (pick < 90) {
        uint64_t x = rng_next(r);
        int64_t n = (int64_t)(x >> ((x & 63) | 1));
        return json_number(x & 64 ? -n : n);
    }
    return json_node(pick < 95 ? JSON_TRUE : JSON_NULL);
}

static bool json_key_ok(const char *key)
{
    size_t n = 0;
    for (; key[n] != '\0'; n++)
        if (key[n] < 'a' || key[n] > 'z' || n >= 16)
            return false;
    return n >= 2;
}

/* Reads every node back and checks it; returns h with the document hashed. */
static uint64_t json_walk(struct worker *w, const struct json *j, uint64_t h)
{
    h = hash_byte(h, j->kind);
    switch (j->kind) {
    case JSON_NUMBER:
        if (j->check != json_number_check(j->number))
            corrupt(w, "a JSON number changed");
        return mix(h, (uint64_t)j->number);
    case JSON_STRING:
        if (j->text[j->count] != '\0')
            corrupt(w, "a JSON string lost its terminator");
        return string_check(w, j->text, j->check, 0, j->count, h);
    case JSON_ARRAY:
        for (uint32_t i = 0; i < j->count; i++)
            h = json_walk(w, j->item[i], h);
        return h;
    case JSON_OBJECT:
        for (uint32_t i = 0; i < j->count; i++) {
            if (!json_key_ok(j->member[i].key))
                corrupt(w, "a JSON key changed");
            h = json_walk(w, j->member[i].value, h);
        }
        return h;
    default:
        return h;
    }
}

static void json_write(struct growbuf *out, const struct json *j)
{
    switch (j->kind) {
    case JSON_NULL:
        growbuf_put(out, "null", 4);
        break;
    case JSON_TRUE:
        growbuf_put(out, "true", 4);
        break;
    case JSON_NUMBER: {
        char *p = (char *)growbuf_room(out, 21);
        size_t n = 0;
        uint64_t magnitude = (uint64_t)j->number;
        if (j->number < 0) {
            p[n++] = '-';
            magnitude = 0 - magnitude;
        }
        out->len += n + format_u64(p + n, magnitude);
        break;
    }
    case JSON_STRING: {
        unsigned char *p = growbuf_room(out, j->count + 2);
        p[0] = '"';
        memcpy(p + 1, j->text, j->count);
        p[j->count + 1] = '"';
        out->len += j->count + 2;
        break;
    }
    case JSON_ARRAY:
        growbuf_put(out, "[", 1);
        for (uint32_t i = 0; i < j->count; i++) {
            if (i != 0)
                growbuf_put(out, ",", 1);
            json_write(out, j->item[i]);
        }
        growbuf_put(out, "]", 1);
        break;
    case JSON_OBJECT:
        growbuf_put(out, "{", 1);
        for (uint32_t i = 0; i < j->count; i++) {
            if (i != 0)
                growbuf_put(out, ",", 1);
            growbuf_put(out, "\"", 1);
            growbuf_put(out, j->member[i].key, strlen(j->member[i].key));
            growbuf_put(out, "\":", 2);
            json_write(out, j->member[i].value);
        }
        growbuf_put(out, "}", 1);
        break;
    }
}

static void json_free(struct json *j)
{
    if (j->kind == JSON_STRING) {
        free(j->text);
    } else if (j->kind == JSON_ARRAY) {
        for (uint32_t i = 0; i < j->count; i++)
            json_free(j->item[i]);
        free(j->item);
    } else if (j->kind == JSON_OBJECT) {
        for (uint32_t i = 0; i < j->count; i++) {
            free(j->member[i].key);
            json_free(j->member[i].value);
        }
        free(j->member);
    }
    free(j);
}

static void scenario_json(struct worker *w, long rounds)
{
    for (long r = 0; r < rounds; r++) {
        /* {"version": n, "items": [records...]} */
        struct json *doc = json_node(JSON_OBJECT);
        json_object_add(doc, json_key("version"), json_number(r + 1));
        struct json *items = json_node(JSON_ARRAY);
        json_object_add(doc, json_key("items"), items);
        long budget = JSON_NODES;
        while (budget > 0)
            json_array_add(items, json_build(w, 1, &budget));

        uint64_t h = json_walk(w, doc, HASH_START);
        struct growbuf out = {0};
        json_write(&out, doc);
        h = hash_bytes(h, out.data, out.len);
        w->sum = mix(w->sum, h);
        if (r + 1 == rounds)
            worker_hold(w);
        json_free(doc);
        free(out.data);
    }
}

/* ---- closures: tiny blocks made and freed at a high rate ---- */

#define CLOSURE_STEPS 24576     /* calls and returns per round */
#define CLOSURE_DEPTH 64        /* frames at most */
#define CLOSURE_SURVIVORS 256   /* escaped closures kept; a random one is replaced */
#define CLOSURE_ESCAPE_PER_8 1  /* a closure escapes its frame 1 time in 8 */

struct frame {
    struct held_block env;
    struct held_block closure[2];
    unsigned closures;
};

/* A tiny block of 16, 24, 32, 40 or 48 bytes; the size follows from the value. */
static void tiny_new(struct worker *w, struct held_block *b)
{
    uint64_t value = rng_next(&w->rng);
    held_new(b, 16 + 8 * (value % 5), value);
}

static void scenario_closures(struct worker *w, long rounds)
{
    struct frame stack[CLOSURE_DEPTH];
    struct held_block survivor[CLOSURE_SURVIVORS];
    for (long r = 0; r < rounds; r++) {
        unsigned depth = 0;
        memset(survivor, 0, sizeof survivor);
        for (long step = 0; step < CLOSURE_STEPS; step++) {
            struct held_block temp; /* a boxed temporary: made, used, freed at once */
            tiny_new(w, &temp);
            held_free(w, &temp, "a temporary changed");
            bool call = depth == 0 || (depth < CLOSURE_DEPTH && rng_below(&w->rng, 2) == 0);
            if (call) {
                struct frame *f = &stack[depth++];
                tiny_new(w, &f->env);
                f->closures = (unsigned)rng_below(&w->rng, 3);
                for (unsigned c = 0; c < f->closures; c++)
                    tiny_new(w, &f->closure[c]);
                continue;
            }
            struct frame *f = &stack[--depth];
            for (unsigned c = f->closures; c-- > 0;) {
                if (rng_below(&w->rng, 8) < CLOSURE_ESCAPE_PER_8) {
                    struct held_block *s = &survivor[rng_below(&w->rng, CLOSURE_SURVIVORS)];
                    if (s->block != NULL)
                        held_free(w, s, "an escaped closure changed");
                    *s = f->closure[c];
                } else {
                    held_free(w, &f->closure[c], "a closure changed");
                }
            }
            held_free(w, &f->env, "an environment changed");
        }
        if (r + 1 == rounds)
            worker_hold(w);
        while (depth > 0) {
            struct frame *f = &stack[--depth];
            for (unsigned c = f->closures; c-- > 0;)
                held_free(w, &f->closure[c], "a closure changed");
            held_free(w, &f->env, "an environment changed");
        }
        for (size_t s = 0; s < CLOSURE_SURVIVORS; s++)
            if (survivor[s].block != NULL)
                held_free(w, &survivor[s], "an escaped closure changed");
    }
}

/* ---- mixed: one round of each of seven scenarios, in turn ---- */

static void (*const mixed_doses[])(struct worker *, long) = {
    scenario_objects, scenario_strings, scenario_arrays, scenario_maps,
    scenario_pack, scenario_json, scenario_closures,
};
#define MIXED_DOSES (int)(sizeof mixed_doses / sizeof mixed_doses[0])

/* In the last round: the next dose, run inside the hold of the one before; the last one meets the
 * other threads at the barrier, so every dose's data is held there. */
static void mixed_next_dose(struct worker *w)
{
    int d = w->next_dose++;
    if (w->next_dose == MIXED_DOSES)
        w->hold = HOLD_AT_BARRIER;
    mixed_doses[d](w, 1);
}

static void scenario_mixed(struct worker *w, long rounds)
{
    w->hold = HOLD_NOTHING;
    for (long r = 0; r + 1 < rounds; r++)
        for (int d = 0; d < MIXED_DOSES; d++)
            mixed_doses[d](w, 1);
    w->hold = HOLD_NEXT_DOSE;
    w->next_dose = 0;
    mixed_next_dose(w);
}

/* ---- pipeline: messages made by one thread, freed by another ---- */

#define PIPE_SLOTS 256          /* a power of two */
#define PIPE_MESSAGES 8192      /* per round */
#define PIPE_MESSAGE_MIN 32
#define PIPE_MESSAGE_MAX 2000
#define PIPE_WINDOW 64          /* the consumer keeps the latest messages, replacing a random one */
#define PIPE_BATCH 16           /* head and tail are published every 16 messages, and before waiting */

/* Single-producer single-consumer ring; head and tail each on a cache line of its own. Each side
 * publishes its counter every PIPE_BATCH messages rather than every message (so the two cores do not
 * trade the lines on every message), and always before it waits for the other side. */
struct pipe {
    alignas(64) atomic_size_t head; /* messages put in, written by the producer only */
    alignas(64) atomic_size_t tail; /* messages taken out, written by the consumer only */
    alignas(64) uint64_t *slot[PIPE_SLOTS];
};

static struct pipe pipes[MAX_THREADS / 2];

/* Waiting for the other thread: spin briefly, then yield (it may share the core). */
static void pipe_wait(unsigned *spins)
{
    if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

/* The next message of the pair's stream, the same in the producer and the consumer. */
static void pipe_next_message(struct rng *stream, size_t *size, uint64_t *value)
{
    *size = rng_log_size(stream, PIPE_MESSAGE_MIN, PIPE_MESSAGE_MAX);
    *value = rng_next(stream);
}

static void scenario_pipeline(struct worker *w, long rounds)
{
    struct pipe *q = w->pipe;
    struct rng stream;
    rng_seed(&stream, w->pair_seed);
    long total = rounds * PIPE_MESSAGES;
    if (!w->consumer) {
        size_t head = 0, tail_seen = 0; /* the tail is read again only when the ring looks full */
        for (long i = 0; i < total; i++) {
            struct held_block m;
            pipe_next_message(&stream, &m.size, &m.value);
            held_new(&m, m.size, m.value);
            if (head - tail_seen == PIPE_SLOTS) {
                atomic_store_explicit(&q->head, head, memory_order_release);
                unsigned spins = 0;
                while ((tail_seen = atomic_load_explicit(&q->tail, memory_order_acquire)) + PIPE_SLOTS == head)
                    pipe_wait(&spins);
            }
            q->slot[head++ % PIPE_SLOTS] = m.block;
            if (head % PIPE_BATCH == 0)
                atomic_store_explicit(&q->head, head, memory_order_release);
        }
        atomic_store_explicit(&q->head, head, memory_order_release);
        worker_hold(w);
        return;
    }
    struct held_block window[PIPE_WINDOW] = {0};
    size_t tail = 0, head_seen = 0; /* the head is read again only when the ring looks empty */
    for (long i = 0; i < total; i++) {
        if (tail == head_seen) {
            atomic_store_explicit(&q->tail, tail, memory_order_release);
            unsigned spins = 0;
            while ((head_seen = atomic_load_explicit(&q->head, memory_order_acquire)) == tail)
                pipe_wait(&spins);
        }
        struct held_block m = {.block = q->slot[tail++ % PIPE_SLOTS]};
        if (tail % PIPE_BATCH == 0)
            atomic_store_explicit(&q->tail, tail, memory_order_release);
        pipe_next_message(&stream, &m.size, &m.value);
        held_check(w, &m, "a message changed on its way");
        struct held_block *keep = &window[rng_below(&w->rng, PIPE_WINDOW)];
        if (keep->block != NULL)
            held_free(w, keep, "a kept message changed");
        *keep = m;
    }
    worker_hold(w);
    for (size_t k = 0; k < PIPE_WINDOW; k++)
        if (window[k].block != NULL)
            held_free(w, &window[k], "a kept message changed");
}

/* ---- threads: short-lived threads that hand blocks back ---- */

#define CHILDREN 48             /* threads started one after another per round */
#define CHILD_BLOCKS_MIN 200
#define CHILD_BLOCKS_MAX 400
#define CHILD_HANDBACK_PER_4 1  /* a quarter of a child's blocks go back to its parent */

struct child {
    struct worker self;         /* the child's generator and sum; name and index for messages */
    size_t handed;
    struct held_block back[CHILD_BLOCKS_MAX];
};

static void *child_main(void *arg)
{
    struct child *c = arg;
    struct worker *w = &c->self;
    struct held_block block[CHILD_BLOCKS_MAX];
    size_t n = CHILD_BLOCKS_MIN + rng_below(&w->rng, CHILD_BLOCKS_MAX - CHILD_BLOCKS_MIN + 1);
    for (size_t i = 0; i < n; i++)
        held_new(&block[i], rng_log_size(&w->rng, 16, 1024), rng_next(&w->rng));
    for (size_t i = 0; i < n; i++) {
        if (rng_below(&w->rng, 4) < CHILD_HANDBACK_PER_4)
            c->back[c->handed++] = block[i];
        else
            held_free(w, &block[i], "a child's block changed");
    }
    count_thread_calls();
    return NULL;
}

static void scenario_threads(struct worker *w, long rounds)
{
    struct child *c = xmalloc(sizeof *c);
    for (long r = 0; r < rounds; r++) {
        for (int k = 0; k < CHILDREN; k++) {
            c->self = (struct worker){.name = w->name, .index = w->index};
            rng_seed(&c->self.rng, rng_next(&w->rng));
            c->handed = 0;
            pthread_t t;
            int err = pthread_create(&t, NULL, child_main, c);
            if (err != 0)
                fail("pthread_create", err);
            err = pthread_join(t, NULL);
            if (err != 0)
                fail("pthread_join", err);
            w->sum = mix(w->sum, c->self.sum);
            if (r + 1 == rounds && k + 1 == CHILDREN)
                worker_hold(w);
            for (size_t i = 0; i < c->handed; i++)
                held_free(w, &c->back[i], "a block handed back changed");
        }
    }
    free(c);
}

/* ---- buffers: large buffers grown by realloc ---- */

#define BUFFER_MIN ((size_t)1 << 20)
#define BUFFER_MAX ((size_t)64 << 20)
#define PAGE 4096

/* Page p of a buffer: its first word is seed ^ p, every other byte (uint8_t)(seed + p). */
static inline uint64_t buffer_mark(uint64_t seed, size_t page) { return seed ^ page; }
static inline uint64_t buffer_fill_word(uint64_t seed, size_t page)
{
    return (uint8_t)(seed + page) * 0x0101010101010101u;
}

static size_t page_round(size_t n) { return (n + PAGE - 1) & ~(size_t)(PAGE - 1); }

/* Writes the pages [from, to) (page multiples) in full. */
static void buffer_fill(unsigned char *p, size_t from, size_t to, uint64_t seed)
{
    for (size_t at = from; at < to; at += PAGE) {
        size_t page = at / PAGE;
        memset(p + at, (uint8_t)(seed + page), PAGE);
        uint64_t mark = buffer_mark(seed, page);
        memcpy(p + at, &mark, sizeof mark);
    }
}

/* Checks the first word of each page in [0, size): what a move must have kept. */
static void buffer_check_marks(struct worker *w, const unsigned char *p, size_t size, uint64_t seed)
{
    for (size_t at = 0; at < size; at += PAGE) {
        uint64_t mark;
        memcpy(&mark, p + at, sizeof mark);
        if (mark != buffer_mark(seed, at / PAGE))
            corrupt(w, "a buffer page lost its mark");
    }
}

/* Checks every byte; returns a hash of the marks. */
static uint64_t buffer_check(struct worker *w, const unsigned char *p, size_t size, uint64_t seed)
{
    uint64_t h = size;
    for (size_t at = 0; at < size; at += PAGE) {
        size_t page = at / PAGE;
        const uint64_t *word = (const uint64_t *)(p + at);
        uint64_t fill = buffer_fill_word(seed, page), bad = word[0] ^ buffer_mark(seed, page);
        for (size_t j = 1; j < PAGE / 8; j++)
            bad |= word[j] ^ fill;
        if (bad != 0)
            corrupt(w, "a buffer changed");
        h = h * 31 + word[0];
    }
    return h;
}

static void scenario_buffers(struct worker *w, long rounds)
{
    for (long r = 0; r < rounds; r++) {
        size_t target = page_round(rng_log_size(&w->rng, BUFFER_MIN, BUFFER_MAX));
        bool doubling = rng_below(&w->rng, 2) == 0;
        uint64_t seed = rng_next(&w->rng);
        size_t size = BUFFER_MIN;
        unsigned char *p = xmalloc(size);
        buffer_fill(p, 0, size, seed);
        while (size < target) {
            size_t next = doubling ? size * 2 : page_round(size + size / 8);
            if (next > target)
                next = target;
            p = xrealloc(p, next);
            buffer_check_marks(w, p, size, seed);
            buffer_fill(p, size, next, seed);
            size = next;
        }
        w->sum = mix(w->sum, buffer_check(w, p, size, seed));
        if (r + 1 == rounds)
            worker_hold(w);
        free(p);
    }
}

/* ---- Scenarios and main ---- */

struct scenario {
    const char *name;
    void (*run)(struct worker *w, long rounds);
    long rounds;               /* at scale 1 */
    bool pairs;                /* -threads N runs max(1, N/2) producer-consumer pairs */
};

static const struct scenario scenarios[] = {
    {"objects", scenario_objects, 250, false},
    {"strings", scenario_strings, 100, false},
    {"arrays", scenario_arrays, 100, false},
    {"maps", scenario_maps, 35, false},
    {"pack", scenario_pack, 130, false},
    {"json", scenario_json, 200, false},
    {"closures", scenario_closures, 100, false},
    {"mixed", scenario_mixed, 15, false},
    {"pipeline", scenario_pipeline, 60, true},
    {"threads", scenario_threads, 50, false},
    {"buffers", scenario_buffers, 20, false},
};
#define SCENARIO_COUNT (sizeof scenarios / sizeof scenarios[0])

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    barrier_wait(&start_line);
    w->run(w, w->rounds);
    count_thread_calls();
    return NULL;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* VmRSS and VmHWM of /proc/self/status, in KB (read without allocating). */
static void read_memory(long *rss_kb, long *peak_kb)
{
    char text[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0)
        fail("/proc/self/status", errno);
    ssize_t n = read(fd, text, sizeof text - 1);
    int err = errno;
    close(fd);
    if (n <= 0)
        fail("/proc/self/status", n < 0 ? err : EIO);
    text[n] = '\0';
    const char *rss = strstr(text, "VmRSS:"), *peak = strstr(text, "VmHWM:");
    if (rss == NULL || peak == NULL)
        fail("/proc/self/status: no VmRSS or VmHWM", EINVAL);
    *rss_kb = strtol(rss + 6, NULL, 10);
    *peak_kb = strtol(peak + 6, NULL, 10);
}

static void usage(FILE *to)
{
    fprintf(to, "usage: app <scenario> [-threads N] [-scale F]\n       app -list\nscenarios:");
    OPTION_LIST(to, scenarios);
}

int main(int argc, char **argv)
{
    const char *name = NULL;
    long threads = 1;
    double scale = 1.0;
    for (int a = 1; a < argc; a++) {
        const char *value;
        if (strcmp(argv[a], "-list") == 0 && argc == 2) {
            for (size_t k = 0; k < SCENARIO_COUNT; k++)
                printf("%s\n", scenarios[k].name);
            return 0;
        } else if ((value = option_value(argc, argv, &a, "-threads")) != NULL) {
            threads = option_count("-threads", value, 1, MAX_THREADS);
        } else if ((value = option_value(argc, argv, &a, "-scale")) != NULL) {
            scale = option_positive("-scale", value);
        } else {
            int status = option_other(argv[a], &name, usage);
            if (status >= 0)
                return status;
        }
    }
    const struct scenario *s = OPTION_NEED(scenarios, name, "scenario", usage);

    int running = s->pairs ? 2 * (threads / 2 > 1 ? (int)threads / 2 : 1) : (int)threads;
    double rounds = (double)s->rounds * scale + 0.5; /* rounded; at least 1, at most what a long counts */
    if (rounds > (double)(LONG_MAX / PIPE_MESSAGES))
        rounds = (double)(LONG_MAX / PIPE_MESSAGES);
    uint64_t name_seed = hash_bytes(HASH_START, (const unsigned char *)s->name, strlen(s->name));
    struct worker_slot *workers = aligned_alloc(alignof(struct worker_slot), (size_t)running * sizeof *workers);
    if (workers == NULL)
        out_of_memory((size_t)running * sizeof *workers);
    memset(workers, 0, (size_t)running * sizeof *workers);
    for (int i = 0; i < running; i++) {
        struct worker *w = &workers[i].w;
        w->name = s->name;
        w->index = i;
        w->run = s->run;
        w->rounds = rounds >= 1 ? (long)rounds : 1;
        w->hold = HOLD_AT_BARRIER;
        rng_seed(&w->rng, name_seed ^ splitmix64((uint64_t)i));
        if (s->pairs) {
            w->pipe = &pipes[i / 2];
            w->pair_seed = splitmix64(name_seed + (uint64_t)(i / 2));
            w->consumer = i % 2 == 1;
        }
    }

    pthread_barrier_t *barriers[] = {&start_line, &meeting, &release};
    for (size_t b = 0; b < 3; b++) {
        int err = pthread_barrier_init(barriers[b], NULL, (unsigned)running + 1);
        if (err != 0)
            fail("pthread_barrier_init", err);
    }
    for (int i = 0; i < running; i++) {
        int err = pthread_create(&workers[i].w.thread, NULL, worker_main, &workers[i].w);
        if (err != 0)
            fail("pthread_create", err);
    }
    barrier_wait(&start_line);
    uint64_t t0 = now_ns();
    barrier_wait(&meeting);
    uint64_t t1 = now_ns();
    long rss_kb, peak_kb;
    read_memory(&rss_kb, &peak_kb);
    barrier_wait(&release);
    uint64_t checksum = HASH_START;
    for (int i = 0; i < running; i++) {
        int err = pthread_join(workers[i].w.thread, NULL);
        if (err != 0)
            fail("pthread_join", err);
        checksum = mix(checksum, workers[i].w.sum);
    }
    free(workers);

    printf("%s threads=%ld ms=%.1f rss_kb=%ld peak_kb=%ld checksum=%016" PRIx64 " ops=%lu", s->name, threads,
           (double)(t1 - t0) / 1e6, rss_kb, peak_kb, checksum, atomic_load(&total_alloc_calls));
    /* Linked with shardmm: its own counters (atomic operations and locks are counted only in the
     * SHARD_COUNTERS build, build/counters/libshardmm.so). Found by name, so the source stays the same for
     * every allocator. */
    void (*get_stats)(shard_stats *) = (void (*)(shard_stats *))dlsym(RTLD_DEFAULT, "shard_get_stats");
    if (get_stats != NULL) {
        shard_stats st;
        get_stats(&st);
        printf(" os_calls=%zu atomic_ops=%zu lock_acquisitions=%zu committed_peak_kb=%zu", st.os_calls,
               st.atomic_ops, st.lock_acquisitions, st.committed_peak / 1024);
    }
    printf("\n");
    return 0;
}
