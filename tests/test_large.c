/* test_large.c - deterministic tests of shardmm's large blocks (above 1 MB) and their cache.
 *
 * Fixed sizes in a fixed order, each test one documented behaviour: the size, address and usable size
 * of a fresh block, realloc in place within the reservation and moves beyond it, the decommit of a
 * shrunk tail, the process's cache of freed blocks (what it takes, which block a malloc gets, its
 * limits and its delay), calloc on dirty cached memory, the error hook, out of memory and blocks that
 * change threads. Every block is filled with the pattern of its own seed (64-bit words: the blocks are
 * megabytes) and checked after realloc, after a hand-over to another thread and before it is freed.
 *
 * The rules, as this file reads them (the large-block issue's rules, README.md, include/shardmm.h):
 * - n > 1 MB is large, n <= 1 MB small or medium. need(n) = round_up(n + 32, 4 KB) is what a fresh block
 *   needs (a 32-byte header included), at p with p % 4 MB == 32; its usable size is need(n) - 32.
 *   Its reservation, counted from the header, is R(n) = round_up(need + min(need, 1 GB), 64 KB) while the
 *   address space is unlimited (under RLIMIT_AS it is round_up(need, 64 KB): test_hostile.c). It
 *   commits F(need, R): need, but on Linux up to the next 2 MB boundary if R reaches it and need fills
 *   at least a quarter of that last 2 MB, so that it can be a transparent huge page; a block that fills less
 *   leaves it on small pages (fresh_end below; the Windows port commits need). A block that grows, and
 *   a cached one taken for more than it holds, commit to K(need, R): up to the boundary whenever R
 *   reaches it (commit_end below).
 * - realloc(p, m) of a large block with C committed: m <= 1 MB moves to a small or medium block;
 *   need(m) <= C stays, decommitting the tail exactly when need(m) < C / 2, down to T(need(m), C):
 *   on Linux the next 2 MB boundary from the header (C at most), so that the large page the block ends
 *   in stays whole, elsewhere need(m) (tail_start below);
 *   C < need(m) <= R stays and commits K(need(m), R) - C; beyond R it moves to a block of t = m + m/16
 *   bytes (usable need(t) - 32, committing K(need(t), R')) whose reservation R' is R(t), but at least
 *   16 MB, contents kept up to the old usable size. A small or medium block that moves into the large
 *   range gets the same 1/16. The usable size is need(m) - 32 after every in-place change. What becomes
 *   of the old block of a move the rules leave open: cached like a free, or its memory given back or
 *   handed to the new block (Linux moves the pages); either way it is accounted for.
 * - free(p) of a block with C <= 128 MB puts it into the process's cache, still committed (large_cached
 *   and large_cached_bytes count it); above 128 MB it is released at once. At most 128 blocks and 128 MB
 *   are cached; a free that passes either releases the oldest cached blocks until both hold. That is
 *   the byte limit SHARDMM_LARGE_CACHE_MB=128 sets. By default (the variable unset) it is 128 MB or, if
 *   more, what brings live and cached blocks to 9/8 of the live blocks' committed high H (9/8 H - L);
 *   a new large block first releases the oldest cached blocks until live and cached blocks, its need
 *   included, hold at most 9/8 H, a new segment or arena until the cache holds its 4 MB less, neither
 *   below 128 MB; shard_collect empties the cache and H becomes L. tests/run runs
 *   this program once with the variable and once without; a test of one limit skips in the other run.
 * - malloc(n > 1 MB) takes a cached block whose R >= need(n): the one with the smallest C >= need(n),
 *   else the one with the most C (committed up to K(need(n), R) in place). The excess beyond
 *   T(need(n), C) goes back when it is both above 4 need(n) and above 16 MB (the seed: a block "may keep up to 16 MB, or four
 *   times the request, committed beyond what it needs"); otherwise the block keeps it (growth into it
 *   is free). On Linux, where the port releases parts of a reservation, a block that never grew by
 *   realloc is split first when C >= 2 G and C >= G + 4 MB (G: need(n) rounded up to 4 MB): it keeps
 *   G, all of it committed, and the rest is a cached block of its own; parts of one reservation
 *   join when both are free, and a split block grown past G takes its cached rest back (take_splits).
 * - A cached block expires 1 s after its free, released on the next large malloc/free/realloc, when a
 *   small page becomes free, or at a thread's exit; shard_get_stats alone releases nothing.
 * - With SHARDMM_LARGE_SPARES=0, as above. By default a thread keeps the block it freed last (C <= 4 MB,
 *   no part of a split) as its spare, counted as cached, for its own next malloc that it holds; the rest
 *   goes to the cache. tests/run runs the tests above with SHARDMM_LARGE_SPARES=0 and
 *   those of the spares (the end of this file) without it; the two that count the cache's blocks one by
 *   one skip when spares are on, so that the file run alone passes either way.
 * - With SHARDMM_LARGE_COLOURS=0, as above: every block of a thread starts 32 bytes into its granule. By
 *   default a block with no alignment asked beyond 32 bytes starts at 32 + 64 k, k one of 64 (a created
 *   heap's at 64 + 64 k), needs round_up(n + 32 + 64 k, 4 KB) and has that less 32 + 64 k usable, and keeps
 *   k through realloc in place and moves. tests/run runs every test above with SHARDMM_LARGE_COLOURS=0
 *   and the colours' own tests (the end of this file) without it; the tests of exact addresses and
 *   sizes skip when colours are on.
 * - With SHARDMM_EARNED_TAILS=0, as above. By default (Linux) a fresh block whose F would reach past
 *   need commits need while the fresh blocks freed lately were not used to their ends, and one in eight
 *   of them does so when they were (the earned tails' test says how it is seen). tests/run runs the
 *   tests above with SHARDMM_EARNED_TAILS=0 and the earned tails' own test without it.
 * - calloc of a large size is zero over the whole usable size, also on a dirty cached block.
 * - A double free, an interior pointer, realloc and usable_size of them reach the error hook and change
 *   nothing; a double-freed block comes back from the cache once. Impossible sizes give NULL and leave
 *   the block given to realloc as it was. Any thread may resize or free any large block.
 *
 * The cache makes the address of a new block depend on what earlier tests freed. A test that needs
 * fresh reservations first drains the cache: it allocates 1 MB + 1 bytes (any cached block fits) until
 * large_cached is 0 and keeps those blocks until it ends. The realloc pairs need a fresh reservation
 * for every one of some 300 pairs: there the cache is emptied through its byte limit (see cache_flush).
 * The process's committed bytes are exact in these tests, except that a fresh reservation may add one
 * 64 KB commit of the allocator's own tables (the segment map grows per 4 GB of address space).
 *
 * Built with -DTEST_SYSTEM_MALLOC the same file runs on the system malloc: the checks of shardmm's own
 * rules (addresses, usable sizes, statistics, the cache, the error hook, shard_check) are left out and
 * the tests made only of them report "skip"; the contents are still checked. That is a check of the tests.
 *
 * Build: see build.ninja (build/test-large, build/win64/test-large.exe and their variants).
 * Run:   build/test-large [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator.h"
#include "observe.h"

#include "realloc_pairs.h"
#ifndef _WIN32
#include "smaps.h"
#endif
#ifdef __linux__
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#endif

/* ---- the rules, written out independently of the allocator ---- */

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define GB ((size_t)1 << 30)
#define SMALL_MAX ((size_t)16384)
#define MEDIUM_MAX MB
#define LARGE_MIN (MEDIUM_MAX + 1)
#define LARGE_HEADER ((size_t)32)
#define LARGE_PAGE ((size_t)4096)
#define LARGE_GRANULE (4 * MB)      /* a block's header starts a 4 MB granule */
#define RESERVE_GRANULE (64 * KB)   /* reservations are whole 64 KB */
#define RESERVE_EXTRA_MAX GB        /* the reservation beyond need is need, at most 1 GB */
#define GROWN_RESERVE_MIN (16 * MB) /* ... and a block that moved to grow reserves at least 16 MB */
#define MOVE_HEADROOM 16            /* a growing block that moves gets 1/16 more */
#define CACHE_MAX_BLOCKS 128
#define CACHE_MAX_BYTES (128 * MB)  /* also the most a cached block may hold committed */
#define CACHE_FIXED_ENV "SHARDMM_LARGE_CACHE_MB"
#define CACHE_DELAY_MS 1000
#define TRIM_FACTOR 4               /* a taken block gives back its excess beyond 4 need ... */
#define TRIM_MIN (16 * MB)          /* ... when that excess is above 16 MB too */
#define META_COMMIT (64 * KB)       /* one commit of the allocator's own tables */
#define META_RESERVE (4 * MB)       /* one reservation of them */

enum kind { KIND_SMALL, KIND_MEDIUM, KIND_LARGE };

static enum kind kind_of_size(size_t n)
{
    return n <= SMALL_MAX ? KIND_SMALL : n <= MEDIUM_MAX ? KIND_MEDIUM : KIND_LARGE;
}

