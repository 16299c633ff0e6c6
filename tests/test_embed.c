/* test_embed.c - shardmm embedded in a program, through the shard_* API only, beside the C library's
 * own malloc. The same source is built twice (build.ninja): build/test-embed-static links
 * build/libshardmm.a, build/test-embed-single compiles the single-file build (src/shardmm.c) with the
 * NASM fast paths (build/release/fast.o), as the README tells an embedder to.
 *
 * What it checks:
 * - every kind of block in one thread (small, medium, large; aligned ones; the malloc family under the
 *   shard_ prefix): contents kept across realloc, usable sizes, alignment, zeroed calloc, and the live
 *   counts of shard_get_stats moving by exactly the blocks allocated and freed;
 * - threads that hand blocks of every kind around a ring: each block checked, resized or freed by a
 *   thread other than the one that made it; shard_check() == 0 in every thread; after shard_collect the
 *   live counts are back where they were and the large-block cache is empty;
 * - shard_thread_done, and allocation again after it;
 * - the C library's malloc stays separate: its blocks are not ours (the error hook is called for them,
 *   and the allocator keeps working), and ours are not touched by it.
 *
 * Build: see build.ninja. Run: build/test-embed-static [test names], build/test-embed-single [...]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SMALL_MAX (16 * KB)
#define MEDIUM_MAX MB

static uint64_t next_random(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return harness_mix64(*state);
}

static shard_stats stats_now(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s;
}

/* ---- one thread ---- */

TEST(blocks_of_every_kind_keep_their_contents)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 100, 1000, 4096, SMALL_MAX, SMALL_MAX + 1, 100 * KB,
                                   MEDIUM_MAX, MEDIUM_MAX + 1, 3 * MB + 5};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *p[N];
    for (unsigned i = 0; i < N; i++) {
        p[i] = shard_malloc(sizes[i]);
        CHECKF(p[i] != NULL, "shard_malloc(%zu)", sizes[i]);
        if (p[i] == NULL)
            return;
        CHECKF(((uintptr_t)p[i] & 15) == 0, "shard_malloc(%zu) is not 16-byte aligned", sizes[i]);
        CHECKF(shard_usable_size(p[i]) >= sizes[i], "usable size %zu of a block of %zu", shard_usable_size(p[i]), sizes[i]);
        fill(p[i], sizes[i], i);
    }
    /* Each block grows across its kind's boundary and shrinks back: the common bytes stay. */
    for (unsigned i = 0; i < N; i++) {
        size_t grown = sizes[i] * 3 + 20000;
        unsigned char *q = shard_realloc(p[i], grown);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu)", sizes[i], grown);
        if (q == NULL)
            continue;
        CHECK_PATTERN(q, sizes[i], i, "a block grown by shard_realloc");
        fill_range(q, sizes[i], grown, i);
        size_t shrunk = sizes[i] / 2 + 1;
        p[i] = shard_realloc(q, shrunk);
        CHECKF(p[i] != NULL, "shard_realloc(%zu -> %zu)", grown, shrunk);
        if (p[i] == NULL)
            continue;
        CHECK_PATTERN(p[i], shrunk, i, "a block shrunk by shard_realloc");
    }
    for (unsigned i = 0; i < N; i++)
        shard_free(p[i]);
    CHECK_EQ(shard_check(), 0);
}

