/* test_hardened.c - the hardened build (SHARD_HARDENED, src/small.h): one test per class of bug a
 * program makes, each planted and then checked to reach the error hook with the right kind and block,
 * to change nothing it must not (no block handed out twice, nothing outside our pages handed out), and
 * to leave the allocator working (blocks of the same class allocated, filled and checked afterwards).
 *
 * Built on the hardened library (Linux) and DLL (Windows). Run on the default build most of these fail:
 * it sees neither a second free of a small block nor a damaged free list (bench/results has the table).
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdint.h>
#include <string.h>

#include "shardmm.h"

/* What the hook saw: every call, in order. */
#define MAX_REPORTS 16
static struct {
    int count;
    int error[MAX_REPORTS];
    void *ptr[MAX_REPORTS];
} seen;

static void recording_hook(void *arg, int error, void *ptr)
{
    (void)arg;
    int i = __atomic_fetch_add(&seen.count, 1, __ATOMIC_SEQ_CST);
    if (i < MAX_REPORTS) {
        seen.error[i] = error;
        seen.ptr[i] = ptr;
    }
}

static shard_error_fn previous_hook;
static void watch(void)
{
    memset(&seen, 0, sizeof seen);
    previous_hook = shard_set_error_hook(recording_hook, NULL);
}
static void unwatch(void) { shard_set_error_hook(previous_hook, NULL); }

/* Exactly one report, of this kind and block. */
#define CHECK_ONE_REPORT(kind, block)                                                                   \
    do {                                                                                                \
        CHECKF(seen.count == 1, "%d reports, expected 1", seen.count);                                  \
        CHECKF(seen.count >= 1 && seen.error[0] == (kind), "kind %d, expected %d", seen.error[0], kind); \
        CHECKF(seen.count >= 1 && seen.ptr[0] == (void *)(block), "block %p, expected %p", seen.ptr[0],  \
               (void *)(block));                                                                        \
    } while (0)

/* The allocator goes on: n blocks of `size` all distinct, none of them one of `avoid` (live blocks the
 * test holds) nor `forbidden`, each filled and checked, then freed; no further report. */
static void still_works(size_t size, void *const *avoid, int navoid, const void *forbidden)
{
    enum { N = 600 };
    static void *p[N];
    int reports = seen.count;
    for (int i = 0; i < N; i++) {
        p[i] = shard_malloc(size);
        CHECK(p[i] != NULL);
        if (p[i] == NULL)
            return;
        CHECKF(p[i] != forbidden, "block %d is the forbidden address %p", i, forbidden);
        for (int k = 0; k < navoid; k++)
            CHECKF(p[i] != avoid[k], "block %d is %p, a block the test still holds", i, p[i]);
        fill(p[i], size, (uint32_t)i);
    }
    for (int i = 0; i < N; i++)
        CHECK_PATTERN(p[i], size, (uint32_t)i, "a block allocated after the bug");
    for (int i = 0; i < N; i++)
        shard_free(p[i]);
    CHECKF(seen.count == reports, "%d more reports while the allocator went on", seen.count - reports);
}

/* Two blocks of a class, the second right after the first in memory (a fresh page carves in address
 * order); *a and *b, or 0 if none turned up. The other blocks taken meanwhile are freed again. */
static int adjacent_pair(size_t size, char **a, char **b)
{
    void *held[256];
    int n = 0, found = 0;
    char *last = shard_malloc(size);
    while (!found && n < 255 && last != NULL) {
        char *next = shard_malloc(size);
        if (next == last + shard_usable_size(last)) {
            *a = last, *b = next, found = 1;
        } else {
            held[n++] = last;
            last = next;
        }
    }
    while (n > 0)
        shard_free(held[--n]);
    return found;
}

TEST(small_double_free_with_live_neighbours)
{
    char *a = shard_malloc(48), *b = shard_malloc(48), *c = shard_malloc(48);
    fill(a, 48, 1), fill(c, 48, 3);
    watch();
    shard_free(b);
    CHECK(seen.count == 0);
    shard_free(b);
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, b);
    void *live[] = {a, c};
    still_works(48, live, 2, NULL);
    CHECK_PATTERN(a, 48, 1, "a neighbour");
    CHECK_PATTERN(c, 48, 3, "a neighbour");
    unwatch();
    shard_free(a);
    shard_free(c);
}

TEST(double_free_of_the_only_block_of_a_page)
{
    shard_heap *h = shard_heap_create(NULL); /* a fresh heap: one block out of its page */
    CHECK(h != NULL);
    if (h == NULL)
        return;
    void *p = shard_heap_malloc(h, 2000);
    watch();
    shard_heap_free(h, p);
    shard_heap_free(h, p);
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, p);
    unwatch();
    shard_heap_destroy(h);
}

TEST(a_b_a_double_free)
{
    void *a = shard_malloc(96), *b = shard_malloc(96), *keep = shard_malloc(96);
    watch();
    shard_free(a);
    shard_free(b);
    shard_free(a); /* a is not the head of the list: b is */
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, a);
    /* Had a gone onto the list twice, two of the next allocations would be a. */
    void *live[] = {keep};
    still_works(96, live, 1, NULL);
    unwatch();
    shard_free(keep);
}

