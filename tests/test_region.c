/* test_region.c - the region port (port/region.c, include/shardmm_region.h) in a program with a C
 * library, for what needs one: threads, a fake clock, and memory that faults where it is not committed.
 *
 * The region is a mapping with no access; the commit callback makes pages readable and writable
 * (mprotect) and the decommit callback takes them back (madvise, then no access), as a hypervisor that
 * maps pages on demand would: a block that reached into memory the allocator had not committed, or a
 * page used after its decommit, faults. The callbacks count what they committed, which must always be
 * the region's own map plus what the allocator counts (stats: committed). The commit callback refuses
 * on request: the Nth commit from now (once) or every commit from the Nth on, which drives every path
 * of the allocator to its out-of-memory result, deterministically, whatever the host's overcommit.
 *
 * Threads find their heaps through the embedder's slot function (a thread-local word here) and end
 * with shard_thread_done, as the region has no thread-exit hook. The clock is the test's own (tick),
 * so the delays run when the test says.
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <sys/mman.h>

#include "shardmm_region.h"

#define REGION_SIZE ((size_t)256 << 20)
#define MB ((size_t)1 << 20)

static unsigned char *region;
static size_t map_bytes; /* what the region's map committed at init */

static struct {
    long commits;           /* commit calls so far */
    long refuse_at;         /* refuse this commit call (once); 0: none */
    long refuse_from;       /* refuse every commit call from this one on; 0: none */
    long refused;           /* commit calls refused */
    int refuse_decommit;    /* refuse every decommit call while set */
    size_t committed;       /* bytes the callbacks hold committed */
} cb;
static mutex_t cb_lock = MUTEX_INIT; /* the region calls back under its own lock; this is for the readers */

static int commit_pages(void *addr, size_t size, void *arg)
{
    CHECK(arg == &cb);
    CHECK((unsigned char *)addr >= region && (unsigned char *)addr + size <= region + REGION_SIZE);
    CHECK(((uintptr_t)addr | size) % 4096 == 0);
    mutex_lock(&cb_lock);
    long n = ++cb.commits;
    int refuse = n == cb.refuse_at || (cb.refuse_from != 0 && n >= cb.refuse_from);
    if (refuse)
        cb.refused++;
    else if (mprotect(addr, size, PROT_READ | PROT_WRITE) != 0)
        refuse = 1;
    else
        cb.committed += size;
    mutex_unlock(&cb_lock);
    return refuse ? -1 : 0;
}

static int decommit_pages(void *addr, size_t size, void *arg)
{
    (void)arg;
    if (__atomic_load_n(&cb.refuse_decommit, __ATOMIC_RELAXED))
        return -1; /* the pages stay as they are, committed, with what they hold */
    if (madvise(addr, size, MADV_DONTNEED) != 0 || mprotect(addr, size, PROT_NONE) != 0)
        return -1;
    mutex_lock(&cb_lock);
    cb.committed -= size;
    mutex_unlock(&cb_lock);
    return 0;
}

static __thread void *slot_word;
static void **thread_slot(void) { return &slot_word; }

static uint64_t fake_ms = 1000;
static uint64_t tick(void) { return __atomic_load_n(&fake_ms, __ATOMIC_RELAXED); }
static void advance_ms(uint64_t ms) { __atomic_fetch_add(&fake_ms, ms, __ATOMIC_RELAXED); }

static shard_stats stats_now(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s;
}

static int inside(const void *p, size_t size)
{
    return (const unsigned char *)p >= region && (const unsigned char *)p + size <= region + REGION_SIZE;
}

/* The callbacks' count and the allocator's agree (the region's map aside). */
static void check_accounts(const char *when)
{
    mutex_lock(&cb_lock);
    size_t held = cb.committed;
    mutex_unlock(&cb_lock);
    shard_stats s = stats_now();
    CHECKF(held == map_bytes + s.committed, "%s: the callbacks hold %zu bytes, the map %zu and the allocator %zu", when,
           held, map_bytes, s.committed);
}

/* Everything given back: this thread's heap retired, the delays run out, all of it collected. What is
 * left is the allocator's metadata (heaps, map tables), which it never frees. */
static void give_everything_back(void)
{
    shard_thread_done();
    advance_ms(10000);
    shard_collect();
}