__attribute__((unused)) static const char *kind_name(enum kind k)
{
    return k == KIND_SMALL ? "small" : k == KIND_MEDIUM ? "medium" : "large";
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* The bytes a fresh block of n bytes commits, its header included. */
static size_t need(size_t n)
{
    return round_up(n + LARGE_HEADER, LARGE_PAGE);
}

/* Where the platform gives large pages (the Linux port; not Windows'), a block of need c is committed up
 * to the next 2 MB boundary from its header when its reservation r reaches it, so that its last 2 MB can
 * be a large page too (a block that moved to grow as well); elsewhere exactly c. There a reservation
 * ends on a 2 MB boundary, so that every 2 MB of it can be a large page. */
#ifdef _WIN32
#define COMMITS_WHOLE_LARGE_PAGES 0
#else
#define COMMITS_WHOLE_LARGE_PAGES 1
#endif
#define HUGE_PAGE (2 * MB)
static size_t commit_end(size_t c, size_t r)
{
    if (!COMMITS_WHOLE_LARGE_PAGES)
        return c;
    size_t e = round_up(c, HUGE_PAGE);
    return e <= r ? e : c;
}

/* What a block of need c in a reservation of r commits when malloc makes it (a fresh reservation, not
 * a cached block taken again, nor one that grows): as commit_end, but up to the 2 MB boundary only when
 * c fills at least a quarter of its last 2 MB; a large page there would make all of it resident at its
 * first touch. */
static size_t fresh_end(size_t c, size_t r)
{
    return COMMITS_WHOLE_LARGE_PAGES && round_up(c, HUGE_PAGE) - c > HUGE_PAGE - HUGE_PAGE / 4 ? c : commit_end(c, r);
}

/* The reservation of a fresh block of n bytes, counted from its header, made when the largest need
 * asked for since the cache's high last came down was `asked`: its headroom is its own need, or asked
 * where that is more, up to 4 times its need. */
static size_t reservation_after(size_t n, size_t asked)
{
    size_t c = need(n), room = asked > c ? (asked < 4 * c ? asked : 4 * c) : c;
    return round_up(c + (room < RESERVE_EXTRA_MAX ? room : RESERVE_EXTRA_MAX),
                    COMMITS_WHOLE_LARGE_PAGES ? HUGE_PAGE : RESERVE_GRANULE);
}

/* The same with no larger need asked for (forget_needs). */
static size_t reservation(size_t n) { return reservation_after(n, 0); }

/* Whether the reserved bytes grew by `grew` for one block whose reservation is `expected`: by that, or by
 * that and the allocator's metadata reservation, when the block's bookkeeping took a new one. */
__attribute__((unused)) static int grew_by_block(size_t grew, size_t expected)
{
    return grew == expected || grew == expected + META_RESERVE;
}

/* Where a block of need c holding `committed` bytes gives back its tail from when it shrinks or a cached
 * block is taken for less: where the platform gives large pages, the next 2 MB boundary from its header
 * (at most `committed`), so that the large page it ends in stays whole; elsewhere c. */
static inline size_t tail_start(size_t c, size_t committed)
{
    if (!COMMITS_WHOLE_LARGE_PAGES)
        return c;
    size_t e = round_up(c, HUGE_PAGE);
    return e < committed ? e : committed;
}

/* What a fresh block of n bytes commits, its header included. */
static size_t fresh_commit(size_t n)
{
    return fresh_end(need(n), reservation(n));
}

/* The reservation of a block that moved to grow to n bytes: as a fresh one's, but at least 16 MB (it is
 * likely to grow again). */
static inline size_t grown_reservation(size_t n)
{
    size_t r = reservation(n);
    return r < GROWN_RESERVE_MIN ? GROWN_RESERVE_MIN : r;
}

/* The usable size of a fresh block of n bytes (and of any large block after realloc to n in place). */
static size_t fresh_usable(size_t n)
{
    return need(n) - LARGE_HEADER;
}

/* The largest size whose need is c (a multiple of the page). */
static size_t with_need(size_t c)
{
    return c - LARGE_HEADER;
}

/* The size of the block a growing block moves to. */
static size_t move_target(size_t m)
{
    return m + m / MOVE_HEADROOM;
}

/* Whether realloc to m of a block with `committed` bytes committed (m within them) decommits the tail. */
static int shrink_decommits(size_t committed, size_t m)
{
    return need(m) < committed / 2;
}

/* Whether malloc(n) taking a cached block with `committed` bytes gives back the excess. */
static int take_trims(size_t committed, size_t n)
{
    size_t c = need(n);
    return committed - c > TRIM_FACTOR * c && committed - c > TRIM_MIN;
}

/* Where the port releases reservations in parts (Linux), a cached block taken for n bytes is split when
 * its committed memory is at least twice the 4 MB granules need(n) takes (split_keep) and at least a
 * granule more, unless it has ever grown by realloc: the block keeps those granules, all of them
 * committed, and the rest of its reservation stays in the cache as a block of its own, with the
 * committed memory it holds. A block freed next to a part of its own reservation that waits in the
 * cache joins it (committing nothing), and the cache holds one block again; a live block grown past its reservation takes the cached part above it
 * back. take_splits is for a block that has not grown. */
#define SPLITS_CACHED COMMITS_WHOLE_LARGE_PAGES
static size_t split_keep(size_t n)
{
    return round_up(need(n), LARGE_GRANULE);
}

static int take_splits(size_t committed, size_t n)
{
    size_t keep = split_keep(n);
    return SPLITS_CACHED && committed >= keep + LARGE_GRANULE && committed >= 2 * keep;
}

/* Whether p is where a large block's address must be: 32 bytes into a 4 MB granule. */
__attribute__((unused)) static int large_address(const void *p)
{
    return (uintptr_t)p % LARGE_GRANULE == LARGE_HEADER;
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* ---- patterns in 64-bit words: the same bytes as the harness's fill(), written and read 8 at a time ---- */

static void fill64(void *p, size_t n, uint64_t seed)
{
    unsigned char *b = p;
    size_t words = n / 8, w, i;
    for (w = 0; w < words; w++) {
        uint64_t x = pattern_word(seed, w);
        memcpy(b + 8 * w, &x, 8);
    }
    for (i = words * 8; i < n; i++)
        b[i] = pattern_byte(seed, i);
}

/* Index of the first byte of the n at p that is not the pattern of seed, or n. */
static size_t mismatch64(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *b = p;
    size_t words = n / 8, w, i;
    for (w = 0; w < words; w++) {
        uint64_t x;
        memcpy(&x, b + 8 * w, 8);
        if (x != pattern_word(seed, w))
            break;
    }
    for (i = w * 8; i < n; i++)
        if (b[i] != pattern_byte(seed, i))
            return i;
    return n;
}

/* Index of the first byte of the n at p that is not zero, or n. */
static size_t nonzero64(const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t words = n / 8, w, i;
    for (w = 0; w < words; w++) {
        uint64_t x;
        memcpy(&x, b + 8 * w, 8);
        if (x != 0)
            break;
    }
    for (i = w * 8; i < n; i++)
        if (b[i] != 0)
            return i;
    return n;
}

/* The n bytes at p hold the pattern of seed; the message names the block (printf arguments). */
#define CHECK_BLOCK(p, n, seed, ...)                                                                     \
    do {                                                                                                 \
        size_t n_ = (n), bad_ = mismatch64((p), n_, (seed));                                             \
        if (bad_ != n_) {                                                                                \
            char what_[200];                                                                             \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
            harness_fail(__FILE__, __LINE__, "%s: byte %zu of %zu differs from the pattern", what_, bad_, \
                         n_);                                                                            \
        }                                                                                                \
    } while (0)

#define CHECK_ZERO(p, n, ...)                                                                            \
    do {                                                                                                 \
        size_t n_ = (n), bad_ = nonzero64((p), n_);                                                      \
        if (bad_ != n_) {                                                                                \
            char what_[200];                                                                             \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
            harness_fail(__FILE__, __LINE__, "%s: byte %zu of %zu is 0x%02x, not zero", what_, bad_, n_,  \
                         ((const unsigned char *)(p))[bad_]);                                            \
        }                                                                                                \
    } while (0)

/* The first and last EDGE bytes of a block (all of it when shorter): for the blocks of the cache tests,
 * whose point is where a block comes from, not its megabytes. */
#define EDGE ((size_t)256 << 10)

static void fill_edges(unsigned char *p, size_t n, uint64_t seed)
{
    if (n <= 2 * EDGE) {
        fill64(p, n, seed);
        return;
    }
    fill64(p, EDGE, seed);
    fill64(p + n - EDGE, EDGE, seed + 1);
}

#define CHECK_EDGES(p, n, seed, ...)                                                                     \
    do {                                                                                                 \
        const unsigned char *p_ = (const unsigned char *)(p);                                            \
        size_t m_ = (n);                                                                                 \
        if (m_ <= 2 * EDGE) {                                                                            \
            CHECK_BLOCK(p_, m_, (seed), __VA_ARGS__);                                                    \
        } else {                                                                                         \
            CHECK_BLOCK(p_, EDGE, (seed), __VA_ARGS__);                                                  \
            CHECK_BLOCK(p_ + m_ - EDGE, EDGE, (seed) + 1, __VA_ARGS__);                                  \
        }                                                                                                \
    } while (0)

/* ---- statistics, the error hook, the cache ---- */

/* Whether this run has the cache's byte limit fixed at 128 MB (the file comment). */
static int cache_limit_fixed(void)
{
    const char *v = getenv(CACHE_FIXED_ENV);
    return v != NULL && strcmp(v, "128") == 0;
}

/* Ends a test of the fixed limit in the default run, and the other way round. */
#define NEEDS_FIXED_LIMIT()                                                                              \
    do {                                                                                                 \
        if (!cache_limit_fixed())                                                                        \
            SKIP_TEST();                                                                                 \
    } while (0)
#define NEEDS_DEFAULT_LIMIT()                                                                            \
    do {                                                                                                 \
        if (getenv(CACHE_FIXED_ENV) != NULL)                                                             \
            SKIP_TEST();                                                                                 \
    } while (0)

/* Whether the threads' spares are on (SHARDMM_LARGE_SPARES, and a delay above 0: the end of this file). */
__attribute__((unused)) static int spares_on(void)
{
    const char *v = getenv("SHARDMM_LARGE_SPARES"), *d = getenv("SHARDMM_DELAY_MS");
    return SHARD_RULES && !(v != NULL && strcmp(v, "0") == 0) && !(d != NULL && strcmp(d, "0") == 0);
}

/* Ends a test that counts the blocks of the process's cache where the thread's last freed block would
 * wait in its spare instead (tests/run runs this file with SHARDMM_LARGE_SPARES=0 too). */
#define NEEDS_NO_SPARES()                                                                                \
    do {                                                                                                 \
        if (spares_on())                                                                                 \
            SKIP_TEST();                                                                                 \
    } while (0)

/* Whether large blocks take colours (SHARDMM_LARGE_COLOURS, on by default): a block then starts 32 + 64 k
 * bytes into its granule, k one of 64, and needs round_up(n + 32 + 64 k, 4 KB). The rules above are those
 * of colour 0, which every block takes with SHARDMM_LARGE_COLOURS=0: tests/run runs this file so, and
 * the tests of the colours (the end of this file) without it. */
__attribute__((unused)) static int colours_on(void)
{
    const char *v = getenv("SHARDMM_LARGE_COLOURS");
    return SHARD_RULES && !(v != NULL && strcmp(v, "0") == 0);
}

/* Ends a test of the rules above, which place every block at colour 0. */
#define NEEDS_NO_COLOURS()                                                                               \
    do {                                                                                                 \
        if (colours_on())                                                                                \
            SKIP_TEST();                                                                                 \
    } while (0)

#if SHARD_RULES

static size_t live_of(const shard_stats *s, enum kind k)
{
    return k == KIND_SMALL ? s->live_small : k == KIND_MEDIUM ? s->live_medium : s->live_large;
}

/* Whether committed went from a to b by delta; fresh: a new reservation was made, which may add one
 * commit of the allocator's own tables. */
static int committed_by(size_t a, size_t b, long long delta, int fresh)
{
    long long d = (long long)b - (long long)a;
    return d == delta || (fresh && d == delta + (long long)META_COMMIT);
}

#define CHECK_COMMITTED(a, b, delta, fresh, ...)                                                         \
    do {                                                                                                 \
        size_t a_ = (a), b_ = (b);                                                                       \
        long long delta_ = (delta);                                                                      \
        if (!committed_by(a_, b_, delta_, (fresh))) {                                                    \
            char what_[200];                                                                             \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
            harness_fail(__FILE__, __LINE__, "%s: committed %zu -> %zu (%+lld), expected %+lld", what_, a_, \
                         b_, (long long)b_ - (long long)a_, delta_);                                     \
        }                                                                                                \
    } while (0)

/* The cache holds count blocks of bytes committed bytes. */
#define CHECK_CACHE(s, count, bytes, ...)                                                                \
    do {                                                                                                 \
        const shard_stats *s_ = &(s);                                                                    \
        size_t c_ = (count), b_ = (bytes);                                                               \
        if (s_->large_cached != c_ || s_->large_cached_bytes != b_) {                                    \
            char what_[200];                                                                             \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
            harness_fail(__FILE__, __LINE__, "%s: the cache holds %zu blocks of %zu bytes, expected %zu of %zu", \
                         what_, s_->large_cached, s_->large_cached_bytes, c_, b_);                       \
        }                                                                                                \
    } while (0)

#define CHECK_CACHE_NOW(count, bytes, ...)                                                               \
    do {                                                                                                 \
        shard_stats now_ = stats_now();                                                                  \
        CHECK_CACHE(now_, count, bytes, __VA_ARGS__);                                                    \
    } while (0)

/* After a large block holding `held` bytes moved out (realloc beyond its reservation, or to 1 MB or
 * less) with the cache empty before: the rules leave its old memory to the allocator - cached as a
 * block (in the cache with `held` bytes), or given back or handed to the new block (out of committed).
 * new_commit: what the new block commits, -1 when another kind's (not checked). */
static void check_moved_out(const shard_stats *a, const shard_stats *b, size_t held, long long new_commit,
                            const char *what)
{
    long long d = (long long)b->committed - (long long)a->committed;
    if (b->large_cached == 1 && (held <= CACHE_MAX_BYTES || !cache_limit_fixed())) {
        CHECKF(b->large_cached_bytes == held, "%s: the old block is cached with %zu bytes, it held %zu", what,
               b->large_cached_bytes, held);
        if (new_commit >= 0)
            CHECKF(committed_by(a->committed, b->committed, new_commit, 1),
                   "%s, the old block cached: committed %+lld, expected %+lld", what, d, new_commit);
    } else {
        CHECKF(b->large_cached == 0 && b->large_cached_bytes == 0,
               "%s: the cache holds %zu blocks of %zu bytes after one block of %zu bytes moved out", what,
               b->large_cached, b->large_cached_bytes, held);
        if (new_commit >= 0)
            CHECKF(committed_by(a->committed, b->committed, new_commit - (long long)held, 1),
                   "%s, the old block not cached: committed %+lld, expected %+lld (its %zu bytes gone or handed "
                   "over)", what, d, new_commit - (long long)held, held);
    }
}

static int hook_cookie; /* the hook's argument */
#endif

/* Blocks taken out of the cache so that the next large allocations are fresh reservations. */
enum { DRAIN_MAX = 1024 }; /* a cached block taken for less is split (take_splits): 4 MB a take */
typedef struct {
    void *blocks[DRAIN_MAX];
    size_t count;
} drained;

/* Allocates 1 MB + 1 bytes (every cached block's reservation fits) until the cache is empty, adding the
 * blocks to d; they stay live until cache_undrain. */
static void drain_into(drained *d)
{
#if SHARD_RULES
    while (stats_now().large_cached > 0 && d->count < DRAIN_MAX) {
        void *p = shard_malloc(LARGE_MIN);
        CHECKF(p != NULL, "draining the cache: shard_malloc(%zu) returned NULL", LARGE_MIN);
        if (!p)
            break;
        d->blocks[d->count++] = p;
    }
    size_t left = stats_now().large_cached;
    CHECKF(left == 0, "the cache holds %zu blocks after %zu allocations of %zu bytes", left, d->count, LARGE_MIN);
#else
    (void)d;
#endif
}

/* A fresh block's headroom follows the largest need asked for since the cache's high last came down
 * (src/large.c, asked_high), and reservation() assumes none larger than the block's own: a collect
 * makes the allocator forget them, and gives the cache back. */
static void forget_needs(void)
{
#if SHARD_RULES
    shard_collect();
#endif
}

static void cache_drain(drained *d)
{
    forget_needs();
    d->count = 0;
    drain_into(d);
}

static void cache_undrain(drained *d)
{
    for (size_t i = 0; i < d->count; i++)
        shard_free(d->blocks[i]);
    d->count = 0;
}

/* ---- tests ---- */

TEST(rules_of_the_test_are_the_documented_ones)
{
    CHECK_EQ(kind_of_size(MB), KIND_MEDIUM);
    CHECK_EQ(kind_of_size(MB + 1), KIND_LARGE);
    CHECK_EQ(need(LARGE_MIN), MB + 4096);
    CHECK_EQ(need(MB + 4064), MB + 4096);
    CHECK_EQ(need(MB + 4065), MB + 8192);
    CHECK_EQ(fresh_usable(LARGE_MIN), MB + 4064);
    /* 2 need, rounded up to 64 KB, or to 2 MB where large pages are (W: without them, L: with). */
#define W_L(w, l) (COMMITS_WHOLE_LARGE_PAGES ? (l) : (w))
    CHECK_EQ(reservation(LARGE_MIN), W_L(2 * MB + 64 * KB, 4 * MB));
    CHECK_EQ(reservation(11 * MB / 10), W_L(2 * MB + 256 * KB, 4 * MB)); /* 1.1 MB: 2.25 MB */
    CHECK_EQ(reservation(move_target(2 * MB + 64 * KB - 31)), W_L(4 * MB + 448 * KB, 6 * MB));
    CHECK_EQ(reservation(8 * MB - 32), 16 * MB);
    CHECK_EQ(reservation(8 * MB - 31), W_L(16 * MB + 64 * KB, 18 * MB));
    CHECK_EQ(reservation(16 * MB - 32), 32 * MB);
    CHECK_EQ(reservation(40 * MB), W_L(80 * MB + 64 * KB, 82 * MB));
    CHECK_EQ(reservation(GB + GB / 2), W_L(2 * GB + GB / 2 + 64 * KB, 2 * GB + GB / 2 + 2 * MB)); /* need + 1 GB */
#undef W_L
    CHECK_EQ(move_target(16 * MB), 17 * MB);
    CHECK_EQ(shrink_decommits(4 * MB, 2 * MB - 32), 0);   /* need exactly half: kept */
    CHECK_EQ(shrink_decommits(4 * MB, 2 * MB - 4128), 1); /* a page below half */
    CHECK_EQ(take_trims(80 * MB, 16 * MB - 32), 0);       /* an excess of exactly 4 need */
    CHECK_EQ(take_trims(80 * MB, 16 * MB - 4128), 1);
    CHECK_EQ(take_trims(64 * MB, 16 * MB - 4128), 0);     /* 48 MB of excess, above 16 MB but not 4 need */
    CHECK_EQ(take_trims(20 * MB, 4 * MB - 32), 0);        /* an excess of exactly 16 MB */
    CHECK_EQ(take_trims(20 * MB, 4 * MB - 4128), 1);
    CHECK_EQ(take_trims(40 * MB, 12 * MB - 32), 0);       /* 28 MB of excess, but not 4 need */
    /* The generated pairs hold the edges of the reservation (gen/realloc_pairs.py). */
    int edges = 0;
    for (size_t k = 0; k < REALLOC_LARGE_PAIR_COUNT; k++) {
        size_t from = realloc_large_pairs[k][0], to = realloc_large_pairs[k][1];
        if (from == LARGE_MIN && (need(to) == reservation(from) || need(to) == reservation(from) + LARGE_PAGE))
            edges++;
    }
    CHECKF(edges == 2, "%d pairs from %zu bytes to need == R and R + 4 KB", edges, LARGE_MIN);
    /* The word-wise pattern is the harness's. */
    {
        unsigned char a[1003], b[1003];
        fill(a, sizeof a, 42);
        fill64(b, sizeof b, 42);
        CHECK(memcmp(a, b, sizeof a) == 0);
        CHECK_EQ(mismatch64(a, sizeof a, 42), sizeof a);
        a[517] ^= 1;
        CHECK_EQ(mismatch64(a, sizeof a, 42), 517);
        a[517] ^= 1;
        a[1001] ^= 0x80;
        CHECK_EQ(mismatch64(a, sizeof a, 42), 1001);
        memset(a, 0, sizeof a);
        CHECK_EQ(nonzero64(a, sizeof a), sizeof a);
        a[999] = 1;
        CHECK_EQ(nonzero64(a, sizeof a), 999);
    }
}

/* ---- sizes ---- */

struct placed {
    uintptr_t at;
    size_t usable;
};

static int compare_placed(const void *a, const void *b)
{
    uintptr_t x = ((const struct placed *)a)->at, y = ((const struct placed *)b)->at;
    return (x > y) - (x < y);
}

/* One allocation of n bytes (how: 0 malloc, 1 calloc, 2 realloc(NULL)) on a drained cache: 16-byte
 * aligned, usable >= n; a large one is fresh: 32 bytes into 4 MB, usable need(n) - 32, committing
 * fresh_commit(n), live_large + 1, the cache untouched; 1 MB and less is not large. */
static unsigned char *alloc_checked(size_t n, int how)
{
    static const char *const names[] = { "shard_malloc", "shard_calloc", "shard_realloc(NULL)" };
#if SHARD_RULES
    shard_stats a = stats_now();
#endif
    unsigned char *p = how == 0 ? shard_malloc(n) : how == 1 ? shard_calloc(1, n) : shard_realloc(NULL, n);
    CHECKF(p != NULL, "%s(%zu) returned NULL", names[how], n);
    if (!p)
        return NULL;
    size_t u = shard_usable_size(p);
    CHECKF(aligned16(p) && u >= n, "%s(%zu) = %p, usable %zu", names[how], n, (void *)p, u);
    if (how == 1)
        CHECK_ZERO(p, u, "%s(%zu) over its usable size", names[how], n);
#if SHARD_RULES
    shard_stats b = stats_now();
    enum kind k = kind_of_size(n);
    for (enum kind j = KIND_SMALL; j <= KIND_LARGE; j++)
        CHECKF(live_of(&b, j) == live_of(&a, j) + (j == k), "%s(%zu), a %s size: live %s blocks %zu -> %zu",
               names[how], n, kind_name(k), kind_name(j), live_of(&a, j), live_of(&b, j));
    if (k == KIND_LARGE) {
        CHECKF(large_address(p), "%s(%zu) = %p: %zu bytes into its 4 MB, expected 32", names[how], n, (void *)p,
               (size_t)((uintptr_t)p % LARGE_GRANULE));
        CHECKF(u == fresh_usable(n), "%s(%zu): usable %zu, expected need - 32 = %zu", names[how], n, u,
               fresh_usable(n));
        CHECK_COMMITTED(a.committed, b.committed, (long long)fresh_commit(n), 1, "%s(%zu) fresh", names[how], n);
        CHECK_CACHE(b, 0, 0, "%s(%zu) on a drained cache", names[how], n);
    } else {
        CHECKF(u < MEDIUM_MAX + 256, "%s(%zu): usable %zu of a medium block", names[how], n, u);
    }
#endif
    return p;
}

/* Sizes from 1 MB (medium) through the first large ones and page edges to 64 MB, by malloc, calloc and
 * realloc(NULL), all live at once: each of its kind, aligned, at its place in its 4 MB granule, of
 * usable size need - 32, committing need; none overlaps another; contents intact. */
TEST(sizes_above_1mb_are_large_blocks_at_32_bytes_into_4mb_with_usable_size_need_minus_32)
{
    NEEDS_NO_COLOURS();
    static const size_t sizes[] = { MB,          MB + 1,       MB + 4064,    MB + 4065,   2 * MB,
                                    3 * MB + 17, 4 * MB - 32,  4 * MB,       4 * MB + 1,  16 * MB - 32,
                                    16 * MB,     40 * MB + 5,  64 * MB };
    static const size_t other_ways[] = { MB, MB + 1, 4 * MB, 16 * MB + 3 };
    enum { S = sizeof sizes / sizeof sizes[0], O = sizeof other_ways / sizeof other_ways[0], N = S + 2 * O };
    unsigned char *blocks[N];
    size_t usable[N], count = 0;
    struct placed placed[N];
    drained d;
    cache_drain(&d);
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    for (size_t i = 0; i < S; i++)
        blocks[count++] = alloc_checked(sizes[i], 0);
    for (size_t i = 0; i < O; i++) {
        blocks[count++] = alloc_checked(other_ways[i], 1);
        blocks[count++] = alloc_checked(other_ways[i], 2);
    }
    size_t np = 0;
    for (size_t i = 0; i < N; i++) {
        usable[i] = blocks[i] ? shard_usable_size(blocks[i]) : 0;
        if (blocks[i]) {
            fill64(blocks[i], usable[i], 0x1000 + i);
            placed[np].at = (uintptr_t)blocks[i];
            placed[np++].usable = usable[i];
        }
    }
    qsort(placed, np, sizeof placed[0], compare_placed);
    for (size_t i = 0; i + 1 < np; i++)
        CHECKF(placed[i].at + placed[i].usable <= placed[i + 1].at, "block %p of usable size %zu overlaps block %p",
               (void *)placed[i].at, placed[i].usable, (void *)placed[i + 1].at);
    for (size_t i = 0; i < N; i++)
        if (blocks[i]) {
            CHECK_BLOCK(blocks[i], usable[i], 0x1000 + i, "block %zu of usable size %zu", i, usable[i]);
            CHECKF(shard_usable_size(blocks[i]) == usable[i], "usable size of block %zu changed", i);
            shard_free(blocks[i]);
        }
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECK_EQ(s1.live_large, s0.live_large);
    CHECK_EQ(s1.live_medium, s0.live_medium);
#endif
    cache_undrain(&d);
    check_allocator("after the sizes around 1 MB");
}

/* ---- the cache: what goes in, what comes back ---- */

/* free() of a large block puts it into the cache, still committed and reserved; a malloc of a size it
 * fits takes it back (same address, usable need - 32, nothing committed); realloc(p, 0) frees too; a block
 * taken for a smaller size keeps its committed memory, and growing into that commits nothing. */
TEST(a_freed_large_block_stays_committed_in_the_cache_and_the_next_malloc_that_fits_takes_it)
{
    NEEDS_NO_COLOURS();
    const size_t n = 3 * MB, smaller = 2 * MB;
    drained d;
    cache_drain(&d);
    unsigned char *p = shard_malloc(n), *q;
    CHECK(p != NULL);
    if (!p) {
        cache_undrain(&d);
        return;
    }
    fill64(p, shard_usable_size(p), 0x2000);
    CHECK_BLOCK(p, shard_usable_size(p), 0x2000, "block of %zu bytes", n);
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    shard_free(p);
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECK_CACHE(s1, 1, fresh_commit(n), "after free(%zu bytes)", n);
    CHECK_EQ(s1.live_large + 1, s0.live_large);
    CHECK_COMMITTED(s0.committed, s1.committed, 0, 0, "free into the cache");
    CHECK_EQ(s1.reserved, s0.reserved);
#endif
    q = shard_malloc(n);
    CHECK(q != NULL);
    if (!q) {
        cache_undrain(&d);
        return;
    }
#if SHARD_RULES
    shard_stats s2 = stats_now();
    CHECKF(q == p, "malloc(%zu) after free of a %zu-byte block: %p, the cached block is %p", n, n, (void *)q,
           (void *)p);
    CHECK_EQ(shard_usable_size(q), fresh_usable(n));
    CHECK_CACHE(s2, 0, 0, "after the block was taken back");
    CHECK_EQ(s2.live_large, s0.live_large);
    CHECK_COMMITTED(s1.committed, s2.committed, 0, 0, "taking a cached block of the same size");
    CHECK_EQ(s2.reserved, s0.reserved);
#endif
    fill64(q, shard_usable_size(q), 0x2001);
    CHECK_BLOCK(q, shard_usable_size(q), 0x2001, "block taken from the cache");
    /* realloc(q, 0) frees q into the cache; a smaller malloc takes it with all its committed memory. */
    CHECK(shard_realloc(q, 0) == NULL);
#if SHARD_RULES
    shard_stats s3 = stats_now();
    CHECK_CACHE(s3, 1, fresh_commit(n), "after realloc(p, 0)");
    CHECK_EQ(s3.live_large + 1, s0.live_large);
#endif
    q = shard_malloc(smaller);
    CHECK(q != NULL);
    if (!q) {
        cache_undrain(&d);
        return;
    }
    fill64(q, smaller, 0x2002);
#if SHARD_RULES
    shard_stats s4 = stats_now();
    CHECKF(q == p, "malloc(%zu) with a cached %zu-byte block: %p, the cached block is %p", smaller, n, (void *)q,
           (void *)p);
    CHECKF(shard_usable_size(q) == fresh_usable(smaller), "a cached block taken for %zu bytes: usable %zu, "
           "expected %zu (need - 32, whatever it holds committed)", smaller, shard_usable_size(q),
           fresh_usable(smaller));
    CHECK_COMMITTED(s3.committed, s4.committed, 0, 0, "taking a %zu-byte cached block for %zu bytes (kept)", n,
                    smaller);
#endif
    unsigned char *r = shard_realloc(q, n);
    CHECK(r != NULL);
    if (r) {
#if SHARD_RULES
        shard_stats s5 = stats_now();
        CHECKF(r == q, "growing back into the block's committed memory moved it");
        CHECK_EQ(shard_usable_size(r), fresh_usable(n));
        CHECK_COMMITTED(s4.committed, s5.committed, 0, 0, "growing %zu -> %zu within the kept memory", smaller, n);
#endif
        CHECK_BLOCK(r, smaller, 0x2002, "block grown into its kept memory");
        q = r;
    }
    shard_free(q);
    cache_undrain(&d);
    check_allocator("after the cache took a block back");
}

/* The cache takes blocks by their committed size, header included, up to 128 MB exactly: a block of
 * 128 MB - 32 bytes (128 MB committed) is cached; grown in place by one page, or shrunk without a
 * decommit from 200 MB to 100 MB, it is released at once (reserved and committed drop); shrunk from
 * 200 MB below half it is cached. */
TEST(a_block_holding_more_than_128mb_committed_is_released_at_once_and_128mb_is_cached)
{
    NEEDS_NO_COLOURS();
    NEEDS_FIXED_LIMIT();
    const size_t at_limit = with_need(CACHE_MAX_BYTES), big = 200 * MB;
    drained d;
    cache_drain(&d);
    unsigned char *p = shard_malloc(at_limit), *q;
    CHECK(p != NULL);
    if (!p) {
        cache_undrain(&d);
        return;
    }
    fill_edges(p, at_limit, 0x2100);
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    shard_free(p);
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECK_CACHE(s1, 1, CACHE_MAX_BYTES, "after free of a block committing exactly 128 MB");
    CHECK_COMMITTED(s0.committed, s1.committed, 0, 0, "free of a block committing exactly 128 MB");
#endif
    q = shard_malloc(at_limit);
    CHECK(q != NULL);
    if (!q) {
        cache_undrain(&d);
        return;
    }
#if SHARD_RULES
    CHECKF(q == p, "the cached 128 MB block did not come back for the same size");
#endif
    fill_edges(q, at_limit, 0x2101);
    p = shard_realloc(q, at_limit + 1);
    CHECK(p != NULL);
    if (!p) {
        shard_free(q);
        cache_undrain(&d);
        return;
    }
    CHECK_EDGES(p, at_limit, 0x2101, "128 MB block grown by a page");
#if SHARD_RULES
    shard_stats s2 = stats_now();
    CHECKF(p == q, "growing a 128 MB block by a page within its reservation moved it");
    const size_t grown = commit_end(need(at_limit + 1), reservation(at_limit)); /* 128 MB + 4 KB, or 130 MB */
    CHECK_COMMITTED(s1.committed, s2.committed, (long long)(grown - CACHE_MAX_BYTES), 0, "growing to 128 MB + 4 KB");
#endif
    shard_free(p);
#if SHARD_RULES
    shard_stats s3 = stats_now();
    CHECK_CACHE(s3, 0, 0, "after free of a block committing 128 MB + 4 KB");
    CHECK_COMMITTED(s2.committed, s3.committed, -(long long)grown, 0, "free of a block committing 128 MB + 4 KB");
    CHECKF(s2.reserved - s3.reserved >= reservation(at_limit), "free of a 128 MB + 4 KB block: reserved %zu -> %zu, "
           "expected a drop of %zu or more", s2.reserved, s3.reserved, reservation(at_limit));
    CHECK_EQ(s3.live_large + 1, s2.live_large);
#endif
    /* 200 MB shrunk to 110 MB: need is above half of what is committed, nothing goes back, the block
     * still holds 200 MB when it is freed. */
    for (int below_half = 0; below_half <= 1; below_half++) {
        size_t to = below_half ? 90 * MB : 110 * MB;
        p = shard_malloc(big);
        CHECK(p != NULL);
        if (!p)
            break;
        fill_edges(p, 2 * MB, 0x2110 + (uint64_t)below_half);
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        q = shard_realloc(p, to);
        CHECK(q != NULL);
        if (!q) {
            shard_free(p);
            break;
        }
        CHECK_EDGES(q, 2 * MB, 0x2110 + (uint64_t)below_half, "200 MB block shrunk to %zu", to);
#if SHARD_RULES
        shard_stats b = stats_now();
        CHECKF(q == p, "shrinking 200 MB to %zu moved the block", to);
        size_t big_c = fresh_commit(big), to_c = commit_end(need(to), reservation(big));
        CHECK_EQ(shrink_decommits(big_c, to), below_half);
        CHECK_COMMITTED(a.committed, b.committed, below_half ? -(long long)(big_c - to_c) : 0, 0,
                        "shrinking 200 MB to %zu bytes", to);
        size_t held = below_half ? to_c : big_c;
#endif
        shard_free(q);
#if SHARD_RULES
        shard_stats c = stats_now();
        if (held > CACHE_MAX_BYTES) {
            CHECK_CACHE(c, 0, 0, "after free of a block shrunk to %zu bytes, holding %zu committed", to, held);
            CHECK_COMMITTED(b.committed, c.committed, -(long long)held, 0, "free of a block holding %zu", held);
        } else {
            CHECK_CACHE(c, 1, held, "after free of a block shrunk to %zu bytes, holding %zu committed", to, held);
            CHECK_COMMITTED(b.committed, c.committed, 0, 0, "free of a block holding %zu", held);
        }
#endif
    }
    cache_undrain(&d);
    check_allocator("after the 128 MB limit of a cached block");
}

/* ---- realloc: the generated pairs ---- */

#if SHARD_RULES
/* A live block committing exactly 128 MB. Freed, it reaches the cache's byte limit alone, so the cache
 * releases every other block (the oldest first until 128 MB hold); taken back by a malloc of its size
 * (then the only cached block) it leaves the cache empty. */
static void *flusher;

/* Empties the cache through its byte limit (by shard_collect in the default run); whether it is empty.
 * The rules this relies on have tests of their own (a_block_holding_more...,
 * the_cache_keeps_at_most_128mb..., past_128mb_the_cache_holds_...). */
static int cache_flush(void)
{
    if (!cache_limit_fixed()) {
        shard_collect();
        size_t left = stats_now().large_cached;
        CHECKF(left == 0, "shard_collect left %zu blocks in the cache", left);
        return left == 0;
    }
    const size_t n = with_need(CACHE_MAX_BYTES);
    if (flusher == NULL)
        flusher = shard_malloc(n);
    shard_free(flusher);
    flusher = shard_malloc(n);
    CHECKF(flusher != NULL, "emptying the cache: shard_malloc(%zu) returned NULL", n);
    forget_needs(); /* the flusher's own need among them */
    size_t left = stats_now().large_cached;
    CHECKF(left == 0, "freeing and taking back a block of 128 MB left %zu other blocks in the cache", left);
    return flusher != NULL && left == 0;
}
#endif

/* realloc(from -> to) of a fresh block: the contents up to the smaller of its usable size and `to`
 * survive. A large block stays in place exactly while need(to) fits its reservation
 * (and `to` is above 1 MB), with usable need(to) - 32 and the commit or decommit of the rules (up to
 * commit_end); it moves
 * beyond to a block of need(to + to/16) - 32 usable bytes, and its old block goes into the cache. A
 * small or medium block moving into the large range gets the same 1/16. */
static void check_large_pair(size_t from, size_t to, uint64_t seed)
{
#if SHARD_RULES
    if (!cache_flush())
        return;
#endif
    unsigned char *p = shard_malloc(from), *q;
    CHECKF(p != NULL, "shard_malloc(%zu) returned NULL", from);
    if (!p)
        return;
    size_t u = shard_usable_size(p), keep = min_size(u, to);
    fill64(p, keep, seed); /* what must survive; the rest of a block to shrink is left as it is */
#if SHARD_RULES
    enum kind kf = kind_of_size(from);
    size_t c = fresh_commit(from), r = reservation(from);
    if (kf == KIND_LARGE)
        CHECKF(u == fresh_usable(from) && large_address(p), "shard_malloc(%zu) on an empty cache = %p, usable %zu",
               from, (void *)p, u);
    shard_stats a = stats_now();
#endif
    q = shard_realloc(p, to);
    CHECKF(q != NULL, "shard_realloc(%zu -> %zu) returned NULL", from, to);
    if (!q) {
        shard_free(p);
        return;
    }
    size_t nu = shard_usable_size(q), bad = mismatch64(q, keep, seed);
    CHECKF(bad == keep, "shard_realloc(%zu -> %zu) %s: byte %zu of %zu lost", from, to, q == p ? "in place" : "moved",
           bad, keep);
    CHECKF(aligned16(q) && nu >= to, "shard_realloc(%zu -> %zu) = %p, usable %zu", from, to, (void *)q, nu);
#if SHARD_RULES
    shard_stats b = stats_now();
    enum kind kt = q == p ? kf : kind_of_size(to);
    for (enum kind j = KIND_SMALL; j <= KIND_LARGE; j++)
        CHECKF(live_of(&b, j) + (j == kf) == live_of(&a, j) + (j == kt),
               "shard_realloc(%zu -> %zu) %s: live %s %zu -> %zu", from, to, q == p ? "in place" : "moved",
               kind_name(j), live_of(&a, j), live_of(&b, j));
    if (kf == KIND_LARGE) {
        const char *rule;
        int in_place = 0;
        size_t want = 0; /* the usable size the rules give, 0 when they leave it to another kind */
        long long grew = -1;
        if (to <= MEDIUM_MAX) {
            rule = "to 1 MB or less: moves";
        } else if (need(to) <= c) {
            rule = "within the committed part: stays";
            in_place = 1;
            want = fresh_usable(to);
            grew = shrink_decommits(c, to) ? -(long long)(c - tail_start(need(to), c)) : 0;
        } else if (need(to) <= r) {
            rule = "within the reservation: stays";
            in_place = 1;
            want = fresh_usable(to);
            grew = (long long)(commit_end(need(to), r) - c);
        } else {
            rule = "beyond the reservation: moves with 1/16";
            want = fresh_usable(move_target(to));
            grew = (long long)commit_end(need(move_target(to)), grown_reservation(move_target(to)));
        }
        CHECKF((q == p) == in_place, "shard_realloc(%zu -> %zu), committed %zu, reservation %zu (%s): %s", from, to, c,
               r, rule, q == p ? "stayed" : "moved");
        if (want)
            CHECKF(nu == want, "shard_realloc(%zu -> %zu) (%s): usable %zu, expected %zu", from, to, rule, nu, want);
        if ((q == p) == in_place) {
            if (in_place) {
                CHECK_COMMITTED(a.committed, b.committed, grew, 0, "shard_realloc(%zu -> %zu) (%s)", from, to, rule);
                CHECKF(b.reserved == a.reserved, "shard_realloc(%zu -> %zu) in place: reserved %zu -> %zu", from, to,
                       a.reserved, b.reserved);
                CHECK_CACHE(b, 0, 0, "shard_realloc(%zu -> %zu) (%s)", from, to, rule);
            } else {
                char what[160];
                snprintf(what, sizeof what, "shard_realloc(%zu -> %zu) (%s)", from, to, rule);
                check_moved_out(&a, &b, c, grew, what);
                if (want)
                    CHECKF(large_address(q), "shard_realloc(%zu -> %zu) moved to %p", from, to, (void *)q);
            }
        }
    } else if (kind_of_size(to) == KIND_LARGE) {
        if (q == p)
            CHECKF(to <= u, "shard_realloc(%zu -> %zu) of a %s block of usable size %zu stayed in place", from, to,
                   kind_name(kf), u);
        else
            CHECKF(nu == fresh_usable(move_target(to)) && large_address(q),
                   "shard_realloc(%zu -> %zu) of a %s block moved to %p, usable %zu, expected %zu (1/16 more)", from,
                   to, kind_name(kf), (void *)q, nu, fresh_usable(move_target(to)));
        CHECK_CACHE(b, 0, 0, "shard_realloc(%zu -> %zu) of a %s block", from, to, kind_name(kf));
    }
#endif
    shard_free(q);
}

/* Every pair of tests/realloc_pairs.h's large table (sizes at 1 MB, at page edges, at half of what a
 * block commits, at the edges of reservations of 16, 20, 32 and 64 MB, up to 64 MB), each on a fresh
 * block (the cache emptied before each): the contents survive, and a block is in place exactly where
 * the reservation rules put it. */
TEST(realloc_pairs_into_and_out_of_the_large_range_stay_within_the_reservation_and_keep_contents)
{
    NEEDS_NO_COLOURS();
    for (size_t k = 0; k < REALLOC_LARGE_PAIR_COUNT; k++)
        check_large_pair(realloc_large_pairs[k][0], realloc_large_pairs[k][1], 0x3000 + k);
#if SHARD_RULES
    shard_free(flusher);
    flusher = NULL;
#endif
    check_allocator("after the realloc pairs");
}

/* ---- realloc: in place within the reservation, moves beyond ---- */

/* A block followed through reallocs, with what the rules say it holds. */
struct tracked {
    unsigned char *p;
    size_t c;        /* committed, header included */
    size_t r;        /* reservation, from the header */
    size_t valid;    /* bytes from the start that hold the pattern of seed */
    uint64_t seed;
};

/* A fresh block of n bytes (the cache drained), its first fill_bytes (at most its usable size) filled. */
static int track_alloc(struct tracked *b, size_t n, size_t fill_bytes, uint64_t seed)
{
    b->p = shard_malloc(n);
    CHECKF(b->p != NULL, "shard_malloc(%zu) returned NULL", n);
    if (!b->p)
        return 0;
    b->c = fresh_commit(n);
    b->r = reservation(n);
    b->seed = seed;
    b->valid = min_size(fill_bytes, shard_usable_size(b->p));
    fill64(b->p, b->valid, seed);
#if SHARD_RULES
    CHECKF(large_address(b->p) && shard_usable_size(b->p) == fresh_usable(n),
           "fresh shard_malloc(%zu) = %p, usable %zu, expected %zu", n, (void *)b->p, shard_usable_size(b->p),
           fresh_usable(n));
#endif
    return 1;
}

/* realloc(b->p, m) on an empty cache: the contents survive, and under shardmm's rules the block stays or
 * moves, has the usable size and changes the committed bytes as the rules say; a move puts the old
 * block into the cache, which is drained again (into d) so that the next step starts from an empty one. */
static int track_realloc(struct tracked *b, size_t m, drained *d)
{
#if SHARD_RULES
    shard_stats a = stats_now();
    const char *rule;
    int in_place = 0;
    size_t c2 = 0, r2 = 0, want = 0;
    long long grew = 0;
    if (m <= MEDIUM_MAX) {
        rule = "to 1 MB or less: moves";
    } else if (need(m) <= b->c) {
        rule = "within the committed part: stays";
        in_place = 1;
        c2 = shrink_decommits(b->c, m) ? tail_start(need(m), b->c) : b->c;
        r2 = b->r;
        want = fresh_usable(m);
        grew = (long long)c2 - (long long)b->c;
    } else if (need(m) <= b->r) {
        rule = "within the reservation: stays";
        in_place = 1;
        c2 = commit_end(need(m), b->r);
        r2 = b->r;
        want = fresh_usable(m);
        grew = (long long)(c2 - b->c);
    } else {
        rule = "beyond the reservation: moves with 1/16";
        r2 = grown_reservation(move_target(m));
        c2 = commit_end(need(move_target(m)), r2);
        want = fresh_usable(move_target(m));
        grew = (long long)c2;
    }
#endif
    size_t old_usable = shard_usable_size(b->p);
    unsigned char *q = shard_realloc(b->p, m);
    CHECKF(q != NULL, "shard_realloc(usable %zu -> %zu) returned NULL", old_usable, m);
    if (!q)
        return 0;
    size_t keep = min_size(b->valid, m);
    CHECK_BLOCK(q, keep, b->seed, "shard_realloc(usable %zu -> %zu) %s", old_usable, m,
                q == b->p ? "in place" : "moved");
    CHECK(shard_usable_size(q) >= m);
#if SHARD_RULES
    shard_stats s = stats_now();
    size_t nu = shard_usable_size(q);
    CHECKF((q == b->p) == in_place, "shard_realloc(usable %zu -> %zu), committed %zu, reservation %zu (%s): %s",
           old_usable, m, b->c, b->r, rule, q == b->p ? "stayed" : "moved");
    if (want)
        CHECKF(nu == want, "shard_realloc(usable %zu -> %zu) (%s): usable %zu, expected %zu", old_usable, m, rule, nu,
               want);
    if (in_place && q == b->p) {
        CHECK_COMMITTED(a.committed, s.committed, grew, 0, "shard_realloc(usable %zu -> %zu) (%s)", old_usable, m,
                        rule);
        CHECKF(s.reserved == a.reserved, "shard_realloc(usable %zu -> %zu) in place: reserved %zu -> %zu", old_usable,
               m, a.reserved, s.reserved);
        CHECK_CACHE(s, 0, 0, "shard_realloc(usable %zu -> %zu) (%s)", old_usable, m, rule);
    }
    if (!in_place && q != b->p) {
        char what[160];
        snprintf(what, sizeof what, "shard_realloc(usable %zu -> %zu) (%s)", old_usable, m, rule);
        check_moved_out(&a, &s, b->c, m > MEDIUM_MAX ? grew : -1, what);
        if (m > MEDIUM_MAX)
            CHECKF(large_address(q), "shard_realloc(usable %zu -> %zu) moved to %p", old_usable, m, (void *)q);
    }
    b->c = c2;
    b->r = r2;
#endif
    int moved = q != b->p;
    b->p = q;
    b->valid = keep;
    if (moved)
        drain_into(d);
    return 1;
}

/* Blocks grown step by step: in place while need fits the reservation - up to exactly R (2 MB + 64 KB
 * for the least, 4 MB + 448 KB for the block of 2 MB + 64 KB - 31 + 1/16 it moves to, 16 MB + 64 KB for
 * need 8 MB + 4 KB, 80 MB + 64 KB for 40 MB) - committing what they grow by, reserving nothing; one page
 * beyond R they move, to a block with 1/16 of headroom. Shrinking leaves the reservation as it was. */
/* On Linux, where large blocks ask for huge pages, a block that moved keeps every 2 MB of its new
 * reservation able to become one: each aligned 2 MB lies within a single mapping once it is committed.
 * (The kernel never merges moved pages with the new reservation's own, so a move of 2.4 MB once left
 * [2 MB, 4 MB) split between two mappings for the block's whole life: 18,000 page faults per run of
 * bench/app's buffers instead of 8,900.) Read from /proc/self/maps. */
TEST(a_moved_block_keeps_each_aligned_2mb_within_one_mapping)
{
#if !SHARD_RULES || !defined(__linux__)
    SKIP_TEST();
#else
    drained d;
    cache_drain(&d);
    const size_t n = 2 * MB + 400 * KB, grown = 7 * MB, filled = 8 * MB;
    unsigned char *p = shard_malloc(n);
    CHECK(p != NULL);
    fill64(p, n, 0x2d2d);
    unsigned char *q = shard_realloc(p, grown); /* beyond R(n): moves */
    CHECK(q != NULL && q != p);
    CHECK_BLOCK(q, n, 0x2d2d, "a block of %zu moved to %zu", n, grown);
    unsigned char *r = shard_realloc(q, filled); /* in place: the moved block reserves 16 MB */
    CHECK(r == q);
    uintptr_t base = (uintptr_t)r & ~(uintptr_t)(LARGE_GRANULE - 1);
    for (uintptr_t at = base; at + 2 * MB <= base + filled; at += 2 * MB) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int whole = 0;
        while (f && fgets(line, sizeof line, f)) {
            unsigned long lo, hi;
            if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= at && at + 2 * MB <= hi)
                whole = 1;
        }
        if (f)
            fclose(f);
        CHECKF(whole, "[%#lx, +2 MB) of a block moved at %zu bytes committed lies across mappings",
               (unsigned long)at, need(n));
    }
    CHECK_BLOCK(r, n, 0x2d2d, "a block of %zu moved, then grown to %zu", n, filled);
    shard_free(r);
    cache_undrain(&d);
    check_allocator("after the moved block");
#endif
}