TEST(aligned_blocks_and_the_malloc_family)
{
    for (size_t align = 1; align <= SHARD_ALIGN_MAX; align *= 4) {
        size_t size = align * 3 + 7;
        unsigned char *p = shard_malloc_aligned(size, align);
        CHECKF(p != NULL && (uintptr_t)p % align == 0, "shard_malloc_aligned(%zu, %zu) = %p", size, align, (void *)p);
        if (p == NULL)
            continue;
        fill(p, size, align);
        unsigned char *q = shard_realloc_aligned(p, size * 2, align);
        CHECKF(q != NULL && (uintptr_t)q % align == 0, "shard_realloc_aligned(%zu, %zu) = %p", size * 2, align, (void *)q);
        if (q == NULL) {
            shard_free(p);
            continue;
        }
        CHECK_PATTERN(q, size, align, "an aligned block after shard_realloc_aligned");
        shard_free(q);
    }
    CHECK(shard_malloc_aligned(64, 3) == NULL); /* not a power of two */
    CHECK(shard_malloc_aligned(64, 0) == NULL);

    void *p = NULL;
    CHECK_EQ(shard_posix_memalign(&p, 4096, 10000), 0);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0);
    shard_free(p);
    p = (void *)1;
    CHECK_EQ(shard_posix_memalign(&p, 24, 100), 22); /* EINVAL; *out untouched */
    CHECK(p == (void *)1);
    p = shard_aligned_alloc(256, 1000);
    CHECK(p != NULL && (uintptr_t)p % 256 == 0);
    shard_free(p);
    p = shard_memalign(100, 50); /* rounded up to 128 */
    CHECK(p != NULL && (uintptr_t)p % 128 == 0);
    shard_free(p);
    p = shard_valloc(5000);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0);
    shard_free(p);
    p = shard_pvalloc(5000);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0 && shard_usable_size(p) >= 8192);
    shard_free(p);
    CHECK(shard_reallocarray(NULL, SIZE_MAX / 2, 3) == NULL); /* count * size overflows */
    unsigned *v = shard_reallocarray(NULL, 1000, sizeof *v);
    CHECK(v != NULL);
    if (v != NULL) {
        for (unsigned i = 0; i < 1000; i++)
            v[i] = i * 3;
        v = shard_reallocarray(v, 50000, sizeof *v);
        CHECK(v != NULL);
        if (v != NULL) {
            unsigned wrong = 0;
            for (unsigned i = 0; i < 1000; i++)
                wrong += v[i] != i * 3;
            CHECK_EQ(wrong, 0);
        }
        shard_free(v);
    }
    unsigned char *z = shard_calloc(300, 1000); /* medium */
    CHECK(z != NULL && bytes_not_equal(z, 300000, 0) == 300000);
    shard_free(z);
    CHECK(shard_calloc(SIZE_MAX / 8, 16) == NULL);
    CHECK_EQ(shard_check(), 0);
}

TEST(live_counts_follow_the_blocks)
{
    enum { SMALL = 50, MEDIUM = 7, LARGE = 3 };
    void *s[SMALL], *m[MEDIUM], *l[LARGE];
    shard_stats before = stats_now();
    for (unsigned i = 0; i < SMALL; i++)
        s[i] = shard_malloc(1 + i * 300);
    for (unsigned i = 0; i < MEDIUM; i++)
        m[i] = shard_malloc(SMALL_MAX + 1 + i * 100 * KB);
    for (unsigned i = 0; i < LARGE; i++)
        l[i] = shard_malloc(MEDIUM_MAX + 1 + i * MB);
    shard_stats during = stats_now();
    CHECK_EQ(during.live_small, before.live_small + SMALL);
    CHECK_EQ(during.live_medium, before.live_medium + MEDIUM);
    CHECK_EQ(during.live_large, before.live_large + LARGE);
    CHECK(during.committed >= LARGE * MB && during.reserved >= during.committed);
    CHECK(during.committed_peak >= during.committed);
    CHECK(during.heaps >= 1);
    for (unsigned i = 0; i < SMALL; i++)
        shard_free(s[i]);
    for (unsigned i = 0; i < MEDIUM; i++)
        shard_free(m[i]);
    for (unsigned i = 0; i < LARGE; i++)
        shard_free(l[i]);
    shard_stats after = stats_now();
    CHECK_EQ(after.live_small, before.live_small);
    CHECK_EQ(after.live_medium, before.live_medium);
    CHECK_EQ(after.live_large, before.live_large);
    CHECK(after.large_cached >= 1); /* freed large blocks wait in the cache */
    shard_collect();
    after = stats_now();
    CHECK_EQ(after.large_cached, 0);
    CHECK_EQ(after.large_cached_bytes, 0);
    CHECK_EQ(shard_check(), 0);
}

/* ---- threads ---- */

#define RING_THREADS 4
#define INBOX 64
#define ROUNDS 4000

typedef struct {
    unsigned char *ptr;
    size_t size;
    uint64_t seed;
    unsigned hops; /* threads it went through */
} parcel;

typedef struct {
    mutex_t lock;
    parcel items[INBOX];
    unsigned count;
} inbox;

static inbox inboxes[RING_THREADS];
static unsigned senders_done;
static unsigned ring_problems;

static void ring_problem(const char *what, size_t size)
{
    if (__atomic_add_fetch(&ring_problems, 1, __ATOMIC_RELAXED) <= 10)
        fprintf(stderr, "  ring: %s (a block of %zu bytes)\n", what, size);
}