typedef struct {
    void *p;
} handoff;
static void *free_there(void *arg)
{
    shard_free(((handoff *)arg)->p);
    return NULL;
}

TEST(double_free_from_a_second_thread)
{
    /* Freed here, then again by another thread (the foreign path). */
    void *p = shard_malloc(64), *keep = shard_malloc(64);
    handoff h = {p};
    watch();
    shard_free(p);
    run_thread(free_there, &h);
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, p);
    void *live[] = {keep};
    still_works(64, live, 1, NULL);
    /* Freed by another thread (into the page's thread-free list), then again here, the owner. */
    void *q = shard_malloc(64);
    h.p = q;
    seen.count = 0;
    run_thread(free_there, &h);
    shard_free(q);
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, q);
    /* Twice from other threads. */
    void *r = shard_malloc(64);
    h.p = r;
    seen.count = 0;
    run_thread(free_there, &h);
    run_thread(free_there, &h);
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, r);
    still_works(64, live, 1, NULL);
    unwatch();
    shard_free(keep);
}

static char static_object[256];

TEST(a_link_redirected_to_a_static_object_is_never_handed_out)
{
    void *p = shard_malloc(128), *keep = shard_malloc(128);
    watch();
    shard_free(p);
    *(void **)p = static_object; /* a write after free: the link now names an object of the program */
    void *again = shard_malloc(128); /* takes p, whose link does not decode to an item of its page */
    CHECK_ONE_REPORT(SHARD_ERROR_FREE_LIST, p);
    CHECK(again == p);
    void *live[] = {keep, again};
    still_works(128, live, 2, static_object);
    unwatch();
    shard_free(again);
    shard_free(keep);
}

TEST(a_garbage_link_is_reported_and_cut)
{
    void *p = shard_malloc(224), *q = shard_malloc(224);
    watch();
    shard_free(q);
    shard_free(p); /* p, then q, on the list */
    memset(p, 0x41, 16);
    void *again = shard_malloc(224);
    CHECK_ONE_REPORT(SHARD_ERROR_FREE_LIST, p);
    CHECK(again == p);
    void *live[] = {again};
    still_works(224, live, 1, (void *)(uintptr_t)0x4141414141414141ull);
    unwatch();
    shard_free(again);
}

TEST(an_overflow_of_16_bytes_is_found_when_the_block_is_freed)
{
    char *a, *b;
    int found = adjacent_pair(160, &a, &b);
    CHECK(found);
    if (!found)
        return;
    size_t size = shard_usable_size(a);
    watch();
    shard_free(b);           /* b heads the list */
    memset(a, 0x5a, size + 16); /* 16 bytes past a's end: b's link and the word after it */
    shard_free(a);
    CHECK_ONE_REPORT(SHARD_ERROR_OVERFLOW, a);
    still_works(160, NULL, 0, NULL);
    unwatch();
}

TEST(an_overflow_into_a_free_block_is_found_in_a_created_heap_too)
{
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    char *a = shard_heap_malloc(h, 1040); /* a fresh page: the next item heads the free list */
    size_t size = shard_usable_size(a);
    watch();
    memset(a, 0x33, size + 16);
    shard_heap_free(h, a);
    CHECK_ONE_REPORT(SHARD_ERROR_OVERFLOW, a);
    void *more[100];
    for (int i = 0; i < 100; i++) {
        more[i] = shard_heap_malloc(h, 1040);
        CHECK(more[i] != NULL);
        fill(more[i], 1040, (uint32_t)i);
    }
    for (int i = 0; i < 100; i++)
        CHECK_PATTERN(more[i], 1040, (uint32_t)i, "a block after the overflow");
    CHECK(seen.count == 1);
    unwatch();
    shard_heap_destroy(h);
}

TEST(realloc_of_a_freed_block_is_reported_and_returns_null)
{
    void *p = shard_malloc(40), *keep = shard_malloc(40);
    watch();
    shard_free(p);
    CHECK(shard_realloc(p, 40) == NULL); /* in place, had p been live */
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, p);
    seen.count = 0;
    CHECK(shard_realloc(p, 5000) == NULL); /* a move, had p been live */
    CHECK_ONE_REPORT(SHARD_ERROR_DOUBLE_FREE, p);
    seen.count = 0;
    CHECK(shard_usable_size(p) == 0);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_SIZE_QUERY, p);
    void *live[] = {keep};
    still_works(40, live, 1, NULL);
    unwatch();
    shard_free(keep);
}

TEST(an_interior_pointer_is_reported)
{
    char *p = shard_malloc(64);
    watch();
    shard_free(p + 8);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, p + 8);
    fill(p, 64, 9);
    still_works(64, (void **)&p, 1, NULL);
    CHECK_PATTERN(p, 64, 9, "the block freed through an interior pointer");
    unwatch();
    shard_free(p);
}