#if SHARD_RULES && defined(__linux__)
/* The KB of huge pages (AnonHugePages of /proc/self/smaps) in the aligned 2 MB at `unit`, read/write
 * memory of a block: made read-only while smaps is read, the unit is a mapping of its own there (a
 * huge page stays whole under a change of protection that covers it), and read/write again after. The
 * mapping around it may be as large as a pool, whose other huge pages smaps would count with it; an
 * earlier helper took the mapping that started at most 2 MB below the unit, and failed whenever what
 * earlier tests left in the pools placed it otherwise (the test alone). 0 when the unit is not one
 * read/write mapping. */
static unsigned long huge_kb_at(uintptr_t unit)
{
    if (mprotect((void *)unit, 2 * MB, PROT_READ) != 0)
        return 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long lo = 0, hi = 0, kb, huge = 0;
    int inside = 0;
    while (f != NULL && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = lo == unit && hi == unit + 2 * MB;
        else if (inside && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1)
            huge += kb;
    }
    if (f != NULL)
        fclose(f);
    CHECK(mprotect((void *)unit, 2 * MB, PROT_READ | PROT_WRITE) == 0);
    return huge;
}
#endif

/* The 2 MB a moved block ends in is one mapping from the move on, not only once the block grows to its
 * end: bench/shapes.py's strings writes a string's buffer as soon as realloc moved it, and a 2 MB range
 * that takes faults while its mapping ends inside it takes 4 KB pages for good (10 thousand faults a
 * run, against 2,700). Here a block of 2.1 MB (reserving 6 MB) moves at 6.5 MB, is written at once, then
 * grows in place to 7.9 MB and is written to its end: the block's [6 MB, 8 MB) must be one huge page,
 * where the kernel gives them. */
TEST(a_block_written_as_soon_as_it_moved_gets_a_huge_page_in_the_2mb_it_ends_in)
{
#if !SHARD_RULES || !defined(__linux__)
    SKIP_TEST();
#else
    if (!huge_pages_on())
        SKIP_TEST();
    drained d;
    cache_drain(&d);
    const size_t first = 2 * MB + 100 * KB, moved = 6 * MB + MB / 2, grown = 8 * MB - 100 * KB;
    unsigned char *p = shard_malloc(first); /* reserves 6 MB */
    CHECK(p != NULL);
    fill64(p, first, 0x3e3e);
    unsigned char *q = shard_realloc(p, moved); /* beyond its reservation: moves */
    CHECK(q != NULL && q != p);
    fill64(q, moved, 0x3e3f);
    unsigned char *r = shard_realloc(q, grown); /* in place: a moved block reserves 16 MB */
    CHECK(r == q);
    fill64(r, grown, 0x3e40);
    unsigned long huge = huge_kb_at(((uintptr_t)r & ~(uintptr_t)(LARGE_GRANULE - 1)) + 6 * MB);
    CHECKF(huge >= 2048, "a block moved at 6.5 MB, written, grown to 7.9 MB: %lu KB of huge pages in the "
           "mapping of its [6 MB, 8 MB)", huge);
    CHECK_BLOCK(r, grown, 0x3e40, "a block moved, then grown in place");
    shard_free(r);
    cache_undrain(&d);
    check_allocator("after the block that moved and grew");
#endif
}

/* A fresh block's reservation ends on a 2 MB boundary where large pages are, so that the 2 MB it ends
 * in can be one: a block of 1.5 MB (reserving 4 MB; 3.06 MB before, which left [2 MB, 3.06 MB) in 4 KB
 * pages for good: bench/shapes.py's mixed took 400-500 faults in each such range) grows in place to
 * 3.9 MB and is written to its end: its [2 MB, 4 MB) must be one huge page. */
TEST(a_fresh_block_grown_in_place_to_its_reservations_end_gets_a_huge_page_there)
{
#if !SHARD_RULES || !defined(__linux__)
    SKIP_TEST();
#else
    if (!huge_pages_on())
        SKIP_TEST();
    drained d;
    cache_drain(&d);
    const size_t first = MB + MB / 2, grown = 4 * MB - 100 * KB;
    CHECK_EQ(reservation(first), 4 * MB);
    unsigned char *p = shard_malloc(first);
    CHECK(p != NULL);
    fill64(p, first, 0x3e50);
    unsigned char *q = shard_realloc(p, grown); /* in place: within its reservation */
    CHECK(q == p);
    fill64(q, grown, 0x3e51);
    unsigned long huge = huge_kb_at(((uintptr_t)q & ~(uintptr_t)(LARGE_GRANULE - 1)) + 2 * MB);
    CHECKF(huge >= 2048, "a fresh block of 1.5 MB grown in place to 3.9 MB and written: %lu KB of huge pages in "
           "the mapping of its [2 MB, 4 MB)", huge);
    CHECK_BLOCK(q, grown, 0x3e51, "a fresh block grown in place");
    shard_free(q);
    cache_undrain(&d);
    check_allocator("after the fresh block that grew in place");
#endif
}

/* A fresh block that fills less than a quarter of its last 2 MB leaves that 2 MB on small pages
 * (fresh_end): a block of 2 MB, a power-of-two array whose header puts its last 32 bytes past the 2 MB,
 * written whole, makes one page resident there, not 2 MB (4 MB for a 2 MB array: twice what the peers
 * make resident); one of 2.4 MB, a fifth of its last 2 MB, makes the pages it writes there resident.
 * One of 2.6 MB fills more than a quarter and gets a large page there, as its first 2 MB does. */
TEST(a_fresh_block_that_fills_less_than_a_quarter_of_its_last_2mb_leaves_it_on_small_pages)
{
#if !SHARD_RULES || !defined(__linux__)
    SKIP_TEST();
#else
    if (!huge_pages_on())
        SKIP_TEST();
    enum { CASES = 3 };
    static const size_t sizes[CASES] = {2 * MB, 2 * MB + 400 * KB, 2 * MB + 600 * KB};
    drained d;
    cache_drain(&d);
    unsigned char *blocks[CASES]; /* all live at once: a block that took another's reservation from the
                                   * cache would find its last 2 MB as the other left it */
    for (size_t i = 0; i < CASES; i++) {
        size_t n = sizes[i], tail = need(n) - HUGE_PAGE;
        int small = tail < HUGE_PAGE / 4;
        long above_expected = small ? (long)(tail / LARGE_PAGE) : 512;
        CHECK_EQ(fresh_commit(n), small ? need(n) : 4 * MB);
        unsigned char *p = blocks[i] = shard_malloc(n);
        CHECK(p != NULL);
        if (p == NULL)
            continue;
        fill64(p, n, 0x3e60 + i);
        unsigned char *granule = (unsigned char *)((uintptr_t)p & ~(uintptr_t)(LARGE_GRANULE - 1));
        int first;
        long below = resident_pages(granule, HUGE_PAGE, &first);
        long above = resident_pages(granule + HUGE_PAGE, HUGE_PAGE, &first);
        CHECKF(below == 512, "a fresh block of %zu bytes, written: %ld pages resident in its first 2 MB (a large "
               "page expected)", n, below);
        CHECKF(above == above_expected, "a fresh block of %zu bytes, written: %ld pages resident in its last 2 MB, "
               "expected %ld", n, above, above_expected);
    }
    for (size_t i = 0; i < CASES; i++)
        if (blocks[i] != NULL) {
            CHECK_BLOCK(blocks[i], sizes[i], 0x3e60 + i, "a fresh block of %zu bytes", sizes[i]);
            shard_free(blocks[i]);
        }
    cache_undrain(&d);
    check_allocator("after the fresh blocks' last 2 MB");
#endif
}

/* Earned tails (src/large.c; SHARDMM_EARNED_TAILS, on by default, Linux): a fresh block's last 2 MB, all
 * of a block of 1-2 MB, is a large page only while the fresh blocks freed lately had at least half of
 * theirs resident; until then, and for one fresh block in eight after, the block commits its need and
 * its last 2 MB stays on small pages, to be looked at when it is freed. Blocks of 1.5 MB used at their
 * first 8 KB, eight at a time: after one set, every fresh one holds those pages resident and a couple
 * more, not 2 MB (on b477873 every one held 512 pages); one block written whole and freed makes seven of
 * the next eight fresh ones commit their 2 MB and hold a large page from their first write, the eighth
 * its need; once those are freed, blocks are left on small pages again. A block that a realloc moves
 * into the large range is a block that grows: it commits its 2 MB whatever the last blocks did. */
#if SHARD_RULES && defined(__linux__)
#define TAIL_BLOCKS 8
static void tails_set(unsigned char **p, size_t n, size_t used, uint64_t seed, size_t *commits, long *resident)
{
    for (int i = 0; i < TAIL_BLOCKS; i++) {
        shard_stats a, b;
        shard_get_stats(&a);
        p[i] = shard_malloc(n);
        shard_get_stats(&b);
        CHECK(p[i] != NULL);
        if (p[i] == NULL)
            continue;
        commits[i] = b.committed - a.committed;
        fill64(p[i], used, seed + (uint64_t)i);
        int first;
        resident[i] = resident_pages((unsigned char *)((uintptr_t)p[i] & ~(uintptr_t)(LARGE_GRANULE - 1)), HUGE_PAGE,
                                     &first);
    }
}

static void tails_free(unsigned char **p, size_t used, uint64_t seed)
{
    for (int i = 0; i < TAIL_BLOCKS; i++)
        if (p[i] != NULL) {
            CHECK_BLOCK(p[i], used, seed + (uint64_t)i, "block %d of a set", i);
            shard_free(p[i]);
        }
    shard_collect(); /* no spare nor cached block: the next set is fresh */
}
#endif

TEST(earned_tails_leave_a_fresh_block_on_small_pages_until_the_blocks_freed_were_used_to_their_ends)
{
#if !SHARD_RULES || !defined(__linux__)
    SKIP_TEST();
#else
    const char *v = getenv("SHARDMM_EARNED_TAILS");
    if (!huge_pages_on() || (v != NULL && strcmp(v, "0") == 0))
        SKIP_TEST();
    const size_t n = MB + MB / 2, used = 8 * KB, small_most = 4; /* the header's page, 8 KB and a colour's */
    unsigned char *p[TAIL_BLOCKS];
    size_t commits[TAIL_BLOCKS];
    long resident[TAIL_BLOCKS];
    drained d;
    cache_drain(&d);
    shard_collect();
    tails_set(p, n, used, 0x7a11, commits, resident); /* one of them at least is looked at */
    tails_free(p, used, 0x7a11);
    tails_set(p, n, used, 0x7a21, commits, resident);
    for (int i = 0; i < TAIL_BLOCKS; i++)
        CHECKF(resident[i] >= 2 && resident[i] <= (long)small_most && commits[i] < HUGE_PAGE,
               "a fresh block of 1.5 MB used at its first 8 KB, after blocks so used: %ld pages resident in its 2 MB "
               "(at most %zu expected), %zu bytes committed", resident[i], small_most, commits[i]);
    tails_free(p, used, 0x7a21);

    unsigned char *whole = shard_malloc(n);
    CHECK(whole != NULL);
    if (whole != NULL) {
        fill64(whole, n, 0x7a31);
        CHECK_BLOCK(whole, n, 0x7a31, "a fresh block written whole");
        shard_free(whole);
    }
    shard_collect();
    tails_set(p, n, used, 0x7a41, commits, resident);
    int large = 0, small = 0, huge = 0;
    for (int i = 0; i < TAIL_BLOCKS; i++) {
        large += commits[i] >= HUGE_PAGE;
        small += commits[i] < HUGE_PAGE && resident[i] <= (long)small_most;
        huge += resident[i] == 512;
    }
    CHECKF(large == TAIL_BLOCKS - 1 && small == 1 && huge >= 1,
           "after a block written whole: %d of %d fresh blocks committed their 2 MB (%d with a large page), %d their "
           "need only, on small pages (7, at least 1 and 1 expected)", large, TAIL_BLOCKS, huge, small);
    tails_free(p, used, 0x7a41);
    tails_set(p, n, used, 0x7a51, commits, resident);
    for (int i = 0; i < TAIL_BLOCKS; i++)
        CHECKF(resident[i] <= (long)small_most && commits[i] < HUGE_PAGE,
               "a fresh block after a set used at its start again: %ld pages resident, %zu bytes committed", resident[i],
               commits[i]);
    tails_free(p, used, 0x7a51);

    unsigned char *grown = shard_malloc(900 * KB);
    CHECK(grown != NULL);
    if (grown != NULL) {
        fill64(grown, 900 * KB, 0x7a61);
        unsigned char *q = shard_realloc(grown, n);
        CHECK(q != NULL);
        if (q != NULL) {
            int first;
            unsigned char *granule = (unsigned char *)((uintptr_t)q & ~(uintptr_t)(LARGE_GRANULE - 1));
            long in = resident_pages(granule, HUGE_PAGE, &first);
            CHECKF(in == 512, "a block of 900 KB moved by realloc to 1.5 MB: %ld pages resident in its 2 MB (a large "
                   "page expected)", in);
            CHECK_BLOCK(q, 900 * KB, 0x7a61, "a block moved into the large range");
            grown = q;
        }
        shard_free(grown);
    }
    cache_undrain(&d);
    check_allocator("after the earned tails");
#endif
}

TEST(realloc_grows_a_large_block_in_place_up_to_its_reservation_and_moves_with_1_16_beyond)
{
    NEEDS_NO_COLOURS();
    static const struct {
        size_t first;
        size_t steps[5];
    } plans[] = {
        { LARGE_MIN, { 2 * MB, 2 * MB + 64 * KB - 32, 2 * MB + 64 * KB - 31, 4 * MB + 448 * KB - 32,
                       4 * MB + 448 * KB - 31 } },
        { 8 * MB - 31, { 12 * MB, 16 * MB + 64 * KB - 32, 16 * MB + 64 * KB - 31, 0, 0 } },
        { 40 * MB, { 80 * MB + 64 * KB - 32, 2 * MB, 80 * MB + 64 * KB - 32, 80 * MB + 64 * KB - 31, 0 } },
    };
    drained d;
    cache_drain(&d);
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        struct tracked b;
        if (!track_alloc(&b, plans[i].first, plans[i].first, 0x4000 + 16 * i))
            continue;
        for (size_t j = 0; j < 5 && plans[i].steps[j]; j++)
            if (!track_realloc(&b, plans[i].steps[j], &d))
                break;
        shard_free(b.p);
        drain_into(&d);
    }
    cache_undrain(&d);
    check_allocator("after growing large blocks");
}

/* The reservation beyond need is need, but at most 1 GB: a block of 1.5 GB stays in place up to
 * 2.5 GB + 64 KB (need + 1 GB, rounded to 64 KB) and moves one page beyond (with 2 need it would stay up
 * to 3 GB). Shrunk to 2 MB on the way, so that the move copies little; the memory is committed, never
 * touched beyond the first MB. */
TEST(the_reservation_of_a_large_block_is_need_plus_need_but_at_most_1gb_more)
{
    NEEDS_NO_COLOURS();
    const size_t n = GB + GB / 2, r = reservation(n);
    drained d;
    cache_drain(&d);
    struct tracked b;
    if (track_alloc(&b, n, MB, 0x4100)) {
        if (track_realloc(&b, with_need(r), &d) && track_realloc(&b, 2 * MB, &d))
            track_realloc(&b, with_need(r) + 1, &d);
        shard_free(b.p);
    }
    cache_undrain(&d);
    check_allocator("after the 1 GB cap of the reservation");
}