static int send_to(unsigned t, parcel p)
{
    inbox *b = &inboxes[t % RING_THREADS];
    int sent = 0;
    mutex_lock(&b->lock);
    if (b->count < INBOX) {
        b->items[b->count++] = p;
        sent = 1;
    }
    mutex_unlock(&b->lock);
    return sent;
}

static int receive(unsigned t, parcel *out)
{
    inbox *b = &inboxes[t];
    int got = 0;
    mutex_lock(&b->lock);
    if (b->count > 0) {
        *out = b->items[--b->count];
        got = 1;
    }
    mutex_unlock(&b->lock);
    return got;
}

/* A new block of some kind and size (never 0), filled with its pattern. */
static parcel make_parcel(uint64_t *rng, unsigned t, unsigned serial)
{
    parcel p = {NULL, 0, ((uint64_t)t << 32) + serial, 0};
    uint64_t kind = next_random(rng) % 100;
    if (kind < 60)
        p.size = 1 + next_random(rng) % 512;
    else if (kind < 85)
        p.size = 1 + next_random(rng) % SMALL_MAX;
    else if (kind < 97)
        p.size = SMALL_MAX + 1 + next_random(rng) % (MEDIUM_MAX - SMALL_MAX);
    else
        p.size = MEDIUM_MAX + 1 + next_random(rng) % (2 * MB);
    switch (next_random(rng) % 6) {
    case 0:
        p.ptr = shard_calloc(1, p.size);
        if (p.ptr != NULL && bytes_not_equal(p.ptr, p.size, 0) != p.size)
            ring_problem("shard_calloc gave a block that is not zeroed", p.size);
        break;
    case 1:
        p.ptr = shard_malloc_aligned(p.size, (size_t)64 << (next_random(rng) % 8));
        break;
    default:
        p.ptr = shard_malloc(p.size);
    }
    if (p.ptr == NULL)
        ring_problem("no block", p.size);
    else
        fill_range(p.ptr, 0, p.size, p.seed);
    return p;
}

/* A parcel that arrived: checked, then freed, resized and sent on, or kept for a while. */
static void handle(uint64_t *rng, unsigned t, parcel p, parcel *kept, unsigned *kept_count)
{
    if (!holds_pattern(p.ptr, p.size, p.seed))
        ring_problem("a block handed between threads lost its pattern", p.size);
    if (shard_usable_size(p.ptr) < p.size)
        ring_problem("a usable size below the size", p.size);
    uint64_t what = next_random(rng) % 8;
    if (what < 2 && p.hops < 6) {
        size_t to = 1 + next_random(rng) % (p.size * 2 + 64);
        unsigned char *q = shard_realloc(p.ptr, to);
        if (q == NULL) {
            ring_problem("shard_realloc failed", to);
            shard_free(p.ptr);
            return;
        }
        if (!holds_pattern(q, p.size < to ? p.size : to, p.seed))
            ring_problem("shard_realloc of a block from another thread lost its contents", p.size);
        if (to > p.size)
            fill_range(q, p.size, to, p.seed);
        p.ptr = q;
        p.size = to;
        p.hops++;
        if (!send_to(t + 1, p))
            shard_free(p.ptr);
    } else if (what < 3 && *kept_count < 32) {
        kept[(*kept_count)++] = p;
    } else {
        shard_free(p.ptr);
    }
}

static void *ring_thread(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg;
    uint64_t rng = 7000 + t;
    parcel kept[32], p;
    unsigned kept_count = 0;
    for (unsigned i = 0; i < ROUNDS; i++) {
        p = make_parcel(&rng, t, i);
        if (p.ptr != NULL && !send_to(t + 1 + (unsigned)(next_random(&rng) % (RING_THREADS - 1)), p))
            shard_free(p.ptr);
        while (receive(t, &p))
            handle(&rng, t, p, kept, &kept_count);
        if (kept_count == 32 || (kept_count > 0 && i % 50 == 0)) { /* the oldest kept ones go */
            for (unsigned k = 0; k < kept_count / 2; k++) {
                if (!holds_pattern(kept[k].ptr, kept[k].size, kept[k].seed))
                    ring_problem("a kept block lost its pattern", kept[k].size);
                shard_free(kept[k].ptr);
            }
            memmove(kept, kept + kept_count / 2, (kept_count - kept_count / 2) * sizeof kept[0]);
            kept_count -= kept_count / 2;
        }
    }
    /* Everyone stops sending, then every inbox is emptied by its own thread. */
    __atomic_add_fetch(&senders_done, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&senders_done, __ATOMIC_ACQUIRE) < RING_THREADS) {
        while (receive(t, &p)) {
            CHECK(holds_pattern(p.ptr, p.size, p.seed));
            shard_free(p.ptr);
        }
        sleep_ms(1);
    }
    while (receive(t, &p)) {
        CHECK(holds_pattern(p.ptr, p.size, p.seed));
        shard_free(p.ptr);
    }
    for (unsigned k = 0; k < kept_count; k++) {
        CHECK(holds_pattern(kept[k].ptr, kept[k].size, kept[k].seed));
        shard_free(kept[k].ptr);
    }
    CHECK_EQ(shard_check(), 0);
    if (t == 0) { /* as a runtime's own thread would end: its heap goes back now */
        shard_thread_done();
        void *again = shard_malloc(100); /* takes a heap again */
        CHECK(again != NULL);
        shard_free(again);
        CHECK_EQ(shard_check(), 0);
    }
    return NULL;
}