/* The region, with a 4 GB boundary 8 MB past its start: a segment there has the own-segment entry 0,
 * which no segment may take (src/heap.h), so its blocks take the slow paths (the next test). */
static unsigned char *region_across_4gb(void)
{
    size_t span = REGION_SIZE + ((size_t)4 << 30);
    unsigned char *m = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return m;
    uintptr_t boundary = ((uintptr_t)m + 8 * MB + ((uintptr_t)4 << 30) - 1) & ~(((uintptr_t)4 << 30) - 1);
    return (unsigned char *)(boundary - 8 * MB); /* the rest of the mapping stays reserved, unused */
}

TEST(init_takes_the_region_once_and_refuses_bad_ones)
{
    region = region_across_4gb();
    CHECK(region != MAP_FAILED);
    CHECK(shard_malloc(100) == NULL); /* before init: no memory at all */
    shard_region_options opt = {0};
    opt.commit = commit_pages;
    opt.decommit = decommit_pages;
    opt.arg = &cb;
    opt.slot = thread_slot;
    opt.tick = tick;
    opt.flags = SHARD_REGION_ZEROED;
    CHECK_EQ(shard_region_init(region + 4096, 200 << 10, &opt), -1); /* under 256 KB after alignment */
    CHECK_EQ(shard_region_init(region, REGION_SIZE, &opt), 0);
    CHECK_EQ(shard_region_init(region, REGION_SIZE, &opt), -1);
    map_bytes = cb.committed;
    CHECKF(map_bytes > 0 && map_bytes <= 64 << 10, "the map of 256 MB took %zu bytes", map_bytes);
    void *p = shard_malloc(100);
    CHECK(p != NULL && inside(p, 100));
    shard_free(p);
    check_accounts("after the first block");
}

/* A created heap's small blocks in the segment at the 4 GB boundary, which its own-segment table cannot
 * hold, and in the next one, which it holds: realloc keeps each in its class, the contents stay, and
 * free takes them back into the heap (none is left live). Allocated until both are reached. */
TEST(a_created_heaps_segment_at_a_4gb_boundary_keeps_blocks_in_their_class)
{
    enum { SIZE = 1000, MAX = 64 * 4096 };
    static unsigned char *p[MAX];
    give_everything_back(); /* the thread heap's segment too, which may lie there */
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    int n = 0, at_boundary = 0, past = 0;
    while (n < MAX && (at_boundary < 8 || past < 8)) {
        p[n] = shard_heap_malloc(h, SIZE);
        if (p[n] == NULL)
            break;
        fill(p[n], SIZE, (uint64_t)n);
        at_boundary += ((uint32_t)(uintptr_t)p[n] >> 22) == 0;
        past += ((uint32_t)(uintptr_t)p[n] >> 22) == 1;
        n++;
    }
    CHECKF(at_boundary >= 8 && past >= 8, "of %d blocks %d at the 4 GB boundary and %d in the next segment (region %p)",
           n, at_boundary, past, (void *)region);
    int moved = 0, failed = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            unsigned char *q = shard_heap_realloc(h, p[i], k == 0 ? SIZE + 16 : SIZE / 2);
            failed += q == NULL;
            moved += q != NULL && q != p[i];
            p[i] = q != NULL ? q : p[i];
        }
    CHECKF(failed == 0 && moved == 0, "of %d in-class reallocs %d failed and %d moved their block", 2 * n, failed,
           moved);
    for (int i = 0; i < n; i++) {
        CHECK_PATTERN(p[i], SIZE / 2, (uint64_t)i, "a block resized in its class");
        shard_heap_free(h, p[i]);
    }
    shard_heap_stats s;
    shard_heap_get_stats(h, &s);
    CHECKF(s.live_small == 0, "%zu small blocks live after all were freed", s.live_small);
    CHECK_EQ(shard_check(), 0);
    shard_heap_destroy(h);
    give_everything_back();
    check_accounts("after the heap at the boundary");
}

/* Blocks of every kind lie in the region and in committed memory (the rest of it faults); calloc's
 * memory reads zero also where it was used and decommitted before. */