/* A fresh block of 1.1 MB reserves about its size and as much again as headroom: exactly R(n), 2.25 MB
 * (need 1.1 MB + 4 KB, twice that rounded up to 64 KB; 4 MB where large pages round it up to 2 MB),
 * not the 16 MB that the seed's floor made it. A
 * malloc that also took a reservation for the allocator's own tables (4 MB, now and then when the
 * segment map grows) is not counted: the next block is measured. */
TEST(a_fresh_block_of_1_1mb_reserves_its_size_and_its_headroom_not_16mb)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    enum { TRIES = 3 };
    const size_t n = 11 * MB / 10;
    unsigned char *blocks[TRIES] = { 0 };
    size_t grew = 0, tries = 0;
    drained d;
    cache_drain(&d);
    while (tries < TRIES) {
        shard_stats a = stats_now();
        unsigned char *p = shard_malloc(n);
        shard_stats b = stats_now();
        CHECKF(p != NULL, "shard_malloc(%zu) returned NULL", n);
        if (!p)
            break;
        blocks[tries++] = p;
        fill64(p, n, 0x4180 + tries);
        CHECK_CACHE(b, 0, 0, "after shard_malloc(%zu) on a drained cache", n);
        grew = b.reserved - a.reserved;
        if (grew != reservation(n) + META_RESERVE)
            break;
    }
    CHECKF(grew >= 22 * MB / 10 && grew <= (COMMITS_WHOLE_LARGE_PAGES ? 4 * MB : 25 * MB / 10),
           "shard_malloc(%zu): reserved grew by %zu bytes (%.2f MB), expected 2.2-2.5 MB (4 MB with large "
           "pages): the block and as much again", n, grew, (double)grew / MB);
    CHECK_EQ(grew, reservation(n));
    for (size_t i = 0; i < tries; i++) {
        CHECK_BLOCK(blocks[i], n, 0x4180 + i + 1, "block %zu of 1.1 MB", i);
        shard_free(blocks[i]);
    }
    cache_undrain(&d);
    check_allocator("after the 1.1 MB blocks");
#endif
}

/* A fresh block's headroom is the largest need asked for since the high last came down, when that is
 * more than its own, but at most 4 times its own (src/large.c, span_for): a 5 MB block made while a 24 MB
 * one lives reserves room for 24 MB more, so that once freed it serves the next 24 MB request itself.
 * Without it the cache held blocks too small for the large requests beside the large ones, each with
 * the pages its lives had written (bench/shapes.c's large-ends: 139.5 MB at one thread against 97.9).
 * A 2 MB block after a 64 MB one takes room for 4 times its need, not 64 MB. */
TEST(a_fresh_block_made_after_a_larger_request_takes_headroom_for_it_up_to_4_times_its_need)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    const size_t big = 24 * MB, small = 5 * MB, huge = 64 * MB, little = 2 * MB;
    drained d;
    cache_drain(&d);
    unsigned char *a = shard_malloc(big);
    shard_stats s0 = stats_now();
    unsigned char *b = shard_malloc(small);
    shard_stats s1 = stats_now();
    CHECK(a != NULL && b != NULL);
    if (!a || !b)
        return;
    fill64(a, big, 0x4200);
    fill64(b, small, 0x4210);
    size_t grew = s1.reserved - s0.reserved;
    CHECKF(grew_by_block(grew, reservation_after(small, need(big))),
           "shard_malloc(%zu) with a block of %zu live: reserved grew by %zu, expected %zu (%zu without the "
           "larger request)", small, big, grew, reservation_after(small, need(big)), reservation(small));
    CHECK_BLOCK(b, small, 0x4210, "the block of %zu made while one of %zu lives", small, big);
    shard_free(b);
    unsigned char *c = shard_malloc(big);
    CHECKF(c == b, "shard_malloc(%zu) = %p: not the cached block of %zu at %p, whose reservation holds it", big,
           (void *)c, small, (void *)b);
    if (c != NULL) {
        fill64(c, big, 0x4220);
        CHECK_BLOCK(c, big, 0x4220, "the block of %zu taken from the cached one of %zu", big, small);
    }
    CHECK_BLOCK(a, big, 0x4200, "the first block of %zu", big);
    shard_free(c);
    shard_free(a);
    forget_needs();
    unsigned char *h = shard_malloc(huge);
    s0 = stats_now();
    unsigned char *l = shard_malloc(little);
    s1 = stats_now();
    CHECK(h != NULL && l != NULL);
    if (!h || !l)
        return;
    fill64(h, huge, 0x4230);
    fill64(l, little, 0x4240);
    grew = s1.reserved - s0.reserved;
    CHECKF(grew_by_block(grew, reservation_after(little, need(huge))),
           "shard_malloc(%zu) with a block of %zu live: reserved grew by %zu, expected %zu (4 times its need)",
           little, huge, grew, reservation_after(little, need(huge)));
    CHECK(reservation_after(little, need(huge)) < reservation(huge));
    CHECK_BLOCK(l, little, 0x4240, "the block of %zu made while one of %zu lives", little, huge);
    CHECK_BLOCK(h, huge, 0x4230, "the block of %zu", huge);
    shard_free(l);
    shard_free(h);
    cache_undrain(&d);
    check_allocator("after blocks made after larger ones");
#endif
}

/* Shrinking within the committed part is in place; the tail goes back to the OS exactly when the new need
 * is below half of what is committed (need == half keeps it, a page less gives back all beyond need);
 * a block that kept its tail grows back into it without committing. To 1 MB or less the block moves. */
TEST(shrinking_below_half_of_the_committed_size_decommits_the_tail_and_less_keeps_it)
{
    NEEDS_NO_COLOURS();
    static const struct {
        size_t first;
        size_t steps[8];
    } plans[] = {
        { 4 * MB - 32, { 2 * MB - 32, 4 * MB - 32, 2 * MB - 33, 2 * MB - 4128, 3 * MB, LARGE_MIN, MB, 0 } },
        { 64 * MB, { 32 * MB - 31, 32 * MB - 32, LARGE_MIN, 100, 0 } },
    };
    drained d;
    cache_drain(&d);
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        struct tracked b;
        if (!track_alloc(&b, plans[i].first, plans[i].first, 0x4200 + 16 * i))
            continue;
        for (size_t j = 0; j < 8 && plans[i].steps[j]; j++)
            if (!track_realloc(&b, plans[i].steps[j], &d))
                break;
        CHECK_BLOCK(b.p, b.valid, b.seed, "block shrunk step by step");
        shard_free(b.p);
        drain_into(&d);
    }
    cache_undrain(&d);
    check_allocator("after shrinking large blocks");
}

/* live_large_bytes and live_large_committed: the usable sizes of the live large blocks and the memory
 * they keep committed (headers included). On a drained cache they move by exactly what the rules give
 * each block (track_alloc, track_realloc): fresh blocks, aligned ones (2 MB: the block 2 MB into its
 * granule; 4 MB: a far block, its header page below it), growth in place, a shrink that keeps its
 * memory and one that gives the tail back, a move beyond the reservation, a move to a medium block
 * (then in live_medium_bytes), and frees by the thread that made a block and by another one. Every
 * fresh commit is in the process's committed bytes too. */
struct held_block {
    unsigned char *p;
    size_t n;
    uint64_t seed;
};

static void *check_and_free_held(void *arg)
{
    struct held_block *b = arg;
    CHECK_BLOCK(b->p, b->n, b->seed, "large block freed by another thread");
    shard_free(b->p);
    return NULL;
}

#if SHARD_RULES
/* The statistics hold `bytes` usable and `committed` committed bytes of live large blocks beyond s0's. */
#define CHECK_LARGE_BYTES(s0, bytes, committed, ...)                                                     \
    do {                                                                                                 \
        shard_stats s_ = stats_now();                                                                    \
        size_t b_ = (s0).live_large_bytes + (bytes), c_ = (s0).live_large_committed + (committed);       \
        if (s_.live_large_bytes != b_ || s_.live_large_committed != c_) {                                \
            char what_[200];                                                                             \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                                  \
            harness_fail(__FILE__, __LINE__, "%s: live_large_bytes %zu, live_large_committed %zu; expected "  \
                         "%zu, %zu", what_, s_.live_large_bytes, s_.live_large_committed, b_, c_);        \
        }                                                                                                \
    } while (0)
#endif

TEST(live_large_bytes_and_committed_follow_allocation_resize_move_and_free)
{
    NEEDS_NO_COLOURS();
    enum { TRACKED = 2 };
    static const size_t first[TRACKED] = { LARGE_MIN, 8 * MB };
    static const size_t steps[TRACKED][3] = { { 2 * MB, MB, 0 }, { 6 * MB, 2 * MB, 20 * MB } };
    struct tracked b[TRACKED];
    size_t bytes = 0, committed = 0;
    drained d;
    cache_drain(&d);
    size_t drained_at_start = d.count;
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    for (size_t i = 0; i < TRACKED; i++) {
        if (!track_alloc(&b[i], first[i], first[i], 0x4e00 + 16 * i)) {
            b[i].p = NULL;
            continue;
        }
        bytes += fresh_usable(first[i]);
        committed += fresh_commit(first[i]);
#if SHARD_RULES
        CHECK_LARGE_BYTES(s0, bytes, committed, "fresh block of %zu bytes", first[i]);
#endif
    }
    /* Aligned blocks, fresh: 2 MB aligned starts 2 MB into its granule and commits from the header to its
     * end (commit_end of that, its reservation twice it); 4 MB aligned commits its header page and
     * itself. */
    static const size_t aligned_size[2] = { 2 * MB + 1, LARGE_MIN }, align[2] = { 2 * MB, 4 * MB };
    unsigned char *aligned[2] = { NULL, NULL };
#if SHARD_RULES
    for (size_t i = 0; i < 2; i++) {
        shard_stats a = stats_now();
        aligned[i] = shard_malloc_aligned(aligned_size[i], align[i]);
        CHECKF(aligned[i] != NULL && (uintptr_t)aligned[i] % align[i] == 0, "shard_malloc_aligned(%zu, %zu) = %p",
               aligned_size[i], align[i], (void *)aligned[i]);
        if (!aligned[i])
            continue;
        size_t u = round_up(aligned_size[i], LARGE_PAGE);
        size_t c = i == 0 ? fresh_end(align[i] + u, 2 * (align[i] + u)) : LARGE_PAGE + u;
        CHECK_EQ(shard_usable_size(aligned[i]), u);
        fill64(aligned[i], u, 0x4e80 + i);
        bytes += u;
        committed += c;
        CHECK_LARGE_BYTES(s0, bytes, committed, "block of %zu bytes aligned to %zu", aligned_size[i], align[i]);
        CHECK_COMMITTED(a.committed, stats_now().committed, (long long)c, 1, "aligned block of %zu bytes",
                        aligned_size[i]);
    }
#endif
    /* The tracked blocks through their steps (track_realloc checks usable sizes and committed bytes). */
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < TRACKED; i++) {
            if (!b[i].p || !steps[i][k])
                continue;
            size_t was_usable = shard_usable_size(b[i].p), was_committed = b[i].c;
#if SHARD_RULES
            shard_stats a = stats_now();
#endif
            size_t drained_before = d.count;
            if (!track_realloc(&b[i], steps[i][k], &d)) {
                b[i].p = NULL; /* lost to the test; the failure is reported */
                continue;
            }
            size_t m = steps[i][k];
            bytes -= was_usable;
            committed -= was_committed;
            if (m > MEDIUM_MAX) {
                bytes += shard_usable_size(b[i].p);
                committed += b[i].c;
            }
            /* A move that left the old block in the cache: track_realloc drained it, a live block of
             * 1 MB + 1 bytes again, which keeps the old block's memory (far below the excess it trims). */
            CHECKF(d.count - drained_before <= 1, "realloc to %zu: %zu blocks drained from the cache", m,
                   d.count - drained_before);
            if (d.count - drained_before == 1) {
                bytes += fresh_usable(LARGE_MIN);
                committed += was_committed;
            }
#if SHARD_RULES
            CHECK_LARGE_BYTES(s0, bytes, committed, "realloc of a block of usable size %zu to %zu", was_usable, m);
            if (m <= MEDIUM_MAX) {
                shard_stats s = stats_now();
                CHECKF(s.live_medium_bytes == a.live_medium_bytes + shard_usable_size(b[i].p),
                       "realloc to %zu: live_medium_bytes %zu -> %zu, the medium block's usable size %zu", m,
                       a.live_medium_bytes, s.live_medium_bytes, shard_usable_size(b[i].p));
            }
#else
            (void)was_committed;
#endif
            if (m > MEDIUM_MAX)
                continue;
            /* A medium block now: freed here, out of the way of the large bytes. */
            CHECK_BLOCK(b[i].p, b[i].valid, b[i].seed, "block moved to medium");
            shard_free(b[i].p);
            b[i].p = NULL;
        }
    /* Another thread frees the 2 MB aligned block: large blocks have no owner, out at once. */
    if (aligned[0]) {
        struct held_block h = { aligned[0], round_up(aligned_size[0], LARGE_PAGE), 0x4e80 };
        run_thread(check_and_free_held, &h);
        bytes -= h.n;
        committed -= fresh_end(align[0] + h.n, 2 * (align[0] + h.n));
#if SHARD_RULES
        CHECK_LARGE_BYTES(s0, bytes, committed, "after another thread freed the 2 MB-aligned block");
#endif
    }
    if (aligned[1]) {
        size_t u = round_up(aligned_size[1], LARGE_PAGE);
        CHECK_BLOCK(aligned[1], u, 0x4e81, "4 MB-aligned block");
        shard_free(aligned[1]);
    }
    for (size_t i = 0; i < TRACKED; i++)
        if (b[i].p) {
            CHECK_BLOCK(b[i].p, b[i].valid, b[i].seed, "tracked block %zu", i);
            shard_free(b[i].p);
        }
    /* The old blocks drained back: their frees end the count where it began. */
    for (; d.count > drained_at_start; d.count--)
        shard_free(d.blocks[d.count - 1]);
#if SHARD_RULES
    CHECK_LARGE_BYTES(s0, 0, 0, "after every block was freed");
#endif
    cache_undrain(&d);
    check_allocator("after the large byte counts");
}

/* ---- calloc ---- */

/* calloc of a large size is zero over the whole usable size when it takes a dirty cached block: of the
 * same size, of a larger committed size (kept, and growing into it keeps the zeros), and of a smaller one
 * (committed up to need in place) - with the count and the size given either way round. */
TEST(calloc_of_a_large_size_is_zero_over_its_usable_size_on_a_dirty_cached_block)
{
    NEEDS_NO_COLOURS();
    static const struct {
        size_t dirty;        /* the block freed full of 0xA5 */
        size_t count, size;  /* the calloc that takes it */
    } cases[] = {
        { 8 * MB, 1, 8 * MB },
        { 8 * MB, 8 * MB, 1 },
        { 6 * MB - 32, 512, 4096 },       /* 2 MB from a block holding 6 MB: keeps it */
        { 16 * MB - 32, 512, 4096 },      /* 2 MB from a block holding 16 MB: split where blocks are */
        { 4 * MB, 3, 2 * MB + 5 },        /* 6 MB + 15 from a block holding 4 MB: commits the rest */
        { 5 * MB + 3, 4096, 1025 },       /* 4 MB + 4 KB */
    };
    drained d;
    cache_drain(&d);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t total = cases[i].count * cases[i].size;
        unsigned char *p = shard_malloc(cases[i].dirty), *q;
        CHECK(p != NULL);
        if (!p)
            continue;
        size_t du = shard_usable_size(p);
        memset(p, 0xA5, du);
        shard_free(p);
#if SHARD_RULES
        shard_stats a = stats_now();
        CHECK_CACHE(a, 1, fresh_commit(cases[i].dirty), "after freeing the dirty block of case %zu", i);
#endif
        q = shard_calloc(cases[i].count, cases[i].size);
        CHECKF(q != NULL, "shard_calloc(%zu, %zu) returned NULL", cases[i].count, cases[i].size);
        if (!q)
            continue;
        size_t u = shard_usable_size(q);
        CHECK(u >= total);
        CHECK_ZERO(q, u, "shard_calloc(%zu, %zu) on a dirty block of %zu bytes", cases[i].count, cases[i].size,
                   cases[i].dirty);
#if SHARD_RULES
        shard_stats s = stats_now();
        size_t held = fresh_commit(cases[i].dirty), grown = commit_end(need(total), reservation(cases[i].dirty));
        size_t keep = split_keep(total);
        int split = take_splits(held, total);
        CHECKF(q == p, "shard_calloc(%zu, %zu) did not take the cached block of %zu bytes", cases[i].count,
               cases[i].size, cases[i].dirty);
        CHECK_EQ(u, fresh_usable(total));
        if (split) {
            CHECK_CACHE(s, 1, held - keep, "after shard_calloc(%zu, %zu) split a block", cases[i].count, cases[i].size);
            CHECK_COMMITTED(a.committed, s.committed, 0, 0, "shard_calloc(%zu, %zu) splitting a cached block holding %zu", cases[i].count,
                            cases[i].size, held);
        } else {
            CHECK_CACHE(s, 0, 0, "after shard_calloc(%zu, %zu)", cases[i].count, cases[i].size);
            CHECK_COMMITTED(a.committed, s.committed, held >= need(total) ? 0 : (long long)(grown - held), 0,
                            "shard_calloc(%zu, %zu) on a cached block holding %zu", cases[i].count, cases[i].size,
                            held);
        }
        if (!split && held > need(total)) {
            /* Growing into the kept memory: in place, nothing committed, the zeros stay. */
            unsigned char *r = shard_realloc(q, with_need(held));
            CHECK(r != NULL);
            if (r) {
                shard_stats g = stats_now();
                CHECKF(r == q, "growing a calloc block into its kept memory moved it");
                CHECK_COMMITTED(s.committed, g.committed, 0, 0, "growing into the kept memory");
                CHECK_ZERO(r, u, "calloc block grown into its kept memory");
                q = r;
            }
        }
#endif
        shard_free(q);
        drain_into(&d);
    }
    cache_undrain(&d);
    check_allocator("after calloc on dirty blocks");
}

/* ---- the cache: which block a malloc takes ---- */

/* Four cached blocks (committed 6, 4, 8 and 2 MB; reservations 12, 8, 16 and 20 MB), freed in that
 * order: need 3 MB + 4 KB takes the smallest committed-enough (4 MB, neither the oldest nor the newest);
 * need 10 MB, which none holds, the most committed (8 MB, committing 2 MB in place); need 17 MB only fits
 * the 20 MB reservation, though another holds more (committing up to commit_end); need 17 MB again fits
 * none and is fresh; 1 MB + 1 takes the last. */
TEST(malloc_takes_the_smallest_cached_block_committed_enough_else_the_most_committed_that_fits)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    enum { A, B, C, D, N };
    static const size_t sizes[N] = { 6 * MB - 32, 4 * MB - 32, 8 * MB - 32, 10 * MB - 32 };
    unsigned char *blocks[N];
    drained d;
    cache_drain(&d);
    for (int i = 0; i < N; i++) {
        blocks[i] = shard_malloc(sizes[i]);
        CHECK(blocks[i] != NULL);
        if (blocks[i])
            fill_edges(blocks[i], sizes[i], 0x5000 + (uint64_t)i);
    }
    unsigned char *dd = blocks[D] ? shard_realloc(blocks[D], 2 * MB - 32) : NULL; /* 2 MB in a 20 MB reservation */
    CHECK(dd == blocks[D]);
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= blocks[i] != NULL;
    if (!ok || dd != blocks[D]) {
        for (int i = 0; i < N; i++)
            shard_free(i == D && dd ? dd : blocks[i]);
        cache_undrain(&d);
        return;
    }
    const size_t held[N] = { 6 * MB, 4 * MB, 8 * MB, 2 * MB };
    for (int i = 0; i < N; i++)
        shard_free(blocks[i]);
    shard_stats s = stats_now();
    CHECK_CACHE(s, 4, held[A] + held[B] + held[C] + held[D], "four blocks freed");
    static const struct {
        size_t n;
        int expect;  /* the block taken, or -1 for a fresh one */
        const char *why;
    } takes[] = {
        { 3 * MB + 4064, B, "the smallest committed-enough" },
        { 10 * MB - 32, C, "none committed enough: the most committed" },
        { 17 * MB - 32, D, "the only one whose reservation fits" },
        { 17 * MB - 32, -1, "none fits: fresh" },
        { LARGE_MIN, A, "the last one" },
    };
    enum { T = sizeof takes / sizeof takes[0] };
    unsigned char *got[T];
    size_t cached = 4, bytes = s.large_cached_bytes;
    for (size_t i = 0; i < T; i++) {
        shard_stats a = stats_now();
        got[i] = shard_malloc(takes[i].n);
        CHECK(got[i] != NULL);
        if (!got[i])
            continue;
        shard_stats b = stats_now();
        int e = takes[i].expect;
        int which = -1;
        for (int j = 0; j < N; j++)
            if (got[i] == blocks[j])
                which = j;
        CHECKF(which == e, "malloc(%zu) (%s): took block %d (%p), expected %d", takes[i].n, takes[i].why, which,
               (void *)got[i], e);
        CHECK_EQ(shard_usable_size(got[i]), fresh_usable(takes[i].n));
        if (e >= 0) {
            cached--;
            bytes -= held[e];
            size_t end = commit_end(need(takes[i].n), reservation(sizes[e]));
            long long grew = held[e] >= need(takes[i].n) ? 0 : (long long)(end - held[e]);
            CHECK_COMMITTED(a.committed, b.committed, grew, 0, "malloc(%zu) taking the block holding %zu", takes[i].n,
                            held[e]);
            CHECK_EQ(b.reserved, a.reserved);
        } else {
            CHECK_COMMITTED(a.committed, b.committed, (long long)fresh_commit(takes[i].n), 1, "malloc(%zu) fresh",
                            takes[i].n);
        }
        CHECK_CACHE(b, cached, bytes, "after malloc(%zu) (%s)", takes[i].n, takes[i].why);
        fill64(got[i], shard_usable_size(got[i]), 0x5100 + i);
    }
    for (size_t i = 0; i < T; i++)
        if (got[i]) {
            CHECK_BLOCK(got[i], shard_usable_size(got[i]), 0x5100 + i, "block %zu taken from the cache", i);
            shard_free(got[i]);
        }
    cache_undrain(&d);
    check_allocator("after the cache choice");
#endif
}

/* Of cached blocks that fit a request equally well (the same committed memory), malloc takes the one freed
 * last: its memory is the likeliest to be in the processor's caches still. The oldest was taken before, and
 * a program that turns its large buffers over among smaller blocks wrote to cold memory: bench/shapes.c's
 * turnover took 1.3-1.6 times as long on 1-8 threads (bench/results/2026-12-05-cache-recent.md). */
TEST(of_cached_blocks_that_fit_equally_malloc_takes_the_one_freed_last)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    enum { N = 3 };
    const size_t n = 3 * MB - 32;
    unsigned char *blocks[N];
    drained d;
    cache_drain(&d);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        blocks[i] = shard_malloc(n);
        CHECK(blocks[i] != NULL);
        ok &= blocks[i] != NULL;
        if (blocks[i])
            fill_edges(blocks[i], n, 0x5200 + (uint64_t)i);
    }
    if (!ok) {
        for (int i = 0; i < N; i++)
            shard_free(blocks[i]);
        cache_undrain(&d);
        return;
    }
    for (int i = 0; i < N; i++)
        shard_free(blocks[i]);
    shard_stats s = stats_now();
    CHECK_EQ(s.large_cached, (size_t)N);
    for (int i = N; i-- > 0;) {
        unsigned char *p = shard_malloc(n);
        CHECKF(p == blocks[i], "malloc %d after the frees: %p, expected block %d (%p), freed %s", N - i, (void *)p, i,
               (void *)blocks[i], i == N - 1 ? "last" : "before the ones taken");
        blocks[i] = p;
        if (p)
            fill_edges(p, n, 0x5300 + (uint64_t)i);
    }
    for (int i = 0; i < N; i++) {
        if (blocks[i])
            CHECK_EDGES(blocks[i], n, 0x5300 + (uint64_t)i, "block %d taken again", i);
        shard_free(blocks[i]);
    }
    cache_undrain(&d);
    check_allocator("after the cache's choice among equals");
#endif
}

/* Of cached blocks that fit equally well, a thread takes one it freed itself before one another thread
 * freed later: its own is likelier in its core's caches. The main thread frees A, another thread then
 * frees B; the main thread's malloc takes A, the other thread's B. With the freed-last rule alone both
 * took B first, and bench/shapes.c's turnover took 1.2 and 1.1 times as long on 2 and 8 threads
 * (bench/results/2026-12-05-cache-recent.md). */
static unsigned char *own_block, *own_taken;

static void *free_then_take(void *arg)
{
    (void)arg;
    shard_free(own_block);
    return NULL;
}