TEST(blocks_handed_between_threads)
{
    shard_stats before = stats_now();
    thread_t threads[RING_THREADS];
    unsigned started = 0;
    for (unsigned i = 0; i < RING_THREADS; i++) {
        static const mutex_t init = MUTEX_INIT;
        inboxes[i].lock = init;
        inboxes[i].count = 0;
    }
    senders_done = 0;
    ring_problems = 0;
    for (unsigned t = 0; t < RING_THREADS; t++)
        started += thread_start(&threads[started], ring_thread, (void *)(uintptr_t)t) == 0;
    CHECK_EQ(started, RING_THREADS);
    if (started != RING_THREADS)
        __atomic_store_n(&senders_done, RING_THREADS, __ATOMIC_RELEASE); /* the others do not wait */
    for (unsigned i = 0; i < started; i++)
        thread_join(threads[i]);
    CHECKF(ring_problems == 0, "%u problems in the ring (messages above)", ring_problems);
    shard_collect(); /* takes in the frees into the exited threads' heaps */
    shard_stats after = stats_now();
    CHECK_EQ(after.live_small, before.live_small);
    CHECK_EQ(after.live_medium, before.live_medium);
    CHECK_EQ(after.live_large, before.live_large);
    CHECK_EQ(after.large_cached, 0);
    CHECK(after.heaps >= before.heaps + 1 && after.heaps_free >= 1);
    CHECK_EQ(shard_check(), 0);
}

/* ---- beside the C library's malloc ---- */

static int hook_calls, hook_error;
static void *hook_ptr;

static void record_error(void *arg, int error, void *ptr)
{
    (void)arg;
    hook_calls++;
    hook_error = error;
    hook_ptr = ptr;
}

TEST(the_c_library_malloc_stays_separate)
{
    unsigned char *theirs = malloc(1000), *ours = shard_malloc(1000);
    CHECK(theirs != NULL && ours != NULL);
    if (theirs == NULL || ours == NULL)
        return;
    fill(theirs, 1000, 1);
    fill(ours, 1000, 2);
    shard_error_fn previous = shard_set_error_hook(record_error, NULL);
    shard_free(theirs); /* not ours: the hook, and nothing else */
    CHECK_EQ(hook_calls, 1);
    CHECK_EQ(hook_error, SHARD_ERROR_INVALID_FREE);
    CHECK(hook_ptr == theirs);
    CHECK(shard_realloc(theirs, 2000) == NULL);
    CHECK_EQ(hook_error, SHARD_ERROR_INVALID_REALLOC);
    CHECK_EQ(shard_usable_size(theirs), 0);
    CHECK_EQ(hook_error, SHARD_ERROR_INVALID_SIZE_QUERY);
    CHECK_EQ(hook_calls, 3);
    shard_free(ours + 16); /* inside one of ours */
    CHECK_EQ(hook_calls, 4);
    CHECK(shard_set_error_hook(previous, NULL) == record_error);
    CHECK_PATTERN(theirs, 1000, 1, "the C library's block");
    CHECK_PATTERN(ours, 1000, 2, "our block");
    unsigned char *q = realloc(theirs, 100000); /* the C library's realloc still owns its block */
    CHECK(q != NULL);
    if (q != NULL)
        CHECK_PATTERN(q, 1000, 1, "the C library's block after its realloc");
    free(q);
    shard_free(ours);
    CHECK_EQ(shard_check(), 0);
}