TEST(every_block_lies_in_committed_memory_of_the_region)
{
    static const size_t sizes[] = {8, 100, 2048, 9000, 16384, 16400, 65536, 300000, MB, MB + 1, 3 * MB, 9 * MB};
    enum { N = sizeof sizes / sizeof *sizes };
    for (int round = 0; round < 3; round++) {
        void *p[N];
        for (int i = 0; i < N; i++) {
            p[i] = round == 1 ? shard_calloc(1, sizes[i]) : shard_malloc(sizes[i]);
            CHECKF(p[i] != NULL && inside(p[i], sizes[i]), "round %d: %zu bytes at %p", round, sizes[i], p[i]);
            if (p[i] == NULL)
                continue;
            if (round == 1)
                CHECKF(bytes_not_equal(p[i], sizes[i], 0) == sizes[i], "calloc(%zu) not zero", sizes[i]);
            fill(p[i], sizes[i], (uint64_t)(100 * round + i));
        }
        for (int i = 0; i < N; i++)
            if (p[i] != NULL) {
                CHECK_PATTERN(p[i], sizes[i], (uint64_t)(100 * round + i), "a block in the region");
                shard_free(p[i]);
            }
        give_everything_back(); /* the next round's memory is committed afresh */
        check_accounts("after a round of blocks");
    }
    CHECK_EQ(shard_check(), 0);
}

/* ---- out of memory at every point ---------------------------------------------------------------------- */

enum { SCRIPT_BLOCKS = 64 };
typedef struct script {
    void *p[SCRIPT_BLOCKS];
    size_t size[SCRIPT_BLOCKS];
    int nulls; /* operations that gave NULL */
} script;

static void keep(script *s, int i, void *p, size_t size, uint64_t seed)
{
    s->p[i] = p;
    s->size[i] = p != NULL ? size : 0;
    if (p != NULL) {
        CHECK(inside(p, size));
        fill(p, size, seed);
    } else {
        s->nulls++; /* no errno: the region port has no C library to tell */
    }
}

/* A fixed sequence of every kind of operation; each result is NULL or a block, which is filled. */
static void run_script(script *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    static const size_t sizes[] = {24, 5000, 16384, 20000, 300000, MB + 4096, 3 * MB, 200, 70000, 2 * MB};
    int n = 0;
    for (int i = 0; i < 10; i++, n++) {
        keep(s, n, shard_malloc(sizes[i]), sizes[i], seed + (uint64_t)n);
    }
    for (int i = 0; i < 20; i++, n++) { /* enough small blocks for a new page or two */
        keep(s, n, shard_malloc(3000), 3000, seed + (uint64_t)n);
    }
    keep(s, n, shard_calloc(10, 7000), 70000, seed + (uint64_t)n), n++;
    keep(s, n, shard_malloc_aligned(100000, (size_t)64 << 10), 100000, seed + (uint64_t)n), n++;
    keep(s, n, shard_malloc_aligned(MB, (size_t)4 << 20), MB, seed + (uint64_t)n), n++;
    /* Growth through every kind; a NULL leaves the block as it was. */
    void *g = shard_malloc(100);
    size_t gs = 100;
    keep(s, n, g, gs, seed + (uint64_t)n);
    for (size_t to = 1000; g != NULL && to <= 6 * MB; to *= 4) {
        void *q = shard_realloc(g, to);
        if (q == NULL) {
            s->nulls++;
            CHECK_PATTERN(g, gs, seed + (uint64_t)n, "a block whose realloc failed");
            break;
        }
        CHECK_PATTERN(q, gs, seed + (uint64_t)n, "a block after realloc");
        fill(q, to, seed + (uint64_t)n);
        g = q, gs = to;
    }
    s->p[n] = g, s->size[n] = g != NULL ? gs : 0, n++;
    CHECK(n <= SCRIPT_BLOCKS);
}

static void check_and_free(script *s, uint64_t seed)
{
    for (int i = 0; i < SCRIPT_BLOCKS; i++)
        if (s->p[i] != NULL) {
            CHECK_PATTERN(s->p[i], s->size[i], seed + (uint64_t)i, "a block of the script");
            shard_free(s->p[i]);
        }
}