static void *take_one(void *arg)
{
    own_taken = shard_malloc((size_t)(uintptr_t)arg);
    return NULL;
}

TEST(of_cached_blocks_that_fit_equally_a_thread_takes_one_it_freed_itself)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    const size_t n = 3 * MB - 32;
    drained d;
    cache_drain(&d);
    unsigned char *a = shard_malloc(n), *b = shard_malloc(n);
    CHECK(a != NULL && b != NULL);
    if (a == NULL || b == NULL) {
        shard_free(a);
        shard_free(b);
        cache_undrain(&d);
        return;
    }
    fill_edges(a, n, 0x5400);
    fill_edges(b, n, 0x5401);
    shard_free(a);
    own_block = b;
    thread_t t;
    CHECK(thread_start(&t, free_then_take, NULL) == 0);
    thread_join(t);
    CHECK_EQ(stats_now().large_cached, (size_t)2);
    unsigned char *mine = shard_malloc(n);
    CHECKF(mine == a, "the main thread took %p: expected %p (freed by it), not %p (freed later by another thread)",
           (void *)mine, (void *)a, (void *)b);
    CHECK(thread_start(&t, take_one, (void *)(uintptr_t)n) == 0);
    thread_join(t);
    CHECKF(own_taken == b, "the other thread took %p: expected %p", (void *)own_taken, (void *)b);
    if (mine != NULL)
        fill_edges(mine, n, 0x5402);
    if (own_taken != NULL)
        fill_edges(own_taken, n, 0x5403);
    if (mine != NULL)
        CHECK_EDGES(mine, n, 0x5402, "the main thread's block");
    if (own_taken != NULL)
        CHECK_EDGES(own_taken, n, 0x5403, "the other thread's block");
    shard_free(mine);
    shard_free(own_taken);
    cache_undrain(&d);
    check_allocator("after the cache's choice by thread");
#endif
}

/* A cached block taken for a smaller size gives back its committed memory beyond need when that excess is
 * both above 4 need and above 16 MB, and keeps it otherwise: 80 MB for need 16 MB (an excess of exactly
 * 4 need) is kept and growing back into it commits nothing, for a page less it is trimmed, down to
 * commit_end of its need (and growing a page beyond that commits again); 64 MB for need 16 MB - 4 KB (48 MB more, but not 4 need) is kept; 20 MB for
 * need 4 MB (exactly 16 MB more) is kept, for a page less trimmed; 40 MB for need 12 MB - 4 KB (28 MB
 * more, but not 4 need) is kept. */
TEST(a_cached_block_taken_for_a_smaller_size_gives_back_an_excess_beyond_4x_and_16mb)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (SPLITS_CACHED)
        SKIP_TEST(); /* such a block is split before any of this (the next test) */
    static const struct {
        size_t block;   /* committed with_need(block) */
        size_t n;       /* the malloc that takes it */
    } cases[] = {
        { 80 * MB, 16 * MB - 32 },  { 80 * MB, 16 * MB - 4128 }, { 64 * MB, 16 * MB - 4128 },
        { 20 * MB, 4 * MB - 32 },   { 20 * MB, 4 * MB - 4128 },  { 40 * MB, 12 * MB - 4128 },
    };
    enum { N = sizeof cases / sizeof cases[0] };
    unsigned char *kept[N] = { 0 };
    drained d;
    cache_drain(&d);
    for (size_t i = 0; i < N; i++) {
        size_t held = cases[i].block, n = cases[i].n;
        unsigned char *p = shard_malloc(with_need(held)), *q;
        CHECK(p != NULL);
        if (!p)
            continue;
        fill_edges(p, with_need(held), 0x5200 + i);
        shard_free(p);
        shard_stats a = stats_now();
        CHECK_CACHE(a, 1, held, "a block of %zu bytes committed, freed", held);
        q = shard_malloc(n);
        CHECK(q != NULL);
        if (!q)
            continue;
        kept[i] = q;
        shard_stats b = stats_now();
        int trims = take_trims(held, n);
        size_t r_held = reservation(with_need(held)), trimmed_to = tail_start(need(n), held);
        CHECKF(q == p, "malloc(%zu) did not take the only cached block", n);
        CHECK_EQ(shard_usable_size(q), fresh_usable(n));
        CHECK_CACHE(b, 0, 0, "after malloc(%zu) took the block", n);
        CHECK_COMMITTED(a.committed, b.committed, trims ? -(long long)(held - trimmed_to) : 0, 0,
                        "malloc(%zu) taking a block holding %zu (%s)", n, held, trims ? "trimmed" : "kept");
        fill64(q, shard_usable_size(q), 0x5210 + i);
        /* Growing back: free into kept memory, or committing again what was trimmed. */
        size_t to = trims ? with_need(trimmed_to + LARGE_PAGE) : with_need(held);
        unsigned char *r = shard_realloc(q, to);
        CHECK(r != NULL);
        if (!r)
            continue;
        kept[i] = r;
        shard_stats c = stats_now();
        CHECKF(r == q, "growing a taken block to %zu moved it", to);
        CHECK_COMMITTED(b.committed, c.committed,
                        trims ? (long long)(commit_end(trimmed_to + LARGE_PAGE, r_held) - trimmed_to) : 0, 0,
                        "growing a block taken for %zu bytes to %zu (%s)", n, to, trims ? "trimmed" : "kept");
        CHECK_BLOCK(r, fresh_usable(n), 0x5210 + i, "block taken from the cache and grown");
    }
    for (size_t i = 0; i < N; i++)
        shard_free(kept[i]);
    cache_undrain(&d);
    check_allocator("after trimming taken blocks");
#endif
}

/* Where blocks are split (take_splits): a block freed alone into the cache, taken for less, keeps the
 * granules of its need and the rest of it waits as a cached block of its own (an 80 MB block taken for
 * 16 MB leaves 64 MB; 20 MB for 5 MB leaves 12 MB; 8 MB for 1 MB + 1 leaves 4 MB, and keeps the 2 MB
 * above its own 2 MB committed); 6 MB for 1 MB + 1 stays whole (the rest is less than a granule), and so does 14 MB
 * for 7 MB (the rest is less than the 8 MB kept). The rest is a block: a malloc of its size gets it,
 * where it starts, committing nothing; the error hook takes its address while it is cached. Freed, the
 * taken block joins the rest again (committing nothing; the rest's address is no block any
 * more), and a malloc of the whole size gets the whole block back at its old address. Split again and
 * grown a granule past what it kept, the block takes its rest back in place; freed and taken for as
 * little again it stays whole (a block that has grown is not split). Contents checked throughout,
 * shard_check at each step that changes the map. */
#if SHARD_RULES
static void check_not_live(void *p, const char *what);
#endif

TEST(a_cached_block_taken_for_much_less_is_split_and_the_parts_join_when_freed)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (!SPLITS_CACHED)
        SKIP_TEST();
    static const struct {
        size_t held; /* committed by a fresh block of with_need(held) */
        size_t n;    /* the malloc that takes it */
        int split;   /* what take_splits says */
    } cases[] = {
        { 80 * MB, 16 * MB - 32, 1 }, { 20 * MB, 5 * MB, 1 }, { 8 * MB, LARGE_MIN, 1 }, { 6 * MB, LARGE_MIN, 0 },
        { 14 * MB, 7 * MB, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t held = cases[i].held, n = cases[i].n, keep = split_keep(n);
        int split = take_splits(held, n);
        CHECK_EQ(split, cases[i].split);
        shard_collect();
        unsigned char *p = shard_malloc(with_need(held));
        CHECK(p != NULL);
        if (!p)
            continue;
        fill64(p, with_need(held), 0x5300 + i);
        shard_free(p);
        shard_stats a = stats_now();
        CHECK_CACHE(a, 1, held, "a block of %zu bytes committed, freed", held);
        unsigned char *q = shard_malloc(n);
        CHECK(q != NULL);
        if (!q)
            continue;
        shard_stats b = stats_now();
        CHECKF(q == p, "malloc(%zu) did not take the only cached block", n);
        CHECK_EQ(shard_usable_size(q), fresh_usable(n));
        CHECK_BLOCK(q, fresh_usable(n), 0x5300 + i, "the block taken for %zu bytes (dirty: its last life's)", n);
        if (!split) {
            CHECK_CACHE(b, 0, 0, "after malloc(%zu) took the block holding %zu whole", n, held);
            CHECK_COMMITTED(a.committed, b.committed, 0, 0, "malloc(%zu) taking a block holding %zu whole", n, held);
            shard_free(q);
            continue;
        }
        CHECK_CACHE(b, 1, held - keep, "after malloc(%zu) split the block holding %zu", n, held);
        CHECK_COMMITTED(a.committed, b.committed, 0, 0, "malloc(%zu) splitting a block holding %zu", n, held);
        shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
        check_not_live(p + keep, "the cached rest of a split block");
        shard_set_error_hook(previous, NULL);
        fill64(q, fresh_usable(n), 0x5310 + i);
        /* The rest is a block of its own, 4 MB granules on. */
        unsigned char *r = shard_malloc(with_need(held - keep));
        shard_stats c = stats_now();
        CHECKF(r == p + keep, "malloc(%zu) got %p, not the rest of the split block at %p", with_need(held - keep),
               (void *)r, (void *)(p + keep));
        if (r != p + keep) {
            shard_free(r);
            shard_free(q);
            continue;
        }
        CHECK_EQ(shard_usable_size(r), with_need(held - keep));
        CHECK_CACHE(c, 0, 0, "after the rest was taken");
        CHECK_COMMITTED(b.committed, c.committed, 0, 0, "taking the rest, committed already");
        fill64(r, shard_usable_size(r), 0x5320 + i);
        CHECK_BLOCK(q, fresh_usable(n), 0x5310 + i, "the taken block beside the rest, both written");
        CHECK_BLOCK(r, shard_usable_size(r), 0x5320 + i, "the rest beside the taken block, both written");
        shard_free(r);
        CHECK_CACHE_NOW(1, held - keep, "the rest freed again");
        /* The taken block freed joins the rest. */
        shard_stats e = stats_now();
        shard_free(q);
        shard_stats f = stats_now();
        CHECK_CACHE(f, 1, held, "after the taken block joined the rest");
        CHECK_COMMITTED(e.committed, f.committed, 0, 0, "the join, committed already");
        check_allocator("with the joined block cached");
        previous = shard_set_error_hook(recording_hook, &hook_cookie);
        check_not_live(p + keep, "where the rest of a split block began, joined again");
        shard_set_error_hook(previous, NULL);
        unsigned char *w = shard_malloc(with_need(held));
        shard_stats g = stats_now();
        CHECKF(w == p, "malloc(%zu) got %p, not the joined block at %p", with_need(held), (void *)w, (void *)p);
        CHECK_CACHE(g, 0, 0, "after the joined block was taken");
        CHECK_COMMITTED(f.committed, g.committed, 0, 0, "taking the joined block whole");
        if (w) {
            CHECK_EQ(shard_usable_size(w), fresh_usable(with_need(held)));
            fill64(w, with_need(held), 0x5330 + i);
            CHECK_BLOCK(w, with_need(held), 0x5330 + i, "the joined block");
        }
        shard_free(w);
        /* Split again, then grown past its granules: it takes the rest back, in place. */
        q = shard_malloc(n);
        CHECKF(q == p, "malloc(%zu) after the join got %p, not %p", n, (void *)q, (void *)p);
        if (q != p) {
            shard_free(q);
            continue;
        }
        fill64(q, fresh_usable(n), 0x5340 + i);
        shard_stats h = stats_now();
        CHECK_CACHE(h, 1, held - keep, "split again");
        size_t to = with_need(keep + LARGE_GRANULE);
        unsigned char *t = shard_realloc(q, to);
        shard_stats k = stats_now();
        CHECKF(t == q, "realloc(%zu) of a split block with its rest cached moved it to %p", to, (void *)t);
        if (t == NULL) {
            shard_free(q);
            continue;
        }
        CHECK_EQ(shard_usable_size(t), to);
        CHECK_CACHE(k, 0, 0, "after the split block took its rest back to grow");
        CHECK_COMMITTED(h.committed, k.committed, 0, 0, "growing into the rest, committed already");
        CHECK_BLOCK(t, fresh_usable(n), 0x5340 + i, "the block grown into its rest");
        fill64(t, to, 0x5350 + i);
        CHECK_BLOCK(t, to, 0x5350 + i, "the block grown into its rest, written");
        check_allocator("with a block grown into its rest");
        shard_free(t);
        CHECK_CACHE_NOW(1, held, "the grown block freed");
        /* A block that has grown is not split again: taken for as little, it stays whole. */
        shard_stats l = stats_now();
        unsigned char *u = shard_malloc(n);
        shard_stats m = stats_now();
        CHECKF(u == p, "malloc(%zu) of the grown block got %p, not %p", n, (void *)u, (void *)p);
        CHECK_CACHE(m, 0, 0, "after malloc(%zu) took the block that had grown, whole", n);
        CHECK_COMMITTED(l.committed, m.committed,
                        take_trims(held, n) ? -(long long)(held - tail_start(need(n), held)) : 0, 0,
                        "malloc(%zu) taking the block that had grown, holding %zu", n, held);
        if (u) {
            fill64(u, fresh_usable(n), 0x5360 + i);
            CHECK_BLOCK(u, fresh_usable(n), 0x5360 + i, "the block that had grown, taken whole");
        }
        shard_free(u);
    }
    shard_collect();
    check_allocator("after splitting and joining cached blocks");
#endif
}

/* Where blocks are split (take_splits): the granules a split block keeps stay committed whole, so the
 * pages of them that its last life wrote are still there for its next one. A 20 MB block written whole
 * and taken for 5 MB keeps its 8 MB resident, [6 MB, 8 MB) above its own 6 MB included. When that part
 * was given back, a block taken again for more took a fault for each of its pages (or cleared its huge
 * page) every time: blocks of 5-25 MB written at both ends took up to 10 times as long
 * (bench/results/2026-12-06-large-sparse.md). */
TEST(a_split_block_keeps_the_pages_of_its_granules)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES || defined _WIN32
    SKIP_TEST();
#else
    if (!SPLITS_CACHED)
        SKIP_TEST();
    size_t held = 20 * MB, n = 5 * MB, keep = split_keep(n);
    CHECK(take_splits(held, n));
    shard_collect();
    unsigned char *p = shard_malloc(with_need(held));
    CHECK(p != NULL);
    if (!p)
        return;
    fill64(p, with_need(held), 0x5400);
    shard_free(p);
    unsigned char *q = shard_malloc(n);
    CHECKF(q == p, "malloc(%zu) did not take the only cached block", n);
    CHECK_CACHE_NOW(1, held - keep, "after malloc(%zu) split the block holding %zu", n, held);
    unsigned char *granule = p - LARGE_HEADER;
    for (size_t at = 0; at < keep; at += 4 * MB) {
        int first = 0;
        long resident = resident_pages(granule + at, 4 * MB, &first);
        CHECKF(resident == (long)(4 * MB / 4096), "the kept granule at %zu MB: %ld of its %zu pages resident",
               at / MB, resident, (size_t)(4 * MB / 4096));
    }
    if (q == p) {
        CHECK_BLOCK(q, fresh_usable(n), 0x5400, "the block taken for %zu bytes (its last life's contents)", n);
        fill64(q, fresh_usable(n), 0x5410);
        CHECK_BLOCK(q, fresh_usable(n), 0x5410, "the split block, written");
    }
    shard_free(q);
    shard_collect();
    check_allocator("after a split block's pages were looked at");
#endif
}

/* ---- the cache: its limits ---- */

/* Whether p is one of the count blocks. */
__attribute__((unused)) static int one_of(const void *p, unsigned char *const *blocks, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (p == blocks[i])
            return 1;
    return 0;
}

/* 129 blocks of 1 MB + 1 freed in a scrambled order: the cache holds each, up to 128; the 129th free
 * releases the block freed first (its committed bytes go, the freed one stays committed). Taken back,
 * the 128 cached blocks are exactly the 128 freed last. 128 blocks hold more than 128 MB: the default
 * limit, where the blocks' own high makes room for them. */
TEST(the_cache_keeps_at_most_128_blocks_releasing_the_oldest_first)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    NEEDS_DEFAULT_LIMIT();
    NEEDS_NO_SPARES();
    enum { N = CACHE_MAX_BLOCKS + 1 };
    unsigned char *blocks[N], *back[N];
    size_t order[N];
    const size_t c = fresh_commit(LARGE_MIN); /* what each block holds, cached */
    drained d;
    cache_drain(&d);
    int ok = 1;
    for (size_t i = 0; i < N; i++) {
        blocks[i] = shard_malloc(LARGE_MIN);
        CHECK(blocks[i] != NULL);
        ok &= blocks[i] != NULL;
        if (blocks[i])
            fill64(blocks[i], LARGE_MIN, 0x6000 + i);
        order[i] = (i * 7 + 5) % N; /* 7 and 129 have no common factor: a permutation */
    }
    if (!ok) {
        for (size_t i = 0; i < N; i++)
            shard_free(blocks[i]);
        cache_undrain(&d);
        return;
    }
    for (size_t k = 0; k < N; k++) {
        size_t i = order[k];
        CHECK_BLOCK(blocks[i], LARGE_MIN, 0x6000 + i, "block %zu before its free", i);
        shard_stats a = stats_now();
        shard_free(blocks[i]);
        shard_stats b = stats_now();
        if (k < CACHE_MAX_BLOCKS) {
            CHECK_CACHE(b, k + 1, (k + 1) * c, "after free number %zu", k + 1);
            CHECK_COMMITTED(a.committed, b.committed, 0, 0, "free number %zu into the cache", k + 1);
        } else {
            CHECK_CACHE(b, (size_t)CACHE_MAX_BLOCKS, CACHE_MAX_BLOCKS * c, "after free number %zu", k + 1);
            CHECK_COMMITTED(a.committed, b.committed, -(long long)c, 0, "free number %zu: the oldest released", k + 1);
            CHECKF(a.reserved - b.reserved >= reservation(LARGE_MIN), "free number %zu: reserved %zu -> %zu", k + 1,
                   a.reserved, b.reserved);
        }
    }
    for (size_t k = 0; k < CACHE_MAX_BLOCKS; k++) {
        back[k] = shard_malloc(LARGE_MIN);
        CHECK(back[k] != NULL);
        if (!back[k])
            continue;
        CHECKF(back[k] != blocks[order[0]], "the block freed first (%p) came back from the cache", (void *)back[k]);
        CHECKF(one_of(back[k], blocks, N), "malloc number %zu (%p) is none of the cached blocks", k + 1,
               (void *)back[k]);
        CHECKF(!one_of(back[k], back, k), "malloc number %zu (%p) came back twice", k + 1, (void *)back[k]);
        fill64(back[k], LARGE_MIN, 0x6100 + k);
    }
    shard_stats s = stats_now();
    CHECK_CACHE(s, 0, 0, "after 128 blocks were taken back");
    for (size_t k = 0; k < CACHE_MAX_BLOCKS; k++)
        if (back[k]) {
            CHECK_BLOCK(back[k], LARGE_MIN, 0x6100 + k, "block %zu taken back", k);
            shard_free(back[k]);
        }
    cache_undrain(&d);
    check_allocator("after the 128-block limit");
#endif
}

/* Nine blocks committing 16 MB freed in a scrambled order: eight fill the cache's 128 MB exactly and
 * stay; the ninth releases the block freed first. A block of 64 MB then releases the four oldest. Taken
 * back, the cached ones are exactly the 64 MB block and the four 16 MB blocks freed last. */
TEST(the_cache_keeps_at_most_128mb_releasing_the_oldest_first)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    NEEDS_FIXED_LIMIT();
    enum { N = 9, BIG = N, ALL = N + 1 };
    static const size_t order[N] = { 3, 7, 0, 5, 8, 1, 6, 2, 4 };
    const size_t c = 16 * MB, big = 64 * MB;
    unsigned char *blocks[ALL], *back[5];
    drained d;
    cache_drain(&d);
    int ok = 1;
    for (size_t i = 0; i < ALL; i++) {
        size_t n = with_need(i == BIG ? big : c);
        blocks[i] = shard_malloc(n);
        CHECK(blocks[i] != NULL);
        ok &= blocks[i] != NULL;
        if (blocks[i])
            fill_edges(blocks[i], n, 0x6200 + i);
    }
    if (!ok) {
        for (size_t i = 0; i < ALL; i++)
            shard_free(blocks[i]);
        cache_undrain(&d);
        return;
    }
    for (size_t k = 0; k < N; k++) {
        size_t i = order[k];
        CHECK_EDGES(blocks[i], with_need(c), 0x6200 + i, "block %zu before its free", i);
        shard_stats a = stats_now();
        shard_free(blocks[i]);
        shard_stats b = stats_now();
        size_t count = k < 8 ? k + 1 : 8;
        CHECK_CACHE(b, count, count * c, "after free number %zu of a block committing 16 MB", k + 1);
        CHECK_COMMITTED(a.committed, b.committed, k < 8 ? 0 : -(long long)c, 0, "free number %zu", k + 1);
    }
    {
        shard_stats a = stats_now();
        shard_free(blocks[BIG]);
        shard_stats b = stats_now();
        CHECK_CACHE(b, 5, big + 4 * c, "after the free of a block committing 64 MB");
        CHECK_COMMITTED(a.committed, b.committed, -(long long)(4 * c), 0, "the free of 64 MB: 4 oldest released");
    }
    back[0] = shard_malloc(with_need(big));
    CHECKF(back[0] == blocks[BIG], "malloc(64 MB - 32) = %p, the cached 64 MB block is %p", (void *)back[0],
           (void *)blocks[BIG]);
    for (size_t k = 1; k < 5; k++) {
        back[k] = shard_malloc(with_need(c));
        CHECK(back[k] != NULL);
        int newest = 0;
        for (size_t j = N - 4; j < N; j++)
            newest |= back[k] == blocks[order[j]];
        CHECKF(newest, "malloc(16 MB - 32) number %zu = %p: not one of the four blocks freed last", k, (void *)back[k]);
        CHECKF(!one_of(back[k], back, k), "malloc number %zu (%p) came back twice", k, (void *)back[k]);
    }
    shard_stats s = stats_now();
    CHECK_CACHE(s, 0, 0, "after the cached blocks were taken back");
    for (size_t k = 0; k < 5; k++)
        if (back[k]) {
            size_t n = k ? with_need(c) : with_need(big);
            fill_edges(back[k], n, 0x6300 + k);
            CHECK_EDGES(back[k], n, 0x6300 + k, "block taken back");
            shard_free(back[k]);
        }
    cache_undrain(&d);
    check_allocator("after the 128 MB limit");
#endif
}

/* The default limit (the file comment). After shard_collect (H = L), twenty blocks committing 16 MB
 * are freed: all stay cached (320 MB, what the live blocks gave up since their high H = 320 MB; the
 * ceiling is 9/8 H = 360 MB). A fresh 34 MB block (too large for a cached block's 32 MB span) finds
 * room under the ceiling (34 + 320) and releases none; a fresh 64 MB block releases the four oldest
 * (34 + 64 + 256 <= 360), and a new arena of medium blocks one more (the cache holds its 4 MB less, in
 * whole blocks: 240 MB); the 64 MB and 34 MB blocks freed join them (338 MB). shard_collect empties the cache and brings H down to L: ten blocks of 16 MB
 * freed fill it to 160 MB (H = 160 MB, ceiling 180 MB), and four fresh 40 MB blocks shed it to 128 MB.
 * As those four are freed the limit is 128 MB until the room under the ceiling passes it, so the oldest
 * 16 MB blocks go first: 120, 128, 136 and at last 176 MB in 5 blocks. With H still at its earlier
 * high the cache would keep all twelve blocks (288 MB). */
#if SHARD_RULES
enum { HIGH_FIRST = 20, HIGH_SECOND = 10, HIGH_BIG = 4, HIGH_MEDIUM_MAX = 512 };
static unsigned char *high_blocks[HIGH_FIRST], *high_big[HIGH_BIG], *high_medium[HIGH_MEDIUM_MAX];

/* n fresh blocks of with_need(c) bytes into out, filled at their edges; whether all came. */
static int high_alloc(unsigned char **out, size_t n, size_t c, uint64_t seed)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        out[i] = shard_malloc(with_need(c));
        CHECKF(out[i] != NULL, "shard_malloc(%zu) number %zu returned NULL", with_need(c), i);
        ok &= out[i] != NULL;
        if (out[i])
            fill_edges(out[i], with_need(c), seed + i);
    }
    return ok;
}

static void high_free(unsigned char **blocks, size_t n, size_t c, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (blocks[i]) {
            CHECK_EDGES(blocks[i], with_need(c), seed + i, "block %zu before its free", i);
            shard_free(blocks[i]);
            blocks[i] = NULL;
        }
}
#endif