TEST(a_pointer_16_bytes_before_a_medium_block_is_reported)
{
    char *p = shard_malloc(100000);
    fill(p, 100000, 5);
    watch();
    shard_free(p - 16);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, p - 16);
    CHECK_PATTERN(p, 100000, 5, "the medium block");
    CHECK(shard_usable_size(p) >= 100000);
    unwatch();
    shard_free(p);
}

TEST(a_damaged_medium_header_is_reported_and_the_block_kept)
{
    char *p = shard_malloc(50000);
    uint64_t saved;
    memcpy(&saved, p - 8, 8);
    watch();
    memset(p - 8, 0, 8); /* an underflow: the chunk's check word */
    shard_free(p);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, p);
    memcpy(p - 8, &saved, 8);
    unwatch();
    shard_free(p); /* repaired: an ordinary free */
}

TEST(a_damaged_large_header_is_reported)
{
    char *p = shard_malloc(3 << 20);
    /* The header starts the block's 4 MB granule (the block itself starts at one of 64 cache lines after
     * it: its colour). */
    char *header = (char *)((uintptr_t)p & ~(uintptr_t)((4u << 20) - 1));
    uint64_t saved;
    memcpy(&saved, header, 8);
    watch();
    memset(header, 0x7f, 8);
    shard_free(p);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, p);
    memcpy(header, &saved, 8);
    unwatch();
    shard_free(p);
}

TEST(double_frees_of_medium_and_large_blocks_are_reported)
{
    void *m = shard_malloc(70000), *l = shard_malloc(2 << 20);
    watch();
    shard_free(m);
    shard_free(m);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, m);
    seen.count = 0;
    shard_free(l);
    shard_free(l);
    CHECK_ONE_REPORT(SHARD_ERROR_INVALID_FREE, l);
    unwatch();
}

/* Two blocks freed by another thread wait in their page's thread-free list, head first; a write after
 * free then garbles the head's link. shard_check walks that list: it must report the damage, not follow
 * the garbage (a fault). The owner's next allocations of the class then find it too, and go on. */
typedef struct {
    void *a, *b;
} handoff_two;
static void *free_two_there(void *arg)
{
    shard_free(((handoff_two *)arg)->a);
    shard_free(((handoff_two *)arg)->b);
    return NULL;
}

TEST(check_does_not_follow_a_damaged_thread_free_link)
{
    enum { SIZE = 352 };
    void *a = shard_malloc(SIZE), *b = shard_malloc(SIZE), *keep = shard_malloc(SIZE);
    handoff_two two = {a, b};
    run_thread(free_two_there, &two); /* thread-free list: b, then a */
    int before = shard_check();       /* earlier tests' cut lists count */
    memset(b, 0x41, 16);              /* a write after free into the list's head */
    CHECK(shard_check() > before);
    watch();
    void *got[4000];
    int n = 0;
    while (n < 4000 && seen.count == 0) {
        got[n] = shard_malloc(SIZE);
        CHECK(got[n] != NULL);
        CHECK(got[n] != (void *)(uintptr_t)0x4141414141414141ull);
        n++;
    }
    CHECK_ONE_REPORT(SHARD_ERROR_FREE_LIST, b);
    while (n > 0)
        shard_free(got[--n]);
    void *live[] = {keep};
    still_works(SIZE, live, 1, (void *)(uintptr_t)0x4141414141414141ull);
    unwatch();
    shard_free(keep);
}

/* What a free list must never do under any of the bugs above: hand out a block twice. Many frees and
 * double frees interleaved at random, from two threads; every live block keeps its pattern. */
typedef struct {
    uint32_t seed;
} chaos_arg;
static void *chaos(void *arg)
{
    enum { SLOTS = 512 };
    static __thread void *slot[SLOTS];
    static __thread uint32_t tag[SLOTS];
    uint32_t x = ((chaos_arg *)arg)->seed;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        unsigned k = x % SLOTS;
        size_t size = 16 + (x >> 20) % 512;
        if (slot[k] == NULL) {
            slot[k] = shard_malloc(size);
            tag[k] = x;
            fill(slot[k], 16, x);
        } else {
            CHECK_PATTERN(slot[k], 16, tag[k], "a live block");
            void *gone = slot[k];
            shard_free(gone);
            slot[k] = NULL;
            if ((x >> 8) % 16 == 0)
                shard_free(gone); /* a double free, at once */
        }
    }
    for (unsigned k = 0; k < SLOTS; k++)
        shard_free(slot[k]);
    return NULL;
}

TEST(random_double_frees_never_hand_a_block_out_twice)
{
    watch();
    chaos_arg a = {0x1234567u}, b = {0x89abcdeu};
    thread_t t;
    CHECK(thread_start(&t, chaos, &a) == 0);
    chaos(&b);
    thread_join(t);
    CHECKF(seen.count > 1000, "%d double frees reported", seen.count);
    /* A double free of the block whose free emptied its page may find the page retired: not an item. */
    for (int i = 0; i < seen.count && i < MAX_REPORTS; i++)
        CHECKF(seen.error[i] == SHARD_ERROR_DOUBLE_FREE || seen.error[i] == SHARD_ERROR_INVALID_FREE,
               "report %d: kind %d", i, seen.error[i]);
    unwatch();
}