/* Refuse the Nth commit of the script (once, or from then on) for every N the script reaches: each time
 * the operations give blocks or NULL with errno ENOMEM, the blocks hold their contents, nothing stays
 * behind when they are freed (committed and reserved memory as after a script without refusals), the
 * checker finds nothing wrong, and the next script without refusals succeeds whole. */
static void refuse_at_every_point(int from_then_on)
{
    static script s;
    shard_stats base, now;
    run_script(&s, 1);
    CHECK_EQ(s.nulls, 0);
    check_and_free(&s, 1);
    give_everything_back();
    base = stats_now();
    long rounds = 0, with_nulls = 0;
    for (long n = 1;; n++, rounds++) {
        mutex_lock(&cb_lock);
        long start = cb.commits, refused = cb.refused;
        if (from_then_on)
            cb.refuse_from = start + n;
        else
            cb.refuse_at = start + n;
        mutex_unlock(&cb_lock);
        run_script(&s, (uint64_t)n << 8);
        mutex_lock(&cb_lock);
        cb.refuse_at = cb.refuse_from = 0;
        int hit = cb.refused != refused;
        mutex_unlock(&cb_lock);
        with_nulls += s.nulls != 0;
        check_and_free(&s, (uint64_t)n << 8);
        CHECK_EQ(shard_check(), 0);
        give_everything_back();
        now = stats_now();
        CHECKF(now.committed == base.committed && now.reserved == base.reserved && now.live_small == 0 &&
                   now.live_medium == 0 && now.live_large == 0,
               "refusing commit %ld: committed %zu (%zu before), reserved %zu (%zu), live %zu/%zu/%zu", n,
               now.committed, base.committed, now.reserved, base.reserved, now.live_small, now.live_medium,
               now.live_large);
        check_accounts("after a script with a refused commit");
        if (!hit || harness_failures > 0)
            break; /* the script no longer reaches the Nth commit: every point was tried */
    }
    run_script(&s, 7);
    CHECK_EQ(s.nulls, 0);
    check_and_free(&s, 7);
    CHECKF(rounds >= 10 && with_nulls >= 1, "%ld points refused, %ld of them gave NULL", rounds, with_nulls);
    printf("  %ld commits refused in turn, %ld scripts saw NULL\n", rounds, with_nulls);
}

TEST(a_refused_commit_at_any_point_gives_null_or_a_retry_and_loses_nothing)
{
    refuse_at_every_point(0);
}

TEST(commits_refused_from_any_point_on_give_null_and_lose_nothing)
{
    refuse_at_every_point(1);
}

/* ---- threads, the clock, the limit --------------------------------------------------------------------- */

enum { THREADS = 4, ROUNDS = 3, PER_THREAD = 300 };
static void *handed[THREADS][PER_THREAD];

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    CHECK(slot_word == NULL);
    for (int i = 0; i < PER_THREAD; i++) {
        size_t size = 16 + (size_t)(i * 131 + t * 17) % 40000;
        handed[t][i] = shard_malloc(size);
        CHECK(handed[t][i] != NULL && inside(handed[t][i], size));
        if (handed[t][i] != NULL)
            fill(handed[t][i], 16, (uint64_t)(t * 1000 + i));
    }
    CHECK(slot_word != NULL); /* the heap is in the embedder's word */
    shard_thread_done();
    CHECK(slot_word == NULL);
    return NULL;
}

static void *freer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < PER_THREAD; i++) { /* the blocks of the thread before: frees into another heap */
        CHECK_PATTERN(handed[t][i], 16, (uint64_t)(t * 1000 + i), "a block handed over");
        shard_free(handed[t][i]);
    }
    shard_thread_done();
    return NULL;
}

/* Each thread finds its heap through the slot function; a thread that calls shard_thread_done hands its
 * heap on, so rounds of threads reuse the same heaps; blocks freed by other threads go back. */