TEST(past_128mb_live_and_cached_blocks_hold_up_to_an_eighth_above_the_live_high)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    NEEDS_DEFAULT_LIMIT();
    const size_t c = 16 * MB, first = 34 * MB, big = 40 * MB, bigger = 64 * MB, medium = 256 * KB;
    shard_collect();
    CHECK_CACHE_NOW(0, 0, "after shard_collect");
    if (!high_alloc(high_blocks, HIGH_FIRST, c, 0x6400)) {
        high_free(high_blocks, HIGH_FIRST, c, 0x6400);
        return;
    }
    for (size_t k = 0; k < HIGH_FIRST; k++) {
        CHECK_EDGES(high_blocks[k], with_need(c), 0x6400 + k, "block %zu before its free", k);
        shard_stats a = stats_now();
        shard_free(high_blocks[k]);
        high_blocks[k] = NULL;
        shard_stats b = stats_now();
        CHECK_CACHE(b, k + 1, (k + 1) * c, "after free number %zu of a block committing 16 MB", k + 1);
        CHECK_COMMITTED(a.committed, b.committed, 0, 0, "free number %zu into the cache", k + 1);
    }
    shard_stats a = stats_now();
    unsigned char *p = shard_malloc(with_need(first));
    shard_stats b = stats_now();
    CHECK(p != NULL);
    CHECK_CACHE(b, HIGH_FIRST, HIGH_FIRST * c, "after a fresh 34 MB block");
    CHECK_COMMITTED(a.committed, b.committed, (long long)first, 1, "a fresh 34 MB block, no cached block released");
    if (p)
        fill_edges(p, with_need(first), 0x6500);
    a = stats_now();
    unsigned char *q = shard_malloc(with_need(bigger));
    b = stats_now();
    CHECK(q != NULL);
    CHECK_CACHE(b, HIGH_FIRST - 4, (HIGH_FIRST - 4) * c, "after a fresh 64 MB block");
    CHECK_COMMITTED(a.committed, b.committed, (long long)bigger - (long long)(4 * c), 1,
                    "a fresh 64 MB block, four cached blocks released");
    if (q)
        fill_edges(q, with_need(bigger), 0x6501);
    /* Medium blocks until a new arena is reserved (not a spare one taken: that reserves nothing). */
    size_t m = 0, shed = 0;
    while (m < HIGH_MEDIUM_MAX) {
        shard_stats before = stats_now();
        high_medium[m] = shard_malloc(medium);
        CHECK(high_medium[m] != NULL);
        if (!high_medium[m])
            break;
        fill_edges(high_medium[m], medium, 0x6600 + m);
        m++;
        shard_stats after = stats_now();
        if (after.reserved != before.reserved) { /* a new arena's 4 MB, less what the cache released */
            CHECK_CACHE(after, HIGH_FIRST - 5, (HIGH_FIRST - 5) * c, "after a new arena (medium block %zu)", m);
            shed = 1;
            break;
        }
        CHECK_CACHE(after, HIGH_FIRST - 4, (HIGH_FIRST - 4) * c, "after medium block %zu, from an arena there was", m);
    }
    CHECKF(shed, "%zu medium blocks of %zu bytes and no new arena", m, medium);
    for (size_t i = 0; i < m; i++) {
        CHECK_EDGES(high_medium[i], medium, 0x6600 + i, "medium block %zu", i);
        shard_free(high_medium[i]);
    }
    if (q) {
        CHECK_EDGES(q, with_need(bigger), 0x6501, "the 64 MB block");
        shard_free(q);
        CHECK_CACHE_NOW(HIGH_FIRST - 4, (HIGH_FIRST - 5) * c + bigger, "after the free of the 64 MB block");
    }
    if (p) {
        CHECK_EDGES(p, with_need(first), 0x6500, "the 34 MB block");
        shard_free(p);
        CHECK_CACHE_NOW(HIGH_FIRST - 3, (HIGH_FIRST - 5) * c + bigger + first, "after the free of the 34 MB block");
    }

    shard_collect();
    CHECK_CACHE_NOW(0, 0, "after shard_collect");
    int ok = high_alloc(high_blocks, HIGH_SECOND, c, 0x6700);
    high_free(high_blocks, HIGH_SECOND, c, 0x6700);
    CHECK_CACHE_NOW(HIGH_SECOND, HIGH_SECOND * c, "after ten blocks of 16 MB were freed");
    ok &= high_alloc(high_big, HIGH_BIG, big, 0x6800);
    CHECK_CACHE_NOW(8, 8 * c, "after four fresh 40 MB blocks");
    static const size_t blocks_after[HIGH_BIG] = { 6, 5, 4, 5 }, mb_after[HIGH_BIG] = { 120, 128, 136, 176 };
    for (size_t k = 0; ok && k < HIGH_BIG; k++) {
        CHECK_EDGES(high_big[k], with_need(big), 0x6800 + k, "40 MB block %zu before its free", k);
        shard_free(high_big[k]);
        high_big[k] = NULL;
        CHECK_CACHE_NOW(blocks_after[k], mb_after[k] * MB, "after the free of 40 MB block %zu", k + 1);
    }
    high_free(high_big, HIGH_BIG, big, 0x6800);
    check_allocator("after the limit that follows the live blocks' high");
#endif
}

/* ---- the cache: its delay ---- */

#if SHARD_RULES
struct exit_trigger {
    size_t seen_before; /* what the cache held after the thread's medium allocation and free */
};

/* A thread whose only allocation is a medium block (so that it has a heap and its exit runs the heap's
 * exit hook, with no small page freed and no large call): it records the cache before it exits. */
static void *medium_and_exit(void *arg)
{
    struct exit_trigger *e = arg;
    unsigned char *p = shard_malloc(20000);
    CHECK(p != NULL);
    if (p) {
        fill64(p, 20000, 0x7300);
        CHECK_BLOCK(p, 20000, 0x7300, "medium block of the exiting thread");
    }
    shard_free(p);
    e->seen_before = stats_now().large_cached;
    return NULL;
}
#endif

#if SHARD_RULES && defined __linux__
/* The system calls numbered nr that work() makes in a child process between its first two calls of
 * getppid (the marks), counted from this process by ptrace (the child's one thread); -1 when ptrace is
 * refused here, -2 when the child failed a check or did not make both marks. */
static long calls_between_marks(long nr, void (*work)(void))
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
            _exit(3);
        raise(SIGSTOP);
        work();
        _exit(__atomic_load_n(&harness_failures, __ATOMIC_SEQ_CST) == 0 ? 0 : 4);
    }
    int status = 0, sig = 0, entering = 1, marks = 0;
    long count = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFSTOPPED(status))
        return -1;
    ptrace(PTRACE_SETOPTIONS, pid, NULL, (void *)(long)(PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL));
    for (;;) {
        if (ptrace(PTRACE_SYSCALL, pid, NULL, (void *)(long)sig) != 0 || waitpid(pid, &status, 0) != pid)
            return -1;
        sig = 0;
        if (WIFEXITED(status))
            return WEXITSTATUS(status) == 3 ? -1 : WEXITSTATUS(status) == 0 && marks >= 2 ? count : -2;
        if (WIFSIGNALED(status))
            return -2;
        if (WSTOPSIG(status) != (SIGTRAP | 0x80)) {
            sig = WSTOPSIG(status); /* the child's own signal: delivered */
            continue;
        }
        if (entering) {
            struct user_regs_struct regs;
            if (ptrace(PTRACE_GETREGS, pid, NULL, &regs) != 0)
                return -1;
            if (regs.orig_rax == SYS_getppid)
                marks++;
            else if (marks == 1 && regs.orig_rax == (unsigned long long)nr)
                count++;
        }
        entering = !entering;
    }
}

static uint64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

#define LOOK_BLOCKS 24
#define LOOK_ROUNDS 400
static uint64_t *look_ms; /* shared with the child: how long its frees between the marks took */

/* 24 blocks of 16 MB make the live high 384 MB, so the cache's byte limit is the room under the
 * ceiling, past 128 MB; then 400 rounds of a block freed into the cache and taken back. */
static void frees_past_128mb(void)
{
    static unsigned char *blocks[LOOK_BLOCKS];
    for (size_t i = 0; i < LOOK_BLOCKS; i++) {
        blocks[i] = shard_malloc(16 * MB);
        CHECK(blocks[i] != NULL);
        if (blocks[i] == NULL)
            return;
        fill_edges(blocks[i], 16 * MB, 0x6600 + i);
    }
    for (size_t i = 0; i < LOOK_BLOCKS / 2; i++) {
        shard_free(blocks[i]);
        blocks[i] = NULL;
    }
    uint64_t t0 = now_ms();
    (void)getppid();
    for (size_t r = 0; r < LOOK_ROUNDS; r++) {
        size_t i = LOOK_BLOCKS / 2 + r % (LOOK_BLOCKS / 2);
        CHECK_EDGES(blocks[i], 16 * MB, 0x6600 + i, "block %zu before its free", i);
        shard_free(blocks[i]);
        blocks[i] = shard_malloc(16 * MB);
        CHECK(blocks[i] != NULL);
        if (blocks[i] == NULL)
            return;
        fill_edges(blocks[i], 16 * MB, 0x6600 + i);
    }
    (void)getppid();
    *look_ms = now_ms() - t0;
    for (size_t i = 0; i < LOOK_BLOCKS; i++)
        shard_free(blocks[i]);
}
#endif

/* A free past the cache's 128 MB (the byte limit is then the room under the ceiling) asks whether the
 * address space is limited, for the cached blocks' reservations count against RLIMIT_AS: two system
 * calls (prlimit64), made at most once in 100 ms. Each free asked once, and large-ends@8 (blocks of
 * 5-25 MB written at their ends, bench/shapes.c) spent half its time there. Counted by ptrace. */
TEST(a_free_past_128mb_looks_at_the_address_space_limit_at_most_once_in_100ms)
{
#if !SHARD_RULES || !defined __linux__
    SKIP_TEST();
#else
    NEEDS_DEFAULT_LIMIT();
    look_ms = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(look_ms != MAP_FAILED);
    if (look_ms == MAP_FAILED)
        return;
    *look_ms = 0;
    shard_collect();
    long calls = calls_between_marks(SYS_prlimit64, frees_past_128mb);
    if (calls == -1) {
        fprintf(stderr, "  ptrace refused here: not counted\n");
        munmap(look_ms, 4096);
        SKIP_TEST();
    }
    CHECKF(calls >= 0, "the child that freed the blocks failed its checks");
    long most = 2 * (long)(*look_ms / 100 + 2); /* a look at each end, and the coarse clock's tick */
    fprintf(stderr, "  %d frees past 128 MB in %llu ms: %ld prlimit64 calls (at most %ld)\n", LOOK_ROUNDS,
            (unsigned long long)*look_ms, calls, most);
    CHECKF(calls <= most, "%ld prlimit64 calls for %d frees in %llu ms, more than %ld", calls, LOOK_ROUNDS,
           (unsigned long long)*look_ms, most);
    munmap(look_ms, 4096);
#endif
}

/* Cached blocks expire a second after their free. Five groups of blocks are freed 0.55 s apart (A at 0,
 * B at 0.55 s, ..., E at 2.2 s); 1.1 s after each group's free one kind of trigger releases that group
 * but not the next one (0.55 s old): a large malloc (A), the free that empties a small page (B), a
 * thread's exit (C), a large free (D) and a large realloc (E). A large malloc right after a free, and
 * shard_get_stats at any time, release nothing. */
TEST(cached_blocks_expire_a_second_after_their_free_on_a_large_call_a_freed_small_page_or_a_thread_exit)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST(); /* only the rules to check; and 3 s of sleeping */
#else
    NEEDS_NO_SPARES();
    enum { A, B, C, D, E, GROUPS, PER = 2, N = GROUPS * PER, SMALL = 48, SMALL_SIZE = 4000 }; /* three pages of their own */
    const long step_ms = 550; /* 0.45 s to spare below the delay, 0.1 s above it after two steps */
    /* Committed 2, 3, 5, 6 and 7 MB: reservations of twice that, which a malloc of 17 MB never takes. */
    static const size_t held[GROUPS] = { 2 * MB, 3 * MB, 5 * MB, 6 * MB, 7 * MB };
    size_t c_held[GROUPS]; /* what each holds committed: fresh_end of its need */
    for (int g = 0; g < GROUPS; g++)
        c_held[g] = fresh_end(held[g], reservation(with_need(held[g])));
    const size_t big = 17 * MB;
    unsigned char *blocks[N], *m = NULL, *x = NULL, *small[SMALL];
    drained d;
    cache_drain(&d);
    int ok = 1;
    for (size_t i = 0; i < N; i++) {
        blocks[i] = shard_malloc(with_need(held[i / PER]));
        CHECK(blocks[i] != NULL);
        ok &= blocks[i] != NULL;
        if (blocks[i])
            fill_edges(blocks[i], with_need(held[i / PER]), 0x7000 + i);
    }
    if (!ok) {
        for (size_t i = 0; i < N; i++)
            shard_free(blocks[i]);
        cache_undrain(&d);
        return;
    }
#define FREE_GROUP(g)                                                                                    \
    for (size_t i_ = (g) * PER; i_ < ((g) + 1) * PER; i_++) {                                           \
        CHECK_EDGES(blocks[i_], with_need(held[(g)]), 0x7000 + i_, "block %zu before its free", i_);    \
        shard_free(blocks[i_]);                                                                          \
    }
#define CACHE_IS(count, bytes, ...)                                                                      \
    do {                                                                                                 \
        shard_stats now_ = stats_now();                                                                  \
        CHECK_CACHE(now_, (count), (bytes), __VA_ARGS__);                                                \
    } while (0)
    /* 0 s: A freed; a large malloc at once releases nothing. */
    FREE_GROUP(A);
    m = shard_malloc(big);
    CHECK(m != NULL);
    CACHE_IS(PER, PER * c_held[A], "A freed, then a large malloc at once");
    sleep_ms(step_ms);
    /* 0.55 s */
    FREE_GROUP(B);
    CACHE_IS(2 * PER, PER * (c_held[A] + c_held[B]), "B freed");
    sleep_ms(step_ms);
    /* 1.1 s: a large malloc releases A. */
    CACHE_IS(2 * PER, PER * (c_held[A] + c_held[B]), "1.1 s after A: shard_get_stats alone");
    x = shard_malloc(big);
    CHECK(x != NULL);
    CACHE_IS(PER, PER * c_held[B], "a large malloc 1.1 s after A, 0.55 s after B");
    FREE_GROUP(C);
    sleep_ms(step_ms);
    /* 1.65 s: small blocks of one class, allocated and freed; the free that empties a page releases B. */
    CACHE_IS(2 * PER, PER * (c_held[B] + c_held[C]), "1.1 s after B: shard_get_stats alone");
    for (size_t i = 0; i < SMALL; i++) {
        small[i] = shard_malloc(SMALL_SIZE);
        CHECK(small[i] != NULL);
        if (small[i])
            fill64(small[i], SMALL_SIZE, 0x7100 + i);
    }
    CACHE_IS(2 * PER, PER * (c_held[B] + c_held[C]), "after small allocations");
    int page_freed = 0;
    for (size_t i = 0; i < SMALL; i++) {
        if (!small[i])
            continue;
        CHECK_BLOCK(small[i], SMALL_SIZE, 0x7100 + i, "small block %zu", i);
        size_t retired = stats_now().small_pages_retired;
        shard_free(small[i]);
        if (page_freed)
            continue;
        page_freed = stats_now().small_pages_retired > retired;
        if (page_freed)
            CACHE_IS(PER, PER * c_held[C], "the free that emptied a small page, 1.1 s after B, 0.55 s after C");
        else
            CACHE_IS(2 * PER, PER * (c_held[B] + c_held[C]), "a small free that emptied no page");
    }
    CHECKF(page_freed, "%d small blocks of %d bytes freed, and no small page became free", SMALL, SMALL_SIZE);
    FREE_GROUP(D);
    sleep_ms(step_ms);
    /* 2.2 s: a thread that exits releases C. */
    CACHE_IS(2 * PER, PER * (c_held[C] + c_held[D]), "1.1 s after C: shard_get_stats alone");
    struct exit_trigger e = { 0 };
    run_thread(medium_and_exit, &e);
    CHECKF(e.seen_before == 2 * PER, "the cache held %zu blocks before the thread's exit, expected %d (a medium "
           "allocation and free are no trigger)", e.seen_before, 2 * PER);
    CACHE_IS(PER, PER * c_held[D], "after a thread exited 1.1 s after C, 0.55 s after D");
    FREE_GROUP(E);
    sleep_ms(step_ms);
    /* 2.75 s: a large free releases D; the freed block stays. */
    CACHE_IS(2 * PER, PER * (c_held[D] + c_held[E]), "1.1 s after D: shard_get_stats alone");
    shard_free(m);
    CACHE_IS(PER + 1, PER * c_held[E] + fresh_commit(big), "a large free 1.1 s after D, 0.55 s after E");
    sleep_ms(step_ms);
    /* 3.3 s: a large realloc in place releases E, not the block freed 0.55 s ago. */
    CACHE_IS(PER + 1, PER * c_held[E] + fresh_commit(big), "1.1 s after E: shard_get_stats alone");
    unsigned char *y = x ? shard_realloc(x, big - LARGE_PAGE) : NULL;
    CHECKF(y == x && y != NULL, "shard_realloc(%zu -> %zu) = %p, not in place (%p)", big, big - LARGE_PAGE,
           (void *)y, (void *)x);
    CACHE_IS(1, fresh_commit(big), "a large realloc 1.1 s after E, 0.55 s after the last free");
#undef FREE_GROUP
#undef CACHE_IS
    shard_free(y ? y : x);
    cache_undrain(&d);
    check_allocator("after the delay of the cache");
#endif
}

/* ---- the error hook ---- */

#if SHARD_RULES
/* free, realloc (to a small, a large and a larger size) and usable_size of p, which is not a live block:
 * each reaches the hook once with p; realloc gives NULL, usable_size 0; no statistic changes. */
static void check_not_live(void *p, const char *what)
{
    static const size_t sizes[] = { 100, 3 * MB, 20 * MB };
    shard_stats a = stats_now();
    hook_reset();
    shard_free(p);
    CHECKF(hook_record.calls == 1 && hook_record.error == SHARD_ERROR_INVALID_FREE && hook_record.ptr == p &&
               hook_record.arg == &hook_cookie,
           "shard_free(%s %p): hook called %d times, error %d, pointer %p", what, p, hook_record.calls,
           hook_record.error, hook_record.ptr);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        hook_reset();
        void *q = shard_realloc(p, sizes[i]);
        CHECKF(q == NULL, "shard_realloc(%s %p, %zu) = %p", what, p, sizes[i], q);
        CHECKF(hook_record.calls == 1 && hook_record.error == SHARD_ERROR_INVALID_REALLOC && hook_record.ptr == p &&
                   hook_record.arg == &hook_cookie,
               "shard_realloc(%s %p, %zu): hook called %d times, error %d, pointer %p", what, p, sizes[i],
               hook_record.calls, hook_record.error, hook_record.ptr);
    }
    hook_reset();
    size_t u = shard_usable_size(p);
    CHECKF(u == 0, "shard_usable_size(%s %p) = %zu", what, p, u);
    CHECKF(hook_record.calls == 1 && hook_record.error == SHARD_ERROR_INVALID_SIZE_QUERY && hook_record.ptr == p &&
               hook_record.arg == &hook_cookie,
           "shard_usable_size(%s %p): hook called %d times, error %d, pointer %p", what, p, hook_record.calls,
           hook_record.error, hook_record.ptr);
    shard_stats b = stats_now();
    CHECKF(b.live_large == a.live_large && b.large_cached == a.large_cached &&
               b.large_cached_bytes == a.large_cached_bytes && b.committed == a.committed && b.reserved == a.reserved,
           "%s %p given to free, realloc and usable_size: live_large %zu -> %zu, cached %zu -> %zu (%zu -> %zu bytes), "
           "committed %zu -> %zu, reserved %zu -> %zu", what, p, a.live_large, b.live_large, a.large_cached,
           b.large_cached, a.large_cached_bytes, b.large_cached_bytes, a.committed, b.committed, a.reserved,
           b.reserved);
}

static void *check_not_live_from_thread(void *p)
{
    check_not_live(p, "(from another thread) a cached block");
    return NULL;
}

struct not_live {
    unsigned char *base;
    const long *offsets;
    size_t count;
    const char *what;
};

/* check_not_live of base + every offset. */
static void *check_offsets(void *arg)
{
    struct not_live *c = arg;
    for (size_t i = 0; i < c->count; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s %+ld", c->what, c->offsets[i]);
        check_not_live(c->base + c->offsets[i], what);
    }
    return NULL;
}
#endif

/* A second free of a large block - cached, or released because it held more than 128 MB - reaches the
 * error hook from its thread and from another, as do realloc and usable_size of it; nothing changes. The
 * cached block comes back from the cache once: the next malloc of its size is a fresh block. */
TEST(a_double_free_of_a_large_block_reaches_the_error_hook_and_the_block_comes_back_once)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    const size_t n = 2 * MB + 1, big = 129 * MB;
    drained d;
    cache_drain(&d);
    unsigned char *p = shard_malloc(n), *other = shard_malloc(n), *r1 = NULL, *r2 = NULL;
    CHECK(p != NULL && other != NULL);
    if (!p || !other) {
        shard_free(p);
        shard_free(other);
        cache_undrain(&d);
        return;
    }
    fill64(p, n, 0x8000);
    fill64(other, n, 0x8001);
    shard_free(p);
    shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
    check_not_live(p, "a cached block");
    run_thread(check_not_live_from_thread, p);
    shard_set_error_hook(previous, NULL);
    shard_stats s = stats_now();
    CHECK_CACHE(s, 1, fresh_commit(n), "after the double frees");
    check_allocator("after double frees of a cached block");
    r1 = shard_malloc(n);
    r2 = shard_malloc(n);
    CHECK(r1 != NULL && r2 != NULL);
    CHECKF(r1 == p, "malloc(%zu) after the double frees = %p, the cached block is %p", n, (void *)r1, (void *)p);
    CHECKF(r2 != p && r2 != other && r2 != NULL && large_address(r2),
           "the second malloc(%zu) = %p: the cached block %p came back twice", n, (void *)r2, (void *)p);
    shard_stats s1 = stats_now();
    CHECK_CACHE(s1, 0, 0, "after the block came back");
    if (r1)
        fill64(r1, n, 0x8002);
    if (r2)
        fill64(r2, n, 0x8003);
    CHECK_BLOCK(other, n, 0x8001, "live block next to the double frees");
    if (r1)
        CHECK_BLOCK(r1, n, 0x8002, "the block that came back");
    if (r2)
        CHECK_BLOCK(r2, n, 0x8003, "the fresh block after it");
    /* A block holding more than 128 MB: released at its free, so its second free finds nothing. */
    unsigned char *b = shard_malloc(big);
    CHECK(b != NULL);
    if (b) {
        fill_edges(b, MB, 0x8004);
        CHECK_EDGES(b, MB, 0x8004, "block of 129 MB");
        shard_free(b);
        previous = shard_set_error_hook(recording_hook, &hook_cookie);
        check_not_live(b, "a released block");
        shard_set_error_hook(previous, NULL);
    }
    shard_free(r1);
    shard_free(r2);
    shard_free(other);
    cache_undrain(&d);
    check_allocator("after double frees of large blocks");
#endif
}

struct free_race {
    void *p;
    int round, freed; /* the round whose block p is, the last round the other thread freed */
};

__attribute__((unused)) static void *free_race_thread(void *arg)
{
    struct free_race *r = arg;
    for (int round = 1;; round++) {
        while (__atomic_load_n(&r->round, __ATOMIC_ACQUIRE) < round)
            ;
        void *p = __atomic_load_n(&r->p, __ATOMIC_RELAXED);
        if (p == NULL)
            return NULL;
        shard_free(p);
        __atomic_store_n(&r->freed, round, __ATOMIC_RELEASE);
    }
}

/* Two threads free one block at the same moment, round after round. The hardened build changes a large
 * block's mark with a CAS, so exactly one of the two frees gets past it and the other reaches the hook;
 * the default build does not promise it (src/large.c's file comment). */
TEST(racing_frees_of_a_large_block_reach_the_hook_once_each_in_the_hardened_build)
{
#if !defined(TEST_HARDENED) || !SHARD_RULES
    SKIP_TEST();
#else
    enum { ROUNDS = 3000 };
    const size_t n = 2 * MB + 1;
    struct free_race r = { NULL, 0, 0 };
    thread_t t;
    int started = thread_start(&t, free_race_thread, &r) == 0;
    CHECK(started);
    if (!started)
        return;
    hook_reset();
    shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
    int rounds = 0;
    for (int round = 1; round <= ROUNDS; round++, rounds++) {
        unsigned char *p = shard_malloc(n);
        CHECK(p != NULL);
        if (p == NULL)
            break;
        fill_edges(p, n, 0x8100 + round);
        CHECK_EDGES(p, n, 0x8100 + round, "the block of round %d", round);
        __atomic_store_n(&r.p, p, __ATOMIC_RELAXED);
        __atomic_store_n(&r.round, round, __ATOMIC_RELEASE);
        shard_free(p);
        while (__atomic_load_n(&r.freed, __ATOMIC_ACQUIRE) < round)
            ;
    }
    __atomic_store_n(&r.p, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&r.round, rounds + 1, __ATOMIC_RELEASE);
    thread_join(t);
    shard_set_error_hook(previous, NULL);
    CHECKF(hook_record.calls == rounds, "%d rounds of two frees of one block: %d reached the hook",
           rounds, hook_record.calls);
    /* Each block came back to one place only: two blocks asked for now are two. */
    unsigned char *a = shard_malloc(n), *b = shard_malloc(n);
    CHECK(a != NULL && b != NULL && a != b);
    shard_free(a);
    shard_free(b);
    check_allocator("after racing frees");
#endif
}

/* Pointers into a live 8 MB block (committed 8 MB + 4 KB of 16 MB + 64 KB reserved) - p + 16, + 4 KB,
 * + 1 MB, the start of its second 4 MB and 32 bytes into it (where a block of its own would be), its
 * last 16 bytes, 32 bytes into its third 4 MB (reserved, not committed: nothing may read there), and
 * p - 16, p - 32 (its header) - in a block full of a pattern and one full of zeros, given to free,
 * realloc and usable_size by its thread and by another, reach the error hook; so do pointers into the
 * block once cached. The blocks keep their contents and usable sizes, and the cached one comes back. */
TEST(interior_pointers_of_live_and_cached_large_blocks_reach_the_error_hook_and_change_nothing)
{
    NEEDS_NO_COLOURS();
#if !SHARD_RULES
    SKIP_TEST();
#else
    const size_t n = 8 * MB;
    drained d;
    cache_drain(&d);
    unsigned char *p = shard_malloc(n), *z = shard_calloc(1, n);
    CHECK(p != NULL && z != NULL);
    if (!p || !z) {
        shard_free(p);
        shard_free(z);
        cache_undrain(&d);
        return;
    }
    const size_t u = shard_usable_size(p);
    CHECK_EQ(u, fresh_usable(n));
    CHECK_EQ(shard_usable_size(z), u);
    fill64(p, u, 0x8100);
    const long offsets[] = { 16, 4096, (long)MB, (long)(4 * MB - 32), (long)(4 * MB), (long)(4 * MB + 16),
                             (long)(u - 16), (long)(12 * MB), -16, -32 };
    struct not_live live_p = { p, offsets, sizeof offsets / sizeof offsets[0], "live filled block" };
    struct not_live live_z = { z, offsets, sizeof offsets / sizeof offsets[0], "live zeroed block" };
    shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
    check_offsets(&live_p);
    check_offsets(&live_z);
    run_thread(check_offsets, &live_p);
    run_thread(check_offsets, &live_z);
    shard_set_error_hook(previous, NULL);
    CHECK_BLOCK(p, u, 0x8100, "block after bad pointers into it");
    CHECK_ZERO(z, u, "zeroed block after bad pointers into it");
    CHECK_EQ(shard_usable_size(p), u);
    CHECK_EQ(shard_usable_size(z), u);
    check_allocator("after interior pointers of live blocks");
    /* The same pointers once the block is cached. */
    shard_free(p);
    struct not_live cached_p = { p, offsets, sizeof offsets / sizeof offsets[0], "cached block" };
    previous = shard_set_error_hook(recording_hook, &hook_cookie);
    check_offsets(&cached_p);
    shard_set_error_hook(previous, NULL);
    shard_stats s = stats_now();
    CHECK_CACHE(s, 1, fresh_commit(n), "after interior pointers of the cached block");
    unsigned char *q = shard_malloc(n);
    CHECKF(q == p, "malloc(%zu) = %p, the cached block is %p", n, (void *)q, (void *)p);
    if (q) {
        fill64(q, u, 0x8101);
        CHECK_BLOCK(q, u, 0x8101, "block back from the cache");
    }
    hook_reset();
    previous = shard_set_error_hook(recording_hook, &hook_cookie);
    q = q ? shard_realloc(q, 2 * n) : NULL;
    CHECK(q != NULL);
    shard_free(q);
    shard_free(z);
    CHECKF(hook_record.calls == 0, "valid calls reached the hook %d times", hook_record.calls);
    shard_set_error_hook(previous, NULL);
    cache_undrain(&d);
    check_allocator("after interior pointers of large blocks");
#endif
}

/* ---- out of memory ---- */

/* Impossible sizes give NULL from malloc, calloc and realloc, and reserve nothing that stays: SIZE_MAX,
 * 2^62, 4 TB (the address space may be there, the memory is not) and calloc products that overflow (a
 * size some address space could hold is tried a second time after what waits was given back, so the
 * process may hold less afterwards, never more). A
 * large block given to realloc of those, and a medium and a small one given to realloc of the first three,
 * stay live with their address, usable size and contents; a realloc and an allocation of ordinary sizes
 * succeed afterwards. */
TEST(impossible_sizes_give_null_and_leave_a_block_given_to_realloc_as_it_was)
{
#define FOUR_TB ((size_t)4 << 40)
    static const size_t impossible[] = { SIZE_MAX, SIZE_MAX - 4095, (size_t)1 << 62, FOUR_TB };
    enum { I = sizeof impossible / sizeof impossible[0] };
    drained d;
    cache_drain(&d);
#if SHARD_RULES
    /* A block that a failed realloc did not leave live would reach the hook here, not abort. */
    shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
    hook_reset();
    shard_stats s0 = stats_now();
#endif
    for (size_t i = 0; i < I; i++) {
        void *p = shard_malloc(impossible[i]);
        CHECKF(p == NULL, "shard_malloc(%zu) = %p", impossible[i], p);
        if (p)
            shard_free(p);
    }
    {
        void *p = shard_calloc(SIZE_MAX / 2 + 1, 2), *q = shard_calloc((size_t)1 << 31, (size_t)1 << 31),
             *r = shard_calloc((size_t)3 << 62, 5);
        CHECKF(p == NULL && q == NULL && r == NULL, "shard_calloc of 2^64, 2^62 and 15 * 2^62 = %p %p %p", p, q, r);
        shard_free(p);
        shard_free(q);
        shard_free(r);
    }
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECKF(s1.reserved <= s0.reserved && s1.committed <= s0.committed && s1.live_large == s0.live_large &&
               s1.large_cached == s0.large_cached,
           "after impossible allocations: reserved %zu -> %zu, committed %zu -> %zu, live_large %zu -> %zu, cached "
           "%zu -> %zu", s0.reserved, s1.reserved, s0.committed, s1.committed, s0.live_large, s1.live_large,
           s0.large_cached, s1.large_cached);
#endif
    static const size_t kinds[] = { 8 * MB + 5, 500000, 100 };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        drain_into(&d); /* nothing in the cache can expire during the slow failures (Wine: 1 s per 4 TB) */
        unsigned char *p = shard_malloc(kinds[k]);
        CHECK(p != NULL);
        if (!p)
            continue;
        size_t u = shard_usable_size(p);
        fill64(p, u, 0x9000 + k);
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        for (size_t i = 0; i < I; i++) {
            if (impossible[i] == FOUR_TB && k > 0)
                continue; /* 4 TB once, for the large block: the impossible size that gets furthest */
            void *q = shard_realloc(p, impossible[i]);
            CHECKF(q == NULL, "shard_realloc(%zu-byte block, %zu) = %p", kinds[k], impossible[i], q);
            if (q) {
                p = q;
                break;
            }
            CHECKF(shard_usable_size(p) == u, "a %zu-byte block after realloc to %zu: usable %zu -> %zu", kinds[k],
                   impossible[i], u, shard_usable_size(p));
            CHECK_BLOCK(p, u, 0x9000 + k, "%zu-byte block after realloc to %zu failed", kinds[k], impossible[i]);
        }
#if SHARD_RULES
        shard_stats b = stats_now();
        CHECKF(b.reserved == a.reserved && b.committed == a.committed && b.live_large == a.live_large &&
                   b.live_medium == a.live_medium && b.live_small == a.live_small,
               "failed reallocs of a %zu-byte block: reserved %zu -> %zu, committed %zu -> %zu, live large %zu -> "
               "%zu, medium %zu -> %zu, small %zu -> %zu", kinds[k], a.reserved, b.reserved, a.committed,
               b.committed, a.live_large, b.live_large, a.live_medium, b.live_medium, a.live_small, b.live_small);
#endif
        unsigned char *q = shard_realloc(p, 2 * u);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu) after the failures", u, 2 * u);
        if (q) {
            CHECK_BLOCK(q, u, 0x9000 + k, "block grown after failed reallocs");
            p = q;
        }
        shard_free(p);
    }
    unsigned char *p = shard_malloc(16 * MB);
    CHECK(p != NULL);
    if (p) {
        fill64(p, 16 * MB, 0x9010);
        CHECK_BLOCK(p, 16 * MB, 0x9010, "a large block after the failures");
        shard_free(p);
    }
#if SHARD_RULES
    CHECKF(hook_record.calls == 0, "a block given to a failed realloc was not live afterwards: the hook was called "
           "%d times, last with error %d and %p", hook_record.calls, hook_record.error, hook_record.ptr);
    shard_set_error_hook(previous, NULL);
#endif
    cache_undrain(&d);
    check_allocator("after impossible sizes");
}

/* ---- other threads ---- */

enum { HANDED = 5 };

struct handover {
    unsigned char *blocks[HANDED];
    size_t sizes[HANDED];   /* the bytes that hold the pattern */
    size_t to[HANDED];      /* realloc to this, 0: free */
    uint64_t seeds[HANDED];
};

/* The other thread: checks each block, resizes it (or frees it) and fills it with the next seed. Under
 * shardmm's rules, a block stays in place exactly as it would for the thread that allocated it. */
static void *resize_handed(void *arg)
{
    struct handover *h = arg;
    for (int i = 0; i < HANDED; i++) {
        unsigned char *p = h->blocks[i], *q;
        CHECK_BLOCK(p, h->sizes[i], h->seeds[i], "large block %d handed to another thread", i);
        if (h->to[i] == 0) {
            shard_free(p);
            h->blocks[i] = NULL;
            continue;
        }
        q = shard_realloc(p, h->to[i]);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu) by another thread", h->sizes[i], h->to[i]);
        if (!q)
            continue;
        CHECK_BLOCK(q, min_size(h->sizes[i], h->to[i]), h->seeds[i], "large block %d resized by another thread", i);
#if SHARD_RULES
        size_t m = h->to[i];
        int stays = m > MEDIUM_MAX && need(m) <= reservation(h->sizes[i]);
        CHECKF((q == p) == stays, "another thread's realloc(%zu -> %zu) of a fresh block %s", h->sizes[i], m,
               q == p ? "stayed" : "moved");
        if (m > MEDIUM_MAX)
            CHECKF(shard_usable_size(q) == (stays ? fresh_usable(m) : fresh_usable(move_target(m))),
                   "another thread's realloc(%zu -> %zu): usable %zu", h->sizes[i], m, shard_usable_size(q));
#endif
        h->blocks[i] = q;
        h->sizes[i] = h->to[i];
        h->seeds[i] += 100;
        fill64(q, h->sizes[i], h->seeds[i]);
    }
    check_allocator("in the thread that resized handed blocks");
    return NULL;
}

/* Fresh blocks of the main thread resized by another: grown within the reservation and shrunk below half
 * in place, grown beyond it and shrunk to a medium size by a move, one freed; the main thread checks the
 * new contents and frees them. The block the other thread freed is in the one cache of the process: the
 * main thread's next malloc of its size takes it. */
TEST(large_blocks_resized_and_freed_by_another_thread_keep_contents_and_share_one_cache)
{
    NEEDS_NO_COLOURS();
    struct handover h = {
        { 0 },
        { 2 * MB + 1, 6 * MB, 17 * MB, 40 * MB, 3 * MB },
        { 4 * MB, LARGE_MIN, 40 * MB, 500000, 0 }, /* 2 MB + 1 reserves 4 MB + 64 KB */
        { 0xa000, 0xa001, 0xa002, 0xa003, 0xa004 },
    };
    drained d;
    cache_drain(&d);
    int ok = 1;
    for (int i = 0; i < HANDED; i++) {
        h.blocks[i] = shard_malloc(h.sizes[i]);
        CHECK(h.blocks[i] != NULL);
        ok &= h.blocks[i] != NULL;
        if (h.blocks[i])
            fill64(h.blocks[i], h.sizes[i], h.seeds[i]);
    }
    if (!ok) {
        for (int i = 0; i < HANDED; i++)
            shard_free(h.blocks[i]);
        cache_undrain(&d);
        return;
    }
    unsigned char *freed_there = h.blocks[HANDED - 1];
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    run_thread(resize_handed, &h);
#if SHARD_RULES
    shard_stats s1 = stats_now();
    /* The freed 3 MB block is cached; the old blocks of the two moves (17 MB and 40 MB) may be. */
    int consistent = 0;
    for (int moved_17 = 0; moved_17 <= 1; moved_17++)
        for (int moved_40 = 0; moved_40 <= 1; moved_40++)
            consistent |= s1.large_cached == (size_t)(1 + moved_17 + moved_40) &&
                          s1.large_cached_bytes == fresh_commit(3 * MB) + (moved_17 ? fresh_commit(17 * MB) : 0) +
                                                       (moved_40 ? fresh_commit(40 * MB) : 0);
    CHECKF(consistent, "after another thread's free of 3 MB and moves out of 17 and 40 MB blocks, the cache holds "
           "%zu blocks of %zu bytes", s1.large_cached, s1.large_cached_bytes);
    CHECKF(s1.live_large + 2 == s0.live_large, "live_large %zu -> %zu: one block freed, one moved to medium",
           s0.live_large, s1.live_large);
#endif
    unsigned char *again = shard_malloc(3 * MB);
    CHECK(again != NULL);
#if SHARD_RULES
    CHECKF(again == freed_there, "malloc(3 MB) = %p, the block another thread freed into the cache is %p",
           (void *)again, (void *)freed_there);
#else
    (void)freed_there;
#endif
    if (again) {
        fill64(again, 3 * MB, 0xa010);
        CHECK_BLOCK(again, 3 * MB, 0xa010, "block back from another thread's free");
    }
    for (int i = 0; i < HANDED; i++)
        if (h.blocks[i]) {
            CHECK_BLOCK(h.blocks[i], h.sizes[i], h.seeds[i], "block %d back from another thread", i);
            shard_free(h.blocks[i]);
        }
    shard_free(again);
    cache_undrain(&d);
    check_allocator("after blocks resized by another thread");
}

struct outlive {
    unsigned char *blocks[3];
    size_t sizes[3];
    uint64_t seed;
};

static void *allocate_and_exit(void *arg)
{
    struct outlive *o = arg;
    for (int i = 0; i < 3; i++) {
        o->blocks[i] = shard_malloc(o->sizes[i]);
        CHECK(o->blocks[i] != NULL);
        if (o->blocks[i])
            fill64(o->blocks[i], o->sizes[i], o->seed + (uint64_t)i);
    }
    return NULL;
}

/* Large blocks outlive the thread that allocated them: after it exited, the main thread finds them intact,
 * grows one in place, shrinks one in place, moves one, and frees them. */
TEST(large_blocks_outlive_their_thread_and_any_thread_resizes_them_in_place)
{
    struct outlive o = { { 0 }, { 2 * MB, 5 * MB + 7, 9 * MB }, 0xa100 };
    static const size_t to[3] = { 4 * MB, LARGE_MIN, 30 * MB }; /* 2 MB reserves 4 MB + 64 KB */
    drained d;
    cache_drain(&d);
    run_thread(allocate_and_exit, &o);
    for (int i = 0; i < 3; i++) {
        unsigned char *p = o.blocks[i], *q;
        if (!p)
            continue;
        CHECK_BLOCK(p, o.sizes[i], o.seed + (uint64_t)i, "block %d of an exited thread", i);
        q = shard_realloc(p, to[i]);
        CHECK(q != NULL);
        if (!q) {
            shard_free(p);
            continue;
        }
#if SHARD_RULES
        int stays = need(to[i]) <= reservation(o.sizes[i]);
        CHECKF((q == p) == stays, "realloc(%zu -> %zu) of an exited thread's block %s", o.sizes[i], to[i],
               q == p ? "stayed" : "moved");
#endif
        CHECK_BLOCK(q, min_size(o.sizes[i], to[i]), o.seed + (uint64_t)i, "block %d of an exited thread resized", i);
        shard_free(q);
    }
    cache_undrain(&d);
    check_allocator("after blocks of an exited thread");
}

/* Threads trading large blocks through shared slots: each takes a block another may have left, checks
 * it, resizes, frees or replaces it and leaves it for the others. Interleaving varies from run to run;
 * the contents are checked at every hand-over and the cache stays within its limits. */
enum { SLOTS = 8, TRADERS = 4, TRADES = 24 };

static struct {
    unsigned char *p;
    size_t n;
    uint64_t seed;
    int busy;
} slots[SLOTS];
static mutex_t slots_lock = MUTEX_INIT;

static size_t trade_size(size_t id, size_t k)
{
    if (k % 7 == 3)
        return 300000 + 1000 * id; /* now and then a medium block */
    return LARGE_MIN + (id * 7919 + k * 104729) % (3 * MB);
}

static void *trader(void *arg)
{
    size_t id = (size_t)(uintptr_t)arg;
    for (size_t k = 0; k < TRADES; k++) {
        size_t i = (id * 5 + k * 3) % SLOTS;
        mutex_lock(&slots_lock);
        if (slots[i].busy) {
            mutex_unlock(&slots_lock);
            continue;
        }
        slots[i].busy = 1;
        unsigned char *p = slots[i].p;
        size_t n = slots[i].n;
        uint64_t seed = slots[i].seed;
        mutex_unlock(&slots_lock);
        size_t m = trade_size(id, k);
        uint64_t next = 0xb000 + 1000 * id + k;
        if (p)
            CHECK_BLOCK(p, n, seed, "slot %zu taken by trader %zu", i, id);
        if (p && k % 3 != 2) {
            unsigned char *q = shard_realloc(p, m);
            CHECKF(q != NULL, "trader %zu: shard_realloc(%zu -> %zu)", id, n, m);
            if (q) {
                CHECK_BLOCK(q, min_size(n, m), seed, "slot %zu resized by trader %zu", i, id);
                p = q;
            } else {
                m = n;
            }
        } else {
            shard_free(p);
            p = shard_malloc(m);
            CHECKF(p != NULL, "trader %zu: shard_malloc(%zu)", id, m);
        }
        if (p)
            fill64(p, m, next);
        mutex_lock(&slots_lock);
        slots[i].p = p;
        slots[i].n = p ? m : 0;
        slots[i].seed = next;
        slots[i].busy = 0;
        mutex_unlock(&slots_lock);
    }
    check_allocator("in a trader thread");
    return NULL;
}

TEST(threads_trading_large_blocks_keep_their_contents_and_the_cache_within_its_limits)
{
    thread_t t[TRADERS];
    int started[TRADERS];
#if SHARD_RULES
    shard_collect(); /* the cache empty, its default limit counted from the blocks live now */
    shard_stats s0 = stats_now();
    size_t live_before = s0.live_large;
#endif
    memset(slots, 0, sizeof slots);
    for (size_t i = 0; i < TRADERS; i++) {
        started[i] = thread_start(&t[i], trader, (void *)(uintptr_t)i) == 0;
        CHECKF(started[i], "trader %zu did not start", i);
    }
    for (size_t i = 0; i < TRADERS; i++)
        if (started[i])
            thread_join(t[i]);
    for (size_t i = 0; i < SLOTS; i++)
        if (slots[i].p) {
            CHECK_BLOCK(slots[i].p, slots[i].n, slots[i].seed, "slot %zu after the trade", i);
            shard_free(slots[i].p);
            slots[i].p = NULL;
        }
#if SHARD_RULES
    shard_stats s = stats_now();
    CHECKF(s.live_large == live_before, "live_large %zu before the trade, %zu after every block was freed",
           live_before, s.live_large);
    /* By default the cache may also hold up to 9/8 of the live blocks' high: at most what they held
     * before and what a slot's block (8 MB at most, committed) and a block on the move in each trader's
     * hands add. */
    size_t bytes_max = CACHE_MAX_BYTES, high_max = s0.live_large_committed + (SLOTS + TRADERS) * 8 * MB;
    high_max += high_max / 8;
    if (!cache_limit_fixed() && high_max > bytes_max)
        bytes_max = high_max;
    CHECKF(s.large_cached <= CACHE_MAX_BLOCKS && s.large_cached_bytes <= bytes_max,
           "the cache holds %zu blocks of %zu bytes, at most %zu of %zu", s.large_cached, s.large_cached_bytes,
           (size_t)CACHE_MAX_BLOCKS, bytes_max);
#endif
    check_allocator("after the trade");
}

/* ---- the threads' spares ---- */

/* A thread's spare (README.md, SHARDMM_LARGE_SPARES): the large block it freed last waits for its own
 * next large malloc, counted as cached, out of the other threads' reach until it leaves for the cache (the
 * thread frees another, or exits, or its malloc does not fit it) or for the OS (a trim, or the delay
 * passed: at the first look of any thread's cache call between one and two delays after the free). The
 * tests of the process's cache above run with SHARDMM_LARGE_SPARES=0 (tests/run), these only without. */

/* SHARDMM_DELAY_MS as the test reads it: the spares' delay, ms. */
__attribute__((unused)) static long spare_delay_ms(void)
{
    const char *d = getenv("SHARDMM_DELAY_MS");
    return d != NULL && *d != 0 ? atol(d) : CACHE_DELAY_MS;
}

__attribute__((unused)) static uint64_t spare_now_ms(void)
{
#ifdef _WIN32
    return (uint64_t)GetTickCount64();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
#endif
}

enum { SPARE_SIZE = 3 * MB };

struct spare_run {
    int step; /* 1: the thread freed its first block; 2: go on; 3: it freed its second; 4: exit */
    unsigned char *first, *second;
};

__attribute__((unused)) static void spare_wait(int *step, int value)
{
    while (__atomic_load_n(step, __ATOMIC_ACQUIRE) < value)
        sleep_ms(1);
}

/* A block of SPARE_SIZE allocated, filled, checked and freed; its address in *p. */
__attribute__((unused)) static void spare_round(unsigned char **p, uint64_t seed, const char *what)
{
    *p = shard_malloc(SPARE_SIZE);
    CHECK(*p != NULL);
    if (*p) {
        fill64(*p, SPARE_SIZE, seed);
        CHECK_BLOCK(*p, SPARE_SIZE, seed, "%s", what);
    }
    shard_free(*p);
}

/* malloc(n), which must give `expected`: the block filled with seed's pattern and checked. */
__attribute__((unused)) static unsigned char *spare_expect(size_t n, const void *expected, uint64_t seed,
                                                           const char *what)
{
    unsigned char *p = shard_malloc(n);
    CHECK(p != NULL);
    CHECKF(p == expected, "%s: malloc(%zu) got %p, not %p", what, n, (void *)p, expected);
    if (p) {
        fill64(p, n, seed);
        CHECK_BLOCK(p, n, seed, "%s", what);
    }
    return p;
}

__attribute__((unused)) static void *spare_thread(void *arg)
{
    struct spare_run *r = arg;
    spare_round(&r->first, 0xb100, "the thread's first block");
    __atomic_store_n(&r->step, 1, __ATOMIC_RELEASE);
    spare_wait(&r->step, 2);
    spare_round(&r->second, 0xb101, "the thread's second block");
    __atomic_store_n(&r->step, 3, __ATOMIC_RELEASE);
    spare_wait(&r->step, 4);
    return NULL;
}

/* The thread of r started, and its first block freed; 0 when it did not start. */
__attribute__((unused)) static int spare_start(struct spare_run *r, thread_t *t)
{
    int started = thread_start(t, spare_thread, r) == 0;
    CHECK(started);
    if (started)
        spare_wait(&r->step, 1);
    return started;
}