TEST(threads_find_their_heaps_through_the_slot_function)
{
    size_t heaps_before = stats_now().heaps;
    for (int r = 0; r < ROUNDS; r++) {
        thread_t w[THREADS], f[THREADS];
        for (int t = 0; t < THREADS; t++)
            CHECK_EQ(thread_start(&w[t], worker, (void *)(intptr_t)t), 0);
        for (int t = 0; t < THREADS; t++)
            thread_join(w[t]);
        for (int t = 0; t < THREADS; t++)
            CHECK_EQ(thread_start(&f[t], freer, (void *)(intptr_t)t), 0);
        for (int t = 0; t < THREADS; t++)
            thread_join(f[t]);
    }
    shard_stats s = stats_now();
    CHECKF(s.heaps <= heaps_before + THREADS, "%zu heaps after %d rounds of %d threads (%zu before)", s.heaps,
           ROUNDS, THREADS, heaps_before);
    give_everything_back(); /* the frees queued at heaps that wait in the stack taken in */
    s = stats_now();
    CHECK_EQ(s.live_small + s.live_medium, 0);
    check_accounts("after the threads");
    CHECK_EQ(shard_check(), 0);
}

/* The end of a thread's use of its heap, which looks at the large-block cache's expiry. */
static void end_of_a_thread(void)
{
    shard_free(shard_malloc(64)); /* a heap to end */
    shard_thread_done();
}

/* The delays run on the embedder's clock: a freed large block stays cached until its second is up. */
TEST(the_large_block_cache_expires_on_the_embedders_clock)
{
    give_everything_back();
    void *p = shard_malloc(5 * MB);
    CHECK(p != NULL);
    shard_free(p);
    CHECK_EQ(stats_now().large_cached, 1);
    advance_ms(100);
    end_of_a_thread();
    CHECK_EQ(stats_now().large_cached, 1);
    advance_ms(2000);
    end_of_a_thread();
    CHECK_EQ(stats_now().large_cached, 0);
    check_accounts("after the cache expired");
}

/* shard_set_limit bounds the committed memory here as anywhere: NULL past it, everything as before. */
TEST(the_limit_bounds_the_region_too)
{
    give_everything_back();
    size_t committed = stats_now().committed;
    CHECK_EQ(shard_set_limit(committed + 16 * MB), SIZE_MAX);
    void *held[64];
    int n = 0;
    while (n < 64 && (held[n] = shard_malloc(3 * MB)) != NULL)
        fill(held[n], 3 * MB, (uint64_t)n), n++;
    CHECKF(n >= 3 && n <= 5, "%d blocks of 3 MB under a limit of 16 MB", n);
    CHECK(stats_now().committed <= committed + 16 * MB);
    CHECK_EQ(shard_set_limit(SIZE_MAX), committed + 16 * MB);
    void *more = shard_malloc(3 * MB);
    CHECK(more != NULL);
    shard_free(more);
    for (int i = 0; i < n; i++) {
        CHECK_PATTERN(held[i], 3 * MB, (uint64_t)i, "a block under the limit");
        shard_free(held[i]);
    }
    give_everything_back();
    check_accounts("after the limit");
}

/* A decommit the embedder refuses leaves its pages committed with what they held. When the block they
 * served goes back (its reservation released), a later reservation of the same addresses is taken for
 * fresh memory, which reads zero: calloc does not clear it, nor the core its new metadata. So the
 * region zeroes such pages when it lets their addresses go. */
TEST(pages_whose_decommit_was_refused_read_zero_when_reserved_again)
{
    give_everything_back();
    unsigned char *p = shard_malloc(5 * MB);
    CHECK(p != NULL && inside(p, 5 * MB));
    memset(p, 0xab, 5 * MB);
    __atomic_store_n(&cb.refuse_decommit, 1, __ATOMIC_RELAXED);
    shard_free(p);
    shard_collect(); /* the cache gives the block back: its reservation goes, its decommit refused */
    __atomic_store_n(&cb.refuse_decommit, 0, __ATOMIC_RELAXED);
    CHECK_EQ(stats_now().large_cached, 0);
    unsigned char *q = shard_calloc(1, 5 * MB);
    CHECK(q != NULL && inside(q, 5 * MB));
    CHECKF(q < p + 5 * MB && p < q + 5 * MB, "the new block %p does not overlap the old %p (first fit expected)",
           (void *)q, (void *)p);
    size_t nonzero = 0;
    for (size_t i = 0; i < 5 * MB; i++)
        nonzero += q[i] != 0;
    CHECKF(nonzero == 0, "calloc's block over pages whose decommit was refused: %zu bytes not zero", nonzero);
    shard_free(q);
    give_everything_back();
    check_accounts("after a refused decommit");
}