TEST(spare_a_thread_takes_back_the_block_it_freed_last_and_others_get_it_once_the_thread_exits)
{
    NEEDS_NO_COLOURS();
    if (!spares_on())
        SKIP_TEST();
#if SHARD_RULES
    shard_collect(); /* no spare of this thread's, no cached block */
    shard_stats s0 = stats_now();
    struct spare_run r = { 0, NULL, NULL };
    thread_t t;
    if (!spare_start(&r, &t))
        return;
    shard_stats s1 = stats_now();
    CHECKF(s1.live_large == s0.live_large && s1.live_large_bytes == s0.live_large_bytes &&
               s1.live_large_committed == s0.live_large_committed,
           "after the thread's free: live_large %zu -> %zu (%zu -> %zu bytes, %zu -> %zu committed)", s0.live_large,
           s1.live_large, s0.live_large_bytes, s1.live_large_bytes, s0.live_large_committed, s1.live_large_committed);
    CHECK_CACHE(s1, s0.large_cached + 1, s0.large_cached_bytes + fresh_commit(SPARE_SIZE),
                "the thread's freed block, its spare");
    unsigned char *mine = shard_malloc(SPARE_SIZE);
    CHECK(mine != NULL);
    CHECKF(mine != r.first, "malloc(3 MB) here took the block another thread freed last (%p): its spare",
           (void *)r.first);
    if (mine)
        fill64(mine, SPARE_SIZE, 0xb102);
    __atomic_store_n(&r.step, 2, __ATOMIC_RELEASE);
    spare_wait(&r.step, 3);
    CHECKF(r.second == r.first, "the thread's malloc(3 MB) got %p, not the block it freed last, %p", (void *)r.second,
           (void *)r.first);
    __atomic_store_n(&r.step, 4, __ATOMIC_RELEASE);
    thread_join(t);
    unsigned char *after = spare_expect(SPARE_SIZE, r.second, 0xb103, "the exited thread's spare, from the cache");
    if (mine)
        CHECK_BLOCK(mine, SPARE_SIZE, 0xb102, "this thread's block");
    shard_free(mine);
    shard_free(after);
    shard_collect();
    check_allocator("after a thread's spare");
#endif
}

/* A spare serves any request it holds, also one smaller than it commits while the cache holds a block
 * that fits the request more closely: a block of 2 MB (which commits 4 MB where the platform gives large
 * pages, 2 MB and a page elsewhere) freed last, one of 1.5 MB freed before it and cached, then malloc(1.5
 * MB) takes the spare back. Before, the spare went to the cache and the cached block came out: the cache
 * lock twice a call, and blocks of just under 2 MB went round for good (src/large.c, spare_take). */
TEST(spare_serves_a_smaller_request_than_it_commits_while_the_cache_holds_a_closer_fit)
{
    NEEDS_NO_COLOURS();
    if (!spares_on())
        SKIP_TEST();
#if SHARD_RULES
    shard_collect(); /* no spare of this thread's, no cached block */
    shard_stats s0 = stats_now();
    const size_t big = 2 * MB, small = 3 * MB / 2;
    unsigned char *a = shard_malloc(big), *b = shard_malloc(small);
    CHECK(a != NULL && b != NULL);
    if (a == NULL || b == NULL) {
        shard_free(a);
        shard_free(b);
        return;
    }
    fill64(a, big, 0xb300);
    fill64(b, small, 0xb301);
    CHECK_BLOCK(a, big, 0xb300, "the 2 MB block");
    CHECK_BLOCK(b, small, 0xb301, "the 1.5 MB block");
    shard_free(b); /* this thread's spare */
    shard_free(a); /* the spare now, b in the cache */
    CHECK_CACHE_NOW(s0.large_cached + 2, s0.large_cached_bytes + fresh_commit(big) + fresh_commit(small),
                    "a freed (the spare) and b cached");
    unsigned char *p = spare_expect(small, a, 0xb302, "the spare (a) taken for less than it commits, b cached");
    CHECKF(p == NULL || shard_usable_size(p) >= small, "usable size %zu of malloc(%zu)", shard_usable_size(p),
           small);
    CHECK_CACHE_NOW(s0.large_cached + 1, s0.large_cached_bytes + fresh_commit(small), "b still cached");
    unsigned char *q = spare_expect(small, b, 0xb303, "the cached block (b) taken next");
    if (p)
        CHECK_BLOCK(p, small, 0xb302, "the spare's block beside it");
    shard_free(p);
    shard_free(q);
    shard_collect();
    check_allocator("after a spare taken for less");
#endif
}

/* calloc served by the thread's spare (large.c: spare_alloc, the spare's short path) is zero over its
 * usable size, though the block was freed dirty. */
TEST(spare_calloc_takes_the_dirty_spare_and_zeroes_it)
{
    NEEDS_NO_COLOURS();
    if (!spares_on())
        SKIP_TEST();
    const size_t dirty = 3 * MB / 2, asked = 5 * MB / 4;
    unsigned char *p = shard_malloc(dirty);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    memset(p, 0xA5, shard_usable_size(p));
    shard_free(p);
    unsigned char *q = shard_calloc(1, asked);
    CHECKF(q == p, "calloc(%zu) got %p, not the spare %p", asked, (void *)q, (void *)p);
    if (q == NULL)
        return;
    CHECK(shard_usable_size(q) >= asked);
    CHECK_ZERO(q, shard_usable_size(q), "calloc(%zu) from a spare freed full of 0xA5", asked);
    shard_free(q);
    check_allocator("after calloc from the spare");
}

struct spare_race {
    int done;
    int reserve; /* the collector also makes and frees a large block each round */
    long collects;
};

__attribute__((unused)) static void *spare_race_collector(void *arg)
{
    struct spare_race *r = arg;
    while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
#if SHARD_RULES
        shard_collect(); /* takes every heap's spare to the OS: this thread's as the other's (large.c, spare_seize) */
#endif
        if (r->reserve) { /* its reservations may take the memory of blocks it gave back, headers and all */
            unsigned char *q = shard_malloc((3 * MB) / 2);
            if (q != NULL)
                q[0] = (unsigned char)r->collects;
            shard_free(q);
        }
        r->collects++;
    }
    return NULL;
}

/* The collector's thread started for a spare race (a failed check when it could not be): 1 when it runs. */
__attribute__((unused)) static int spare_race_start(struct spare_race *r, thread_t *t)
{
    int started = thread_start(t, spare_race_collector, r) == 0;
    CHECK(started);
    return started;
}

/* Round i's block of the spare races, of one of two sizes in turn, written at every page and at its last
 * word and read back; *bad counts the words found changed. NULL (a failed check) out of memory. */
__attribute__((unused)) static uint64_t *spare_race_block(long i, long *bad)
{
    enum { PAGE_WORDS = 4096 / 8 };
    static const size_t sizes[2] = { (3 * MB) / 2, (5 * MB) / 4 };
    size_t n = sizes[i % 2] / 8;
    uint64_t *p = shard_malloc(n * 8);
    CHECK(p != NULL);
    if (p == NULL)
        return NULL;
    for (size_t w = 0; w < n; w += PAGE_WORDS)
        p[w] = (uint64_t)i * 0x9e3779b97f4a7c15u ^ w;
    p[n - 1] = ~(uint64_t)i;
    for (size_t w = 0; w < n; w += PAGE_WORDS)
        *bad += p[w] != ((uint64_t)i * 0x9e3779b97f4a7c15u ^ w);
    *bad += p[n - 1] != ~(uint64_t)i;
    return p;
}

/* One thread takes its spare back round after round (without a locked instruction where the port
 * fences all threads: large.c, spare_own) while another takes every spare to the OS as fast as it can.
 * Each block is written at every page and read back before its free: a block taken by both would be
 * unmapped under the writer (a fault) or handed out twice. */
TEST(spare_its_thread_takes_while_another_thread_collects_goes_to_one_of_them)
{
    if (!spares_on())
        SKIP_TEST();
    enum { ROUNDS = 40000 };
    struct spare_race r = { 0, 0, 0 };
    thread_t t;
    if (!spare_race_start(&r, &t))
        return;
    long bad = 0, taken_back = 0;
    uint64_t *last = NULL;
    for (long i = 0; i < ROUNDS && bad == 0; i++) {
        uint64_t *p = spare_race_block(i, &bad);
        if (p == NULL)
            break;
        taken_back += last != NULL && ((uintptr_t)p ^ (uintptr_t)last) < LARGE_GRANULE; /* its header's: the same block */
        last = p;
        shard_free(p);
    }
    __atomic_store_n(&r.done, 1, __ATOMIC_RELEASE);
    thread_join(t);
    CHECKF(bad == 0, "%ld words of this thread's blocks changed under it", bad);
    /* Both sides must have had their turns: the spare served this thread, and the collector ran. */
    CHECKF(taken_back > ROUNDS / 100 && r.collects > 100, "%ld of %d blocks were the spare, %ld collects",
           taken_back, ROUNDS, r.collects);
    check_allocator("after the spare races");
}

/* shard_check looks at the calling thread's spare (large.c's large_check) while another thread takes
 * every spare to the OS as fast as it can and makes blocks of its own: the check must hold the spare
 * while it reads the block's header, or the other thread may give the block's memory back and write a
 * header of its own there meanwhile (a fault, or a problem reported for nothing; ThreadSanitizer saw the
 * read race with that write, and tests/fuzz runs this test under it). Each block is written at every
 * page and read back before its free, and every check must find nothing. */
TEST(spare_its_thread_checks_while_another_thread_collects)
{
    if (!spares_on())
        SKIP_TEST();
    enum { ROUNDS = 4000 };
    struct spare_race r = { 0, 1, 0 };
    thread_t t;
    if (!spare_race_start(&r, &t))
        return;
    long bad = 0, problems = 0;
    for (long i = 0; i < ROUNDS && bad == 0 && problems == 0; i++) {
        uint64_t *p = spare_race_block(i, &bad);
        if (p == NULL)
            break;
        shard_free(p);
#if SHARD_RULES
        problems += shard_check(); /* the block just freed is this thread's spare, unless taken already */
#endif
    }
    __atomic_store_n(&r.done, 1, __ATOMIC_RELEASE);
    thread_join(t);
    CHECKF(bad == 0, "%ld words of this thread's blocks changed under it", bad);
    CHECKF(problems == 0, "shard_check found %ld problems", problems);
    CHECKF(r.collects > 10, "the collector ran %ld times", r.collects);
    check_allocator("after the checks beside the collector");
}

/* The thread's block waits in its spare while this thread's cache calls look (two sizes that take turns,
 * so that its own spare goes to the cache each time: 2 MB and 9 MB, which commit 4 and 10 MB and never
 * take each other's block), and goes back to the OS between one and two delays after its free; then a
 * second one goes at shard_collect. */
TEST(spare_goes_back_to_the_os_after_waiting_the_delay_and_at_shard_collect)
{
    if (!spares_on())
        SKIP_TEST();
#if SHARD_RULES
    shard_collect();
    shard_stats s0 = stats_now();
    const long delay = spare_delay_ms(), step_ms = delay / 10 > 0 ? delay / 10 : 1;
    static const size_t turns[2] = { 2 * MB, 9 * MB };
    const size_t spare = fresh_commit(SPARE_SIZE);
    struct spare_run r = { 0, NULL, NULL };
    thread_t t;
    if (!spare_start(&r, &t))
        return;
    uint64_t freed_ms = spare_now_ms();
    long gone_ms = -1;
    for (unsigned i = 0; gone_ms < 0 && spare_now_ms() - freed_ms < (uint64_t)(2 * delay + 20 * step_ms); i++) {
        uint64_t before = spare_now_ms();
        unsigned char *m = shard_malloc(turns[i % 2]);
        CHECK(m != NULL);
        if (m) {
            fill64(m, turns[i % 2], 0xb200 + i);
            CHECK_BLOCK(m, turns[i % 2], 0xb200 + i, "this thread's block of turn %u", i);
        }
        shard_free(m);
        /* This thread's blocks: the one just freed (its spare) and, from the second turn on, the other. */
        size_t mine = 1 + (i > 0), mine_bytes = fresh_commit(turns[i % 2]) + (i > 0 ? fresh_commit(turns[1 - i % 2]) : 0);
        shard_stats s = stats_now();
        if (s.large_cached == s0.large_cached + mine && s.large_cached_bytes == s0.large_cached_bytes + mine_bytes)
            gone_ms = (long)(before - freed_ms); /* it was there at the last look, at least */
        else
            CHECK_CACHE(s, s0.large_cached + mine + 1, s0.large_cached_bytes + mine_bytes + spare,
                        "turn %u, %llu ms after the thread's free", i, (unsigned long long)(spare_now_ms() - freed_ms));
        sleep_ms(step_ms);
    }
    CHECKF(gone_ms >= delay - step_ms && gone_ms < 2 * delay + 20 * step_ms,
           "the thread's spare went %ld ms after its free, the delay is %ld ms", gone_ms, delay);
    shard_collect();
    __atomic_store_n(&r.step, 2, __ATOMIC_RELEASE);
    spare_wait(&r.step, 3);
    shard_stats s1 = stats_now();
    CHECK_CACHE(s1, s0.large_cached + 1, s0.large_cached_bytes + spare, "the thread's second block freed");
    shard_collect();
    shard_stats s2 = stats_now();
    CHECK_CACHE(s2, 0, 0, "after shard_collect");
    CHECKF(s2.live_large == s0.live_large && s2.live_large_committed == s0.live_large_committed,
           "shard_collect changed live_large %zu -> %zu, committed %zu -> %zu", s0.live_large, s2.live_large,
           s0.live_large_committed, s2.live_large_committed);
    __atomic_store_n(&r.step, 4, __ATOMIC_RELEASE);
    thread_join(t);
    check_allocator("after the spares went back");
#endif
}

/* ---- colours (SHARDMM_LARGE_COLOURS: tests/run runs these without it, the rules above with it 0) ---- */

#if SHARD_RULES
/* Where block p starts in its 4 MB granule, whose start holds its header. */
static size_t granule_offset(const void *p) { return (uintptr_t)p & (LARGE_GRANULE - 1); }

/* The usable size a block of n bytes starting `offset` bytes into its granule has: its need, the request
 * and the bytes before it rounded up to whole pages, less those bytes. */
static size_t coloured_usable(size_t n, size_t offset) { return round_up(n + offset, 4096) - offset; }

/* p, a block of n bytes with no alignment of its own, starts at a colour: 32 (64 for a created heap's,
 * which has a field there) plus a multiple of 64 bytes, within its header's page; its usable size is its
 * need less that. Its colour, or -1. */
static int check_colour(const void *p, size_t n, size_t base, const char *what)
{
    size_t off = granule_offset(p), u = shard_usable_size(p);
    int ok = off >= base && (off - base) % 64 == 0 && off - base < 64 * 64 && u == coloured_usable(n, off);
    CHECKF(ok, "%s: malloc(%zu) = %p, %zu bytes into its granule (base %zu), usable %zu, expected %zu", what, n, p, off,
           base, u, coloured_usable(n, off));
    return ok ? (int)((off - base) / 64) : -1;
}
#endif

/* Consecutive blocks start at many of the 64 cache lines of their first page, not all at 32 bytes in, so
 * that their first lines do not share one set of every cache; each block's usable size is what its pages
 * hold after its colour, and it keeps the colour through realloc in place and through a move. */
TEST(colours_spread_consecutive_blocks_over_the_cache_lines_of_their_first_page)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (!colours_on())
        SKIP_TEST();
    enum { N = 64 };
    unsigned char *blocks[N];
    size_t sizes[N];
    int seen[64] = { 0 }, distinct = 0;
    drained d;
    cache_drain(&d);
    for (size_t i = 0; i < N; i++) {
        sizes[i] = MB + 1 + i * 40 * KB;
        blocks[i] = shard_malloc(sizes[i]);
        CHECK(blocks[i] != NULL);
        if (blocks[i] == NULL)
            continue;
        int c = check_colour(blocks[i], sizes[i], 32, "a fresh block");
        if (c >= 0 && !seen[c]++)
            distinct++;
        fill64(blocks[i], shard_usable_size(blocks[i]), 0xc000 + i);
        for (size_t j = 0; j < i; j++)
            CHECKF(blocks[j] == NULL || ((uintptr_t)blocks[j] ^ (uintptr_t)blocks[i]) >= LARGE_GRANULE,
                   "blocks %zu and %zu share a granule: %p, %p", j, i, (void *)blocks[j], (void *)blocks[i]);
    }
    /* A golden-ratio turn gives 54-56 of the 64 colours to any 64 blocks in a row. */
    CHECKF(distinct >= 48, "64 blocks in a row took %d colours", distinct);
    for (size_t i = 0; i < N; i++) {
        if (blocks[i] == NULL)
            continue;
        size_t off = granule_offset(blocks[i]), u = shard_usable_size(blocks[i]);
        CHECK_BLOCK(blocks[i], u, 0xc000 + i, "block %zu", i);
        /* In place: up and down within what its reservation holds (need + need). */
        size_t up = sizes[i] + 300 * KB, down = sizes[i] + 100 * KB;
        unsigned char *q = shard_realloc(blocks[i], up);
        CHECKF(q == blocks[i], "realloc of block %zu to %zu moved it: %p -> %p", i, up, (void *)blocks[i], (void *)q);
        if (q == NULL)
            continue;
        blocks[i] = q;
        CHECK_BLOCK(q, u, 0xc000 + i, "block %zu grown in place", i);
        CHECK_EQ(shard_usable_size(q), coloured_usable(up, off));
        q = shard_realloc(q, down);
        CHECKF(q == blocks[i], "realloc of block %zu to %zu moved it", i, down);
        if (q == NULL)
            continue;
        blocks[i] = q;
        CHECK_EQ(shard_usable_size(q), coloured_usable(down, off));
        CHECK_BLOCK(q, u < down ? u : down, 0xc000 + i, "block %zu shrunk in place", i);
    }
    /* A move: beyond what the reservation holds, to a block of the same colour. */
    for (size_t i = 0; i < N; i += 9) {
        if (blocks[i] == NULL)
            continue;
        size_t off = granule_offset(blocks[i]), kept = shard_usable_size(blocks[i]), beyond = 6 * sizes[i];
        fill64(blocks[i], kept, 0xc100 + i);
        unsigned char *q = shard_realloc(blocks[i], beyond);
        CHECK(q != NULL);
        if (q == NULL)
            continue;
        blocks[i] = q;
        CHECKF(granule_offset(q) == off, "block %zu moved from %zu to %zu bytes into its granule", i, off,
               granule_offset(q));
        CHECK_BLOCK(q, kept, 0xc100 + i, "block %zu after its move", i);
        CHECK(shard_usable_size(q) >= beyond);
        fill64(q, shard_usable_size(q), 0xc200 + i);
        CHECK_BLOCK(q, shard_usable_size(q), 0xc200 + i, "block %zu moved, written whole", i);
    }
    for (size_t i = 0; i < N; i++)
        shard_free(blocks[i]);
    /* Taken again from the cache, a block takes a new colour and is whole and zero where calloc says. */
    for (size_t i = 0; i < 8; i++) {
        unsigned char *z = shard_calloc(1, sizes[i]);
        CHECK(z != NULL);
        if (z == NULL)
            continue;
        check_colour(z, sizes[i], 32, "a block taken again by calloc");
        CHECK_ZERO(z, shard_usable_size(z), "calloc(%zu) of a cached block", sizes[i]);
        shard_free(z);
    }
    cache_undrain(&d);
    check_allocator("after coloured blocks");
#endif
}

/* Blocks aligned to 64 B - 1 KB start at a multiple of their alignment below a page, taken in turn: 32
 * in a row take 24 of the 63 multiples of 64 at least (the golden-ratio turn gives all 32 different
 * ones), and every one of the 15 of 256 and the 3 of 1 KB; each is aligned, has the usable size its pages
 * give after its offset, and keeps its place through realloc in place. 2 KB and more: the alignment. */
TEST(colours_spread_aligned_blocks_over_the_multiples_of_their_alignment)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (!colours_on())
        SKIP_TEST();
    static const struct {
        size_t align;
        int least;
    } cases[] = { { 64, 24 }, { 256, 15 }, { 1024, 3 }, { 2048, 1 }, { 64 * KB, 1 } };
    enum { N = 32 };
    drained d;
    cache_drain(&d);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t align = cases[c].align, offsets[N];
        unsigned char *blocks[N];
        int distinct = 0;
        for (size_t i = 0; i < N; i++) {
            size_t n = 2 * MB + i * 12345;
            blocks[i] = shard_malloc_aligned(n, align);
            CHECK(blocks[i] != NULL);
            offsets[i] = 0;
            if (blocks[i] == NULL)
                continue;
            size_t off = granule_offset(blocks[i]), u = shard_usable_size(blocks[i]);
            CHECKF((uintptr_t)blocks[i] % align == 0 && off % align == 0 && off >= align &&
                       (align >= 2048 ? off == align : off < 4096) && u == coloured_usable(n, off),
                   "aligned(%zu, %zu) = %p, %zu bytes into its granule, usable %zu, expected %zu", n, align,
                   (void *)blocks[i], off, u, coloured_usable(n, off));
            offsets[i] = off;
            int fresh = 1;
            for (size_t j = 0; j < i; j++)
                fresh &= offsets[j] != off;
            distinct += fresh;
            fill64(blocks[i], u, 0xc500 + i);
        }
        CHECKF(distinct >= cases[c].least, "32 blocks aligned to %zu took %d offsets", align, distinct);
        for (size_t i = 0; i < N; i++) {
            if (blocks[i] == NULL)
                continue;
            size_t u = shard_usable_size(blocks[i]), up = 2 * MB + 300 * KB + i * 12345;
            unsigned char *q = shard_realloc(blocks[i], up);
            CHECKF(q == blocks[i], "realloc of aligned block %zu to %zu moved it", i, up);
            if (q != NULL)
                blocks[i] = q;
            CHECK_BLOCK(blocks[i], u, 0xc500 + i, "aligned(%zu) block %zu grown in place", align, i);
            shard_free(blocks[i]);
        }
    }
    cache_undrain(&d);
    check_allocator("after coloured aligned blocks");
#endif
}

/* The other colours of a live or cached block's granule are not blocks: free, realloc and usable_size
 * of them reach the error hook and change nothing, from this thread and another. */
TEST(the_other_colours_of_a_blocks_granule_reach_the_error_hook)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (!colours_on())
        SKIP_TEST();
    const size_t n = 3 * MB;
    unsigned char *p = shard_malloc(n);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    size_t u = shard_usable_size(p), off = granule_offset(p);
    check_colour(p, n, 32, "a block");
    fill64(p, u, 0xc300);
    long offsets[64];
    size_t count = 0;
    for (size_t c = 0; c < 64; c++)
        if (32 + 64 * c != off)
            offsets[count++] = (long)(32 + 64 * c) - (long)off;
    struct not_live live = { p, offsets, count, "another colour of a live block" };
    shard_error_fn previous = shard_set_error_hook(recording_hook, &hook_cookie);
    check_offsets(&live);
    run_thread(check_offsets, &live);
    shard_set_error_hook(previous, NULL);
    CHECK_BLOCK(p, u, 0xc300, "the block after frees of its granule's other colours");
    CHECK_EQ(shard_usable_size(p), u);
    shard_free(p);
    struct not_live cached = { p, offsets, count, "another colour of a cached block" };
    previous = shard_set_error_hook(recording_hook, &hook_cookie);
    check_offsets(&cached);
    shard_set_error_hook(previous, NULL);
    check_allocator("after the other colours of a granule");
#endif
}

/* A created heap's large blocks take colours too, after the field that names their heap: 64 bytes into
 * their granule plus a multiple of 64, the last colour a page in. */
TEST(a_created_heaps_large_blocks_take_colours_after_its_field)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    if (!colours_on())
        SKIP_TEST();
    enum { N = 16 };
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    unsigned char *blocks[N];
    int seen[64] = { 0 }, distinct = 0;
    for (size_t i = 0; i < N; i++) {
        size_t n = 2 * MB + i * 4096;
        blocks[i] = shard_heap_malloc(h, n);
        CHECK(blocks[i] != NULL);
        if (blocks[i] == NULL)
            continue;
        int c = check_colour(blocks[i], n, 64, "a created heap's block");
        if (c >= 0 && !seen[c]++)
            distinct++;
        fill64(blocks[i], shard_usable_size(blocks[i]), 0xc400 + i);
    }
    CHECKF(distinct >= 12, "16 blocks of a created heap took %d colours", distinct);
    for (size_t i = 0; i < N; i++)
        if (blocks[i] != NULL)
            CHECK_BLOCK(blocks[i], shard_usable_size(blocks[i]), 0xc400 + i, "created heap's block %zu", i);
    for (size_t i = 0; i < N; i += 2)
        shard_free(blocks[i]);
    shard_heap_destroy(h); /* the rest with it */
    check_allocator("after a created heap's coloured blocks");
#endif
}
