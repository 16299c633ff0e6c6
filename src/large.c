/* large.c - blocks above 1 MB: one reservation each (or, on Linux, a part of one: the cache splits
 * them), with address headroom, and a cache of freed blocks shared by the process (the seed's "Large
 * blocks").
 *
 * A block is one reservation, aligned to 4 MB so that the segment map can mark it (SEG_LARGE, one
 * entry: the rest of the reservation stays SEG_NONE, so an address in it is not a block); a 32-byte
 * header at the start, the block after it, at one of 64 cache lines from there (its colour, below). The
 * reservation comes from os_reserve_block: where the port keeps pools (Linux), carved from one without
 * a system call (port.h: reserve_pooled):
 *
 *   start + 0     mark | size | committed | layout (span, offset)     header, 32 bytes
 *   start + 32 + 64 k   the block: `size` usable bytes, k its colour, 0 .. 63 (start + align for an
 *                 aligned block, below)
 *   ...           committed up to start + committed, then address space only up to start + span
 *
 * What a block needs is committed, and where the platform gives large pages up to the next 2 MB from the
 * header (commit_end, below), so that the block's last 2 MB can be one too (a fresh block's once the
 * program's blocks have earned it: earned tails, below).
 *
 * The span is the reservation: what the block needs and as much again as headroom (at most 1 GB of
 * it), rounded to 64 KB, or to 2 MB where the platform gives large pages (span_for): a 1.1 MB block
 * reserves 2.25 MB, or 4 MB. A fresh block takes its headroom from the largest need asked for lately
 * if that is more than its own (asked_high: since the high last came down, below; at most 4 times its
 * own need), so that once freed it can serve the program's largest requests too: a cached block serves
 * only requests its span holds, and without this blocks made for small requests stayed cached beside
 * the large ones, each keeping the pages its lives had written. bench/shapes.c's large-ends (blocks of
 * 5-25 MB written at both ends) peaked at 139.5 MB at one thread, in five blocks of up to 26 MB, against
 * mimalloc 3.4.3's 122.0; with it, at 97.9 MB in 0.8 of the time, and at 2 threads at 193.8 MB against
 * 229.6 (bench/results/2026-12-06-standing-intel-9f9994e.md). A fresh block has no floor under it. The
 * seed's 16 MB floor under every block spared a buffer that grows from 1 MB a move on the way to 1 GB
 * (bench/large.py counts them; on Linux a move copies nothing), and made every block below 8 MB hold
 * 16 MB of address space, a 1.1 MB one fourteen times its size, which the process's size (VSZ) and
 * any limit on it count. A block that has moved to grow has shown that it grows, and reserves at least
 * SHARD_LARGE_GROWN_SPAN_MIN (16 MB) from then on: without that, bench/app's buffers (grown from 1 MB
 * by realloc) moved more often and took 21,100 page faults per run instead of 18,000.
 * The headroom holds only while the process's address space is unlimited: under RLIMIT_AS or
 * RLIMIT_DATA (port_caps.address_space_limit) a block reserves what it needs, rounded to 64 KB, so that
 * the limit holds about as many blocks as it holds bytes, and so does any reservation the address
 * space cannot hold with its headroom.
 * Growing within the committed part changes `size`; within the span it commits pages in place; beyond
 * it the block moves (api.c asks for 1/16 of headroom), so a buffer that keeps growing moves no more
 * often than it doubles. On Linux a move hands the pages over to the new reservation without copying
 * them (port_caps.move_release); Windows has no such call and copies. Shrinking to less than half of what is
 * committed gives the tail back at once; shrinking by less leaves it.
 *
 * An aligned block (shard_malloc_aligned, align 64 B .. 2 MB) starts at start + align, or, aligned to
 * 64 B - 1 KB, at a multiple of align below a page, taken in turn as the colours are (coloured_aligned):
 * the layout keeps log2 of the offset's lowest set bit, and everything from the header up to the block's
 * end is committed as for any block (up to 2 MB - 32 bytes of it unused). A block aligned to 4 MB or
 * more (a "far" block) cannot have its header in its own 4 MB: it starts a 4 MB granule itself. Its
 * reservation is align bytes more than the block, at a multiple of align; the block starts align bytes
 * into it, and its header fills the page just below the block:
 *
 *   start                     address space only (align - 4 KB), never committed
 *   start + align - 4 KB      the header page (the header in its first 32 bytes)
 *   start + align             the block, whose 4 MB is marked SEG_LARGE_FAR in the map
 *
 * (glibc's memalign wastes the alignment the same way.) Far blocks never enter the cache: a cached
 * block is reused at its granule's start. A far block that moves to grow becomes an ordinary block
 * aligned to 4 KB (realloc keeps 16 bytes of alignment).
 *
 * The header's mark is LIVE while the block is live and FREED while it waits in the cache. A pointer is
 * a live block exactly when it is the block's offset into a SEG_LARGE entry of the map (or at the start
 * of a SEG_LARGE_FAR one) and the mark there is LIVE; free makes it FREED, so a second free of the block
 * (like any address that is not a live block) goes to the error hook without touching the cache. A
 * thread's block changes its mark with a plain store, not a locked instruction (why: docs/design.md,
 * Errors), so two frees that race on two threads, a data race in the program, may both pass it. The
 * hardened build, and a created heap's block (its heap's reset or destroy claims it with a CAS,
 * large_release_owned), keep the CAS: of two frees only one gets past it.
 *
 * The cache: up to SHARD_LARGE_CACHE_BLOCKS blocks and a byte limit of committed memory
 * (SHARDMM_LARGE_CACHE_MB, options.h; SHARD_LARGE_CACHE_BYTES by default), oldest first, under a spin
 * lock of its own (pause, then yield: sync.h). Only the choice and the reordering happen under the
 * lock; the OS calls (commit, decommit, release) come after it. While a fork holds the lock, other
 * threads do without the cache: fresh reservations, frees straight back to the OS. A block is shared by
 * the process because large buffers are often allocated by one thread and freed by another.
 * - Choice: among the blocks whose span fits the request, the smallest of those committed enough; else
 *   the one with the most committed memory, which commits the rest in place. Of equals, one the
 *   calling thread freed, and of those the one freed last: its memory is the likeliest to be in the
 *   caches of the thread's core. The oldest was taken before, and bench/shapes.c's turnover (1-2 MB
 *   buffers among smaller blocks, each written whole) took 1.3-1.6 times as long on 1-8 threads
 *   (bench/results/2026-12-05-cache-recent.md). Memory committed beyond the request stays with
 *   the block for growth unless it is both more than four times the request and more than 16 MB.
 * - Split and join, where the port releases a reservation in parts (PORT_RELEASE_PARTS: Linux): a block taken
 *   for much less, committed at least twice the 4 MB granules the request takes and a granule more, keeps
 *   those granules, committed whole, and the rest of its span becomes a cached block of its own, its header
 *   at the next granule like any block's, marked a piece (LAYOUT_PIECE; split_off). The part of the granules
 *   above commit_end (up to 2 MB) was given back once: a block taken again for more then took a fault for
 *   every page of it, or a huge page cleared, each time, and bench/shapes.c's large-ends (5-25 MB blocks
 *   written at both ends) took about 10, 2.5 and 1.3 times as long at 1, 2 and 8 threads
 *   (bench/results/2026-12-06-large-sparse.md). Committed memory kept by a live block serves no other
 *   request, and it raised the live high and the ceiling with it: the upper quartile of bench/shapes.py's
 *   malloc-large@8 peaks (two sets of 75 runs) was 1,174-1,226 MB, split 1,140-1,156 (mimalloc 3.4.3:
 *   1,170-1,182); bench/large.py's churn peaked at 878-886 MB, split 805-838, in 0.88-0.95 of the time. A
 *   block freed next to a cached part of its own reservation joins it (join; the lower header stays): without
 *   that the parts only got smaller and the next larger request found none (bench/large.py's burst took
 *   1.35-1.44 of the time). A live block that grows past its span takes the cached part above it back, in
 *   place (absorb_above): without that it moved to fresh memory while its old excess waited in the cache, and
 *   Ruby's records.rb (bench/programs.py), whose strings grow by realloc, peaked at 146 MB instead of 119
 *   (mimalloc 3.4.3: 143-154). A block that has grown by realloc (LAYOUT_GROWN) is not split when taken
 *   again, as a block that moved to grow keeps its larger span: buffers grown from 1 MB by two threads
 *   (bench/app.c's buffers@2) peaked at 131.6 MB instead of 95.5 when split, the part above one thread's
 *   buffer taken by the other's and the first moving to fresh memory to grow. Splitting off any granule
 *   beyond the kept ones instead of only at twice made malloc-large@1 1.5 times slower: the parts kept lose
 *   the headroom a larger request would have used (bench/results/2026-12-05-large-split.md).
 * - The byte limit follows the live blocks' high (cache_limit): by default the cache may hold, beyond
 *   the 128 MB, what brings live and cached blocks together to an eighth above the most the live ones
 *   held (live_high: the ceiling, room_for_cache). A program whose large working set is 1 GB frees and
 *   allocates it again without a system call for each block, as mimalloc's arenas, which keep freed
 *   memory for a second whatever its size, let it (bench/shapes.py's malloc-large: 128 MB and 32
 *   blocks sent most of its frees to the OS; bench/results/2026-12-03-cache-high.md). The eighth is
 *   for blocks of sizes that vary: a freed block serves only requests its span holds, and without it
 *   (live and cached at most the high) bench/large.py's churn gave freed blocks back to make room for
 *   fresh ones and took their pages from the OS again: 0.64 of the time with it, at a peak 6 % higher
 *   and still below mimalloc's; a quarter gained no more and raised malloc-large@8's peak above
 *   mimalloc's (bench/results/2026-12-03-cache-slack.md). What holds the limit is a new
 *   reservation: a fresh large block first sends back as many of the oldest cached blocks as its own
 *   need would take the total past the ceiling, a segment or arena as many bytes of the cache over
 *   its 128 MB as it reserves (large_cache_shed: small and medium memory is not in the high, and
 *   freed large memory must not let them grow). The high comes down to what live and cached blocks
 *   hold whenever a look-up or an expiry pass gives blocks back for age, or all go at once
 *   (lower_high; a put that finds expired blocks gives them back without it). SHARDMM_LARGE_CACHE_MB
 *   fixes the limit instead, and so does an address-space limit (RLIMIT_AS), which the cached blocks'
 *   reservations count against: 1.1 MB blocks each took a cached 64 MB one there, and the limit held 16
 *   of them instead of 480 (tests/test_hostile.c's address_space_limit).
 * - Back to the OS: a block cached for the delay (SHARDMM_DELAY_MS; SHARD_LARGE_CACHE_DELAY_MS by
 *   default), the oldest ones when slots or bytes run out, and a block committed above the byte limit
 *   at once, without entering (with a limit of 0, every block); all of them when memory runs out
 *   (heap_relieve). The age is checked on every cache access and, through large_cache_expire (one load
 *   when the cache is empty), when a small page becomes free and when a thread exits.
 * - The threads' spares (SHARDMM_LARGE_SPARES, on by default): the block a thread freed last, if it
 *   keeps at most SHARD_LARGE_SPARE_MAX (4 MB) committed and is no part of a split reservation (those
 *   go to the cache, where they join), waits in its heap's `large_spare` word instead of the cache, and
 *   the thread's next large allocation takes it when it holds the need (spare_take); a spare that
 *   does not goes to the cache first, where the choice weighs it with the rest. A thread that
 *   frees and allocates large blocks in turn then takes no lock and changes no shared counter: the cache's
 *   one lock and the live counts' atomics were most of such a call, and they were shared by every
 *   thread (1-2 MB buffers of which a request uses 64 KB at most, bench/shapes.c's requests: 2 and 8
 *   threads took 5.6 and 8 times as long as with spares, 1 thread 1.8 times;
 *   bench/results/2026-12-05-large-spares.md). A spare holds a pointer whose 4 MB alignment leaves room
 *   for its committed pages: one word, which its thread writes and any thread may take (to 0: an
 *   exchange, or its thread's plain stores behind a handshake with the others, spare_own). Its block
 *   stays counted live, committed bytes and all, until it leaves the spare other than by
 *   its thread's allocation; the heap's spare_blocks and spare_bytes keep what its thread's spares took
 *   off the live counts, and large_live_counts and large_cache_counts show spares as cached. It goes
 *   to the cache when its thread frees another block, exits (heap retire) or allocates one it does not
 *   fit; to the OS at shard_collect or memory pressure, and once it has been there at two looks, which
 *   come at most once per delay from any cache call and from the expiry checks of a thread with a
 *   spare (spares_expire: a thread that stopped allocating looks at none, and no clock is read where a
 *   spare is put), so between one and two delays after its free.
 *
 * Depends on: segment.h (OS calls with accounting, the map), medium.h (SHARD_MEDIUM_MAX), sync.h,
 * config.h, libc.h, options.h (the cache's delay and byte limit, the spares), port.h (its page and
 * reservation sizes), heap.h (the calling thread's heap, which keeps its spare; every heap, for the
 * spares' looks and counts).
 */
#include "large.h"

#include "../port/port.h"
#include "config.h"
#include "heap.h"
#include "libc.h"
#include "medium.h"
#include "options.h"
#include "segment.h"

#define LARGE_HEADER ((size_t)32)
#define LARGE_MARK_LIVE 0x4b4c42454752414cull  /* "LARGEBLK" */
#define LARGE_MARK_FREED 0x4b4c424445455246ull /* "FREEDBLK" */
#define LARGE_SIZE_MAX ((size_t)1 << 46)       /* beyond any address space we can map; no sum below wraps */
#define LARGE_ALIGN_NEAR ((size_t)2 << 20)     /* aligned blocks up to this keep their header in their granule */
#define MB ((size_t)1 << 20)
#define LARGE_PAGE ((size_t)2 << 20)          /* x86-64's large page, what port_caps.hint_large_pages may give */

typedef struct large_header {
    uint64_t mark;
    size_t size;       /* usable bytes after the header: the last request, rounded up to the page */
    size_t committed;  /* bytes committed from the header on, a multiple of PORT_PAGE */
    size_t layout;     /* span (bytes from the header to the reservation's end, a multiple of PORT_PAGE)
                        * | log2(the block offset's lowest set bit: offset_of) | LAYOUT_FAR
                        * | log2(align) << LAYOUT_ALIGN_SHIFT (far)
                        * | LAYOUT_PIECE | LAYOUT_GROWN | LAYOUT_SPLIT (near) */
} large_header;
_Static_assert(sizeof(large_header) == LARGE_HEADER, "the block follows a 32-byte header");

/* The marks as stored in header h: the hardened build seals them with the process's secret and the
 * header's address, so a stray write, or a header the program builds, never passes for one. */
#if SHARD_HARDENED
static inline uint64_t mark_live(const large_header *h) { return LARGE_MARK_LIVE ^ secret_of_process() ^ (uintptr_t)h; }
static inline uint64_t mark_freed(const large_header *h) { return LARGE_MARK_FREED ^ secret_of_process() ^ (uintptr_t)h; }
#else
static inline uint64_t mark_live(const large_header *h) { (void)h; return LARGE_MARK_LIVE; }
static inline uint64_t mark_freed(const large_header *h) { (void)h; return LARGE_MARK_FREED; }
#endif

#define LAYOUT_OFFSET_MASK ((size_t)31)
#define LAYOUT_FAR ((size_t)32)
#define LAYOUT_ALIGN_SHIFT 6
#define LAYOUT_PIECE ((size_t)64)  /* a near block cut from the one below it (split_off): they may join again */
#define LAYOUT_GROWN ((size_t)128) /* a near block that grew by realloc: not split when taken again */
#define LAYOUT_SPLIT ((size_t)256) /* a near block a piece was cut from (split_off): no spare, it may join */
#define LAYOUT_PROBE ((size_t)512) /* a fresh near block whose last 2 MB was left on small pages to be read
                                    * at its free (earned tails, below); never kept through reuse */
_Static_assert(LAYOUT_ALIGN_SHIFT + 6 <= 12 && LAYOUT_PROBE < 4096, "the layout's flags fit below the page-sized span");

static size_t span_of(const large_header *h) { return h->layout & ~(PORT_PAGE - 1); }
static int is_far(const large_header *h) { return (h->layout & LAYOUT_FAR) != 0; }
/* Where the block starts, from the header: 32 plus its colour (below), 64 plus its colour for a created
 * heap's block, the alignment of an aligned block, a page for a far one. The layout keeps log2 of the
 * offset's lowest set bit; an offset below a page is the rest of the page after the block's size, since
 * the block ends on a page boundary (size = need - offset, need whole pages, everywhere a size is
 * stored). Atomic loads, as owner_of's: the walks read them (below). */
static size_t offset_of(const large_header *h)
{
    size_t low = (size_t)1 << (load_relaxed(&h->layout) & LAYOUT_OFFSET_MASK);
    return low >= PORT_PAGE ? low : (size_t)-load_relaxed(&h->size) & (PORT_PAGE - 1);
}
static uint8_t *block_of(large_header *h) { return (uint8_t *)h + offset_of(h); }
/* The reservation starts `lead` bytes below the header (0 but for a far block). */
static size_t lead_of(const large_header *h)
{
    return is_far(h) ? ((size_t)1 << (h->layout >> LAYOUT_ALIGN_SHIFT & 63)) - PORT_PAGE : 0;
}
/* The 4 MB the map marks for the block, and how. */
static uintptr_t granule_of(large_header *h) { return is_far(h) ? (uintptr_t)block_of(h) : (uintptr_t)h; }
static unsigned kind_of(const large_header *h) { return is_far(h) ? SEG_LARGE_FAR : SEG_LARGE; }
static size_t layout_of(size_t span, size_t offset) { return span | (size_t)__builtin_ctzll(offset); }
static size_t piece_of(const large_header *h) { return is_far(h) ? 0 : h->layout & LAYOUT_PIECE; }
/* The near block's flags, which its layout keeps through reuse, growth and joins. */
static size_t flags_of(const large_header *h)
{
    return is_far(h) ? 0 : h->layout & (LAYOUT_PIECE | LAYOUT_GROWN | LAYOUT_SPLIT);
}

/* A block of a created heap (shard_heap_create) starts at least 64 bytes in: the 32 bytes after the
 * header name its heap, whose limit counts the block's committed memory and whose destroy releases it.
 * Any block whose offset leaves room holds the field (NULL: a thread's block), so the offset alone says
 * where to look. */
#define LARGE_HEAP_OFFSET ((size_t)64)
typedef struct large_ext {
    heap *owner;
    uint64_t pad[3];
} large_ext;
_Static_assert(LARGE_HEADER + sizeof(large_ext) == LARGE_HEAP_OFFSET, "the heap's field fits before the block");

/* The walks of the segment map (large_visit, large_release_owned) read headers that other threads may be
 * writing at that moment: a block resized or moved in place, or freed and taken again from the cache.
 * The fields they read (layout, owner, size) are loaded as relaxed atomics (offset_of, owner_at), and
 * stored so where that can happen. The mark they read first says the block was live; one that changes
 * during the walk may be reported or not (include/shardmm.h, shard_visit). */
static heap *owner_at(large_header *h, size_t offset)
{
    return offset >= LARGE_HEAP_OFFSET ? load_relaxed(&((large_ext *)(h + 1))->owner) : NULL;
}
static heap *owner_of(large_header *h) { return owner_at(h, offset_of(h)); }

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

/* Colours (SHARDMM_LARGE_COLOURS). Every block starts at the same place in its 4 MB granule, so without
 * them the first lines of all large blocks share one set of each cache: a program that touches the
 * starts of many blocks in turn (their headers, their first elements) misses there every time once the
 * set's ways are full, and a store to a line at the same offset of a 4 KB page (another block's start,
 * or a structure placed so) makes a load of a block's start wait for it on x86 (4K aliasing). So a
 * block without an alignment of its own starts LARGE_COLOUR_STEP * k bytes later than its base (32, or
 * 64 for a created heap's), k one of LARGE_COLOURS, taken by the calling thread's heap in turn along a
 * golden-ratio sequence, which spreads any run of consecutive blocks over the colours; jemalloc offsets
 * its large blocks by a random cache line within their first page for the same reason. It costs address
 * space and commitment only, up to a page a block, and no block more than its need rounded up to pages
 * (bench/results/2026-12-07-large-colours.md). A block keeps its colour while it lives, moves included;
 * taken again from the cache or a spare it gets a new one. A block aligned to 64 B - 1 KB takes a
 * multiple of its alignment below a page in the same turn (coloured_aligned). */
#define LARGE_COLOUR_BITS 6
#define LARGE_COLOURS ((size_t)1 << LARGE_COLOUR_BITS)
#define LARGE_COLOUR_STEP ((size_t)64)
_Static_assert(LARGE_HEAP_OFFSET + LARGE_COLOUR_STEP * (LARGE_COLOURS - 1) <= PORT_PAGE,
               "a coloured block starts in its header's page, or a created heap's at the next");

/* The next of `count` places in the turn of heap me (0 .. count - 1), or 0 with colours off, without a
 * heap or with one place: the golden-ratio sequence's fraction scaled to count. */
static size_t colour_turn(heap *me, size_t count)
{
    if (me == NULL || !options_values.large_colours || count <= 1)
        return 0;
    uint32_t turn = me->large_colour++;
    return (size_t)((uint64_t)(uint32_t)(turn * 0x9e3779b9u) * count >> 32);
}

/* The offset of a block with no alignment of its own beyond 32 bytes, from its base (LARGE_HEADER, or
 * LARGE_HEAP_OFFSET for a created heap's). */
static size_t coloured(heap *me, size_t base) { return base + LARGE_COLOUR_STEP * colour_turn(me, LARGE_COLOURS); }

/* The offset of a near block aligned to `align` (64 B .. 2 MB): below a page, a multiple of its alignment
 * taken in turn as the colours are (one of 63 for 64 bytes, one of 3 for 1 KB); from 2 KB on the
 * alignment itself. */
static size_t coloured_aligned(heap *me, size_t align)
{
    return align * (1 + colour_turn(me, align < PORT_PAGE ? PORT_PAGE / align - 1 : 1));
}

/* The bytes from the header to the block's end, whole pages. */
static size_t need_of(size_t size, size_t offset) { return round_up(size + offset, PORT_PAGE); }

/* How much headroom a new reservation gets (see the file comment). */
enum headroom { HEADROOM_NONE, HEADROOM_FRESH, HEADROOM_GROWN,
                HEADROOM_MOVED }; /* a fresh block for a smaller one that grows (large_alloc_grown) */

/* The largest need asked for since lower_high (below); 0 after it. Read by every allocation, written
 * rarely: a line of its own, away from the live counts that other threads' allocations write, since a
 * thread served by its spare otherwise touches no shared line. */
static struct {
    size_t need __attribute__((aligned(64)));
    char pad[64 - sizeof(size_t)];
} asked_high;

/* An allocation asked for `need` bytes. Racy by design: a lost raise only makes a span smaller. */
static void note_asked(size_t need)
{
    if (need > load_relaxed(&asked_high.need))
        store_relaxed(&asked_high.need, need);
}

/* The span of a new reservation for `need` bytes (a fresh one's headroom from asked_high: the file
 * comment). With headroom and large pages it ends on a large page's boundary: a span that ends inside
 * a 2 MB leaves that 2 MB in 4 KB pages for good, and a block that grew in place into it took a fault
 * per 4 KB there (bench/shapes.py's mixed, whose blocks of 1-4 MB grow by half: 400-500 faults in each
 * such 2 MB). It costs address space only. */
static size_t span_for(size_t need, enum headroom headroom)
{
    size_t least = round_up(need, PORT_RESERVE_ALIGN);
    if (headroom == HEADROOM_NONE || os_address_space_limit() != SIZE_MAX)
        return least;
    size_t asked = load_relaxed(&asked_high.need), room_for = need;
    if ((headroom == HEADROOM_FRESH || headroom == HEADROOM_MOVED) && asked > need)
        room_for = asked < 4 * need ? asked : 4 * need;
    size_t extra = room_for < SHARD_LARGE_HEADROOM_MAX ? room_for : SHARD_LARGE_HEADROOM_MAX;
    size_t span = need + extra;
    if (headroom == HEADROOM_GROWN && span < SHARD_LARGE_GROWN_SPAN_MIN)
        span = SHARD_LARGE_GROWN_SPAN_MIN;
    return round_up(span, SHARD_LARGE_PAGES && os_has_large_pages() ? LARGE_PAGE : PORT_RESERVE_ALIGN);
}

/* How far a block of `need` bytes (header included), with a span of `span`, is committed: where the
 * platform gives large pages, up to the next LARGE_PAGE boundary from its header (the start of its
 * reservation, 4 MB aligned), so that its last 2 MB can be a large page too. Linux splits the mapping
 * where the commit ends, and the 2 MB that straddles the split stays in 4 KB pages: 512 page faults
 * for a block that fills it (bench/shapes.py's malloc-large: 8,700 against mimalloc's 320). A created
 * heap's block (`exact`) commits what it needs: its limit counts the bytes. So does a block whose span
 * ends before that boundary (under RLIMIT_AS): no large page would form there. So does a `fresh` block
 * (a reservation malloc makes; not one that grows, nor a cached one taken again) that fills less than a
 * quarter of its last 2 MB: a large page there would make all of it resident at the first touch, for a
 * block of 2 MB (the 32-byte header puts its last bytes in the next 2 MB: a power-of-two array) 4 MB
 * resident, twice what every peer's takes (bench/results/2026-12-07-large-tails.md). Its last 2 MB
 * stays on small pages then (the port turns a pool's granule so: port.h, reserve_pooled): at most 128
 * faults of 4 KB there, about what one huge page's first fault costs, for 1.5 MB or more not made
 * resident. A block that later grows into it faults there page by page, as a cached block taken again
 * for more does: with the line at half, mixed (blocks of 1-4 MB grown in place) took 7,200 faults a run
 * instead of 510, 5 % of its time; at a quarter, 2,100. A block that grows (resized in place, or
 * moved) keeps the large page: it is likely to grow on into it. A block that shrinks, or a cached one
 * taken for less, gives its tail back from the same point, so that the large page it ends in stays
 * whole: decommitting inside one split it, and growing back into that 2 MB took a fault per 4 KB
 * (bench/results/2026-12-02-large-tail.md). */
static size_t commit_end(size_t need, size_t span, int exact, int fresh)
{
    if (!SHARD_LARGE_PAGES || exact || !os_has_large_pages())
        return need;
    size_t end = round_up(need, LARGE_PAGE);
    return end <= span && !(fresh && end - need > LARGE_PAGE - LARGE_PAGE / 4) ? end : need;
}

/* Earned tails. A fresh block's last 2 MB (all of a block of 1-2 MB) is a large page only while the
 * program's fresh blocks have lately been used to their ends: a large page is resident whole from its
 * first touch, and a program whose blocks of 1-2 MB are used at their first kilobytes (bench/shapes.c's
 * large-heads: an engine's arrays and buffers sized for the largest case) had 2 MB resident and cleared
 * for each, 128 MB at 8 threads against jemalloc's 6, in 1.3-1.8 times its time
 * (bench/results/2026-12-07-earned-tails.md). Until then such a block is committed to its need, its
 * last 2 MB on small pages, and marked a probe (LAYOUT_PROBE); its free counts the pages resident there
 * (port_caps.resident_pages: mincore, one system call), and half or more of them make the program's
 * tails dense (tails_dense), less makes them sparse again. While they are dense, fresh tails are large
 * pages but for every TAIL_PROBE_EVERYth, a probe again, so that a program that changes its ways is
 * seen to. A dense probe whose tail is half its block or more goes back to the OS, not to a spare or the
 * cache: its tail would stay on small pages for as long as its reservation lasts, and serve the next
 * requests so (bench/shapes.c's turnover, whose 1-2 MB blocks are written whole, kept its first blocks
 * through the whole run: 1.05-1.08 of the time, 1.01-1.03 with this). A block that a realloc moves into
 * the large range (large_alloc_grown) grows and is no probe: strings, whose buffers grow by realloc,
 * took 1.07 of the time when they were. Nor is a block once resized (what its tail holds then says
 * nothing of a fresh block's). Where the port cannot count, or with SHARDMM_EARNED_TAILS=0, tails are
 * large pages as commit_end says. */
#define TAIL_PROBE_EVERY 8u
static int tails_dense;     /* atomic, relaxed: the last probe found at least half of its tail resident */
static unsigned tails_seen; /* atomic, relaxed: fresh tails while dense, for the probes among them */

/* Whether a fresh block's last 2 MB, which commit_end would make a large page, may be one: 0 for a
 * probe. */
static int tail_earned(void)
{
    if (!options_values.earned_tails || !os_counts_resident())
        return 1;
    return load_relaxed(&tails_dense) && fetch_add_relaxed(&tails_seen, 1u) % TAIL_PROBE_EVERY != 0;
}

static int probe_of(const large_header *h) { return !is_far(h) && (h->layout & LAYOUT_PROBE) != 0; }

/* The last 2 MB of a block's committed memory, or less: what a probe left on small pages. */
static size_t tail_of(const large_header *h) { return h->committed - ((h->committed - 1) & ~(LARGE_PAGE - 1)); }

/* A probe's free: the pages resident in its tail decide whether the program's tails are dense, and the
 * block is a probe no more. 1 when dense. */
static int tail_read(large_header *h)
{
    size_t tail = tail_of(h);
    store_relaxed(&h->layout, h->layout & ~LAYOUT_PROBE);
    size_t resident = os_resident_pages((uint8_t *)h + h->committed - tail, tail);
    if (resident == SIZE_MAX)
        return 0;
    int dense = 2 * resident * PORT_PAGE >= tail;
    store_relaxed(&tails_dense, dense);
    return dense;
}

/* Atomic: large blocks have no owner to count them. */
static size_t live_blocks, live_bytes, live_committed; /* blocks; their usable sizes; their committed memory */
static size_t live_high; /* the most live_committed has been, since lower_high (below) */

/* The live blocks change by `blocks`, their usable bytes by `bytes` and their committed memory by
 * `committed` (each a two's complement difference: a free passes -1 and minus its block's figures). */
static void count_live(size_t blocks, size_t bytes, size_t committed)
{
    if (blocks != 0)
        fetch_add_relaxed(&live_blocks, blocks);
    if (bytes != 0)
        fetch_add_relaxed(&live_bytes, bytes);
    if (committed != 0) {
        size_t now = fetch_add_relaxed(&live_committed, committed) + committed;
        size_t high = load_relaxed(&live_high);
        while ((ptrdiff_t)committed > 0 && now > high && !cas_acq_rel(&live_high, &high, now))
            ;
    }
}

/* ---- reservations ---------------------------------------------------------------------------------- */

/* A new reservation for a block of `need` bytes, header included, with [commit_from, need) committed
 * and its map entry set to kind (with its headroom, or without when the address space cannot hold
 * that); *span_out receives the span. With commit_from 0 the header's fields but the mark are filled
 * (otherwise the header page is not committed: a move brings it). NULL out of memory. */
static void shed(size_t bytes, int block);

static large_header *reserve_block(size_t need, size_t offset, size_t commit_from, unsigned kind,
                                   enum headroom headroom, int exact, size_t *span_out)
{
    size_t span = span_for(need, headroom);
    shed(need, 1);
    large_header *h = os_reserve_block(span, SEGMENT_SIZE);
    if (h == NULL && span > span_for(need, HEADROOM_NONE)) {
        span = span_for(need, HEADROOM_NONE);
        h = os_reserve_block(span, SEGMENT_SIZE);
    }
    if (h == NULL)
        return NULL;
    if (SHARD_LARGE_PAGES)
        os_hint_large_pages(h, span);
    size_t end = commit_end(need, span, exact, headroom == HEADROOM_FRESH || headroom == HEADROOM_MOVED);
    size_t probe = headroom == HEADROOM_FRESH && end > need && !tail_earned() ? LAYOUT_PROBE : 0;
    if (probe != 0)
        end = need;
    if (end > commit_from && os_commit((uint8_t *)h + commit_from, end - commit_from) != 0) {
        os_release(h, span, 0);
        return NULL;
    }
    if (segmap_set((uintptr_t)h, SEGMENT_SIZE, kind, kind) != 0) {
        os_release(h, span, end - commit_from);
        return NULL;
    }
    if (commit_from == 0) {
        h->size = need - offset;
        h->committed = end;
        h->layout = layout_of(span, offset) | probe;
    }
    *span_out = span;
    return h;
}

/* large_visit reads the headers of the blocks the map marks while it holds walk_lock; a block's entry is
 * cleared under it (map_clear), so the walk never reads a header whose memory is going back. The lock is
 * taken only to clear an entry, never on a path that keeps a block. While a fork holds it no walk can be
 * going on, so the entry is cleared without it. */
static spinlock walk_lock;

static void map_clear(uintptr_t granule)
{
    int locked = spin_lock_unless_fork(&walk_lock);
    segmap_set(granule, SEGMENT_SIZE, SEG_NONE, SEG_NONE);
    if (locked)
        spin_unlock(&walk_lock);
}

static void release_block(large_header *h)
{
    size_t lead = lead_of(h), span = span_of(h), committed = h->committed;
    map_clear(granule_of(h));
    if (os_release((uint8_t *)h - lead, lead + span, committed) != 0)
        report_error("large block: the OS refused to release a reservation at", (uintptr_t)h - lead);
}

/* Moves old's committed pages to a fresh reservation for `need` bytes (header included; the rest up to
 * commit_end(need) committed there, *end) and returns its header, whose fields but the mark the caller
 * sets; old's map entry is cleared and its reservation gone. NULL, with old as it was, out of memory or
 * when the OS refused the move.
 *
 * Where the platform gives large pages, only whole ones move (LARGE_PAGE bytes from the header, which
 * starts the new reservation's 4 MB granule; a far block's old header lies a page below its granule, so
 * its pages were not in whole large pages before either) and the last partial one is copied: Linux maps the moved pages apart from the
 * new reservation's and never merges the two, so a 2 MB range that straddled them could never be a
 * large page again, however often the block is cached and reused (bench/app's buffers: 18,000 page
 * faults per run before, 8,900 after). */
static large_header *move_block(large_header *old, size_t need, enum headroom headroom, int exact, size_t *span,
                                 size_t *end)
{
    size_t moved = old->committed, whole = moved;
    if (SHARD_LARGE_PAGES && os_has_large_pages() && moved > LARGE_PAGE)
        whole = moved & ~(LARGE_PAGE - 1);
    /* The new entry is SEG_NONE until the pages are there (setting it now makes sure that its table
     * exists, so that the change to SEG_LARGE below cannot fail). */
    large_header *h = reserve_block(need, 0, whole, SEG_NONE, headroom, exact, span);
    if (h == NULL)
        return NULL;
    /* As reserve_block committed: to the large page's end, so that the first touch there finds the 2 MB
     * in one mapping (committing exactly `need` split it, and the block's growth into the rest of that
     * 2 MB took a fault per 4 KB: bench/shapes.py's strings). */
    *end = commit_end(need, *span, exact, 0);
    mem_copy((uint8_t *)h + whole, (uint8_t *)old + whole, moved - whole);
    /* The old entry goes first: once the pages have moved, the old addresses may be anyone's. */
    uintptr_t old_granule = granule_of(old);
    unsigned old_kind = kind_of(old);
    size_t old_lead = lead_of(old);
    map_clear(old_granule);
    if (os_move_release((uint8_t *)old - old_lead, old_lead + span_of(old), old, whole, h, moved - whole) != 0) {
        segmap_set(old_granule, SEGMENT_SIZE, old_kind, old_kind);
        os_release(h, *span, *end - whole);
        return NULL;
    }
    segmap_set((uintptr_t)h, SEGMENT_SIZE, SEG_LARGE, SEG_LARGE);
    return h;
}

/* ---- the cache ------------------------------------------------------------------------------------- */

typedef struct cached {
    large_header *h;
    size_t committed, span;
    uint64_t freed_at;
    uintptr_t freer; /* os_thread_tag() of the thread that freed it */
} cached;

static struct {
    spinlock lock;
    unsigned count;     /* entries, oldest first */
    size_t bytes;       /* their committed memory */
    uint64_t oldest_at; /* freed_at of the first entry, UINT64_MAX when empty: read without the lock */
    size_t bytes_seen;  /* bytes, for readers without the lock */
    cached entry[SHARD_LARGE_CACHE_BLOCKS];
} cache = {.oldest_at = UINT64_MAX};

/* Under the lock: remove n entries from index at on, keeping the order of the rest. */
static void remove_entries(unsigned at, unsigned n)
{
    for (unsigned i = at; i < at + n; i++)
        cache.bytes -= cache.entry[i].committed;
    for (unsigned i = at; i + n < cache.count; i++)
        cache.entry[i] = cache.entry[i + n];
    cache.count -= n;
}

/* Under the lock: move the first n entries to out (the caller releases them after unlocking). */
static unsigned take_oldest(unsigned n, large_header **out)
{
    for (unsigned i = 0; i < n; i++)
        out[i] = cache.entry[i].h;
    remove_entries(0, n);
    return n;
}

/* Whether a block freed at `then` has waited the delay. Signed: another thread may have read a later
 * time than `now` before it stamped its entry. */
static int expired(uint64_t then, uint64_t now) { return (int64_t)(now - then) >= options_values.large_cache_delay_ms; }

/* Under the lock: how many of the first entries have waited the delay. The clock is read under the
 * lock too, so that the entries stay in the order of their times. */
static unsigned expired_count(uint64_t now)
{
    unsigned n = 0;
    while (n < cache.count && expired(cache.entry[n].freed_at, now))
        n++;
    return n;
}

/* What live and cached blocks may hold together: an eighth above the live blocks' high. */
static size_t ceiling(void)
{
    size_t high = load_relaxed(&live_high);
    return high + high / 8;
}

/* What the cache may hold under the ceiling once `more` bytes of live blocks are added. The counts are
 * read without the lock: another thread's block may be between its count and the cache, which the next
 * put or reservation evens out. */
static size_t room_for_cache(size_t more)
{
    size_t top = ceiling(), live = load_relaxed(&live_committed);
    return top > live + more ? top - live - more : 0;
}

/* Whether the process's address space is unlimited (no RLIMIT_AS or RLIMIT_DATA), as last seen. The
 * port's look is two system calls, and a free past the cache's 128 MB made it every time (large-ends@8:
 * half of its time; bench/results/2026-12-06-large-sparse.md); now at most once in LIMIT_LOOK_MS, and
 * again at once after memory ran out or a collect (large_cache_release_all). A limit set meanwhile lets
 * the cache hold more than the option's bytes for that long; a reservation refused for it gives the
 * cache back and is tried again (heap_relieve). */
enum { LIMIT_LOOK_MS = 100 };
static uint64_t limit_seen_at = UINT64_MAX; /* os_clock_ms() of the last look; UINT64_MAX: look now */
static int limit_unset;                     /* what it saw */
static int address_space_unlimited(void)
{
    uint64_t now = os_clock_ms(), then = load_relaxed(&limit_seen_at);
    if (then == UINT64_MAX || now - then >= LIMIT_LOOK_MS) {
        store_relaxed(&limit_unset, os_address_space_limit() == SIZE_MAX);
        store_relaxed(&limit_seen_at, now);
    }
    return load_relaxed(&limit_unset);
}

/* The cache's byte limit now (the file comment): the option's, or the room under the ceiling, if that
 * is more. */
static size_t cache_limit(void)
{
    size_t limit = options_values.large_cache_bytes;
    if (limit == 0 || options_values.large_cache_fixed)
        return limit;
    size_t room = room_for_cache(0);
    if (room <= limit)
        return limit;
    /* Under an address-space limit the cached blocks' reservations count against it: the option's
     * bytes and no more. */
    return address_space_unlimited() ? room : limit;
}

/* Under the lock, after blocks left for age or all at once: the high becomes what live and cached
 * blocks hold now, so that a program past its peak does not keep the room for it, and the largest need
 * asked for is forgotten, so that its spans do not either. */
static void lower_high(void)
{
    store_relaxed(&live_high, load_relaxed(&live_committed) + cache.bytes);
    store_relaxed(&asked_high.need, 0);
}

/* Under the lock: the expired entries leave (into victims, for the caller to release after unlocking),
 * and the high comes down with them; how many. */
static unsigned take_expired(large_header **victims)
{
    unsigned n = take_oldest(expired_count(os_clock_ms()), victims);
    if (n != 0)
        lower_high();
    return n;
}

/* Under the lock: with the `n` oldest entries leaving already, how many of the oldest must leave so that
 * the rest are at most `blocks` entries holding at most `bytes`. */
static unsigned leaving_for(unsigned n, unsigned blocks, size_t bytes)
{
    size_t left = cache.bytes;
    for (unsigned i = 0; i < n; i++)
        left -= cache.entry[i].committed;
    while (n < cache.count && (cache.count - n > blocks || left > bytes))
        left -= cache.entry[n++].committed;
    return n;
}

static void publish_oldest(void)
{
    store_relaxed(&cache.oldest_at, cache.count ? cache.entry[0].freed_at : UINT64_MAX);
    store_relaxed(&cache.bytes_seen, cache.bytes);
}

static void release_all(large_header **victims, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        release_block(victims[i]);
}

static void spares_expire(void);
static void spares_release(void);

void large_cache_expire(void)
{
    heap *me = heap_mine();
    if (me != NULL && load_relaxed(&me->large_spare) != 0)
        spares_expire(); /* a thread whose large blocks come from its spare makes no other pass */
    uint64_t oldest = load_relaxed(&cache.oldest_at);
    if (oldest == UINT64_MAX || !expired(oldest, os_clock_ms()))
        return;
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    if (!spin_lock_unless_fork(&cache.lock))
        return; /* a fork holds the cache: the blocks wait for the next look */
    unsigned n = take_expired(victims);
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

/* Before a new reservation of `bytes`: the oldest blocks go until the cache holds `bytes` less (for a
 * segment or arena) or no more than the room under the ceiling once a large block of `bytes` is live
 * (`block`), but not less than the option's limit: one load while it holds no more than that. */
static void shed(size_t bytes, int block)
{
    size_t limit = options_values.large_cache_bytes;
    if (load_relaxed(&cache.bytes_seen) <= limit)
        return;
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    if (!spin_lock_unless_fork(&cache.lock))
        return;
    size_t keep = block ? room_for_cache(bytes) : cache.bytes > bytes ? cache.bytes - bytes : 0;
    if (keep < limit)
        keep = limit;
    unsigned n = take_oldest(leaving_for(0, SHARD_LARGE_CACHE_BLOCKS, keep), victims);
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

void large_cache_shed(size_t bytes) { shed(bytes, 0); }

void large_cache_release_all(void)
{
    spares_release();
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    if (!spin_lock_unless_fork(&cache.lock))
        return;
    unsigned n = take_oldest(cache.count, victims);
    store_relaxed(&limit_seen_at, UINT64_MAX); /* memory ran out, maybe for a new limit: look again */
    lower_high();
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

/* Take the cached block that fits `need` best (see the file comment); NULL when none fits. Expired
 * blocks go back to the OS on the way. */
static large_header *cache_take(size_t need, size_t *committed)
{
    spares_expire(); /* a clock read, and once per delay a look */
    if (load_relaxed(&cache.oldest_at) == UINT64_MAX)
        return NULL; /* an empty cache costs one load more */
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS], *h = NULL;
    if (!spin_lock_unless_fork(&cache.lock))
        return NULL; /* a fork holds the cache: a fresh block instead */
    unsigned n = take_expired(victims);
    unsigned best = cache.count;
    uintptr_t me = os_thread_tag();
    for (unsigned i = 0; i < cache.count; i++) {
        const cached *c = &cache.entry[i];
        if (c->span < need)
            continue;
        if (best == cache.count) {
            best = i;
            continue;
        }
        const cached *b = &cache.entry[best];
        int c_enough = c->committed >= need, b_enough = b->committed >= need;
        if (c_enough != b_enough) {
            if (c_enough)
                best = i;
            continue;
        }
        if (c->committed != b->committed) {
            if (c_enough ? c->committed < b->committed : c->committed > b->committed)
                best = i;
            continue;
        }
        if ((c->freer == me) >= (b->freer == me))
            best = i; /* of equals the caller's own, then the later (freed last): likelier in its caches */
    }
    if (best < cache.count) {
        h = cache.entry[best].h;
        *committed = cache.entry[best].committed;
        remove_entries(best, 1);
    }
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
    return h;
}

/* Block lo takes in hi, the part of its reservation just above it (out of the cache, or leaving it): the
 * gap between lo's committed part and its end is committed first (the committed part is always a
 * prefix; on Linux a change of protection, or nothing in a pool), then hi's map entry and mark go and lo
 * spans both. 0, or -1 with nothing changed when the gap could not be committed. */
static int take_above(large_header *lo, large_header *hi)
{
    size_t lo_span = span_of(lo), gap = lo_span - lo->committed;
    if (gap != 0 && os_commit((uint8_t *)lo + lo->committed, gap) != 0)
        return -1;
    map_clear((uintptr_t)hi);
    lo->committed = lo_span + hi->committed;
    /* hi's growth is the whole block's, and so is a piece cut from hi (lo's own piece is hi, gone). */
    size_t upper = flags_of(hi) & (LAYOUT_GROWN | LAYOUT_SPLIT);
    store_relaxed(&lo->layout, layout_of(lo_span + span_of(hi), offset_of(lo)) | (flags_of(lo) & ~LAYOUT_SPLIT) | upper);
    store_relaxed(&hi->mark, 0);
    return 0;
}

/* Under the lock: freed block h joins the cached blocks next to it that were cut from one reservation
 * (split_off): the lower one's header stays (take_above), and the cached one's entry leaves the cache.
 * Returns the joined block's header. */
static large_header *join(large_header *h)
{
    for (unsigned i = 0; i < cache.count;) {
        large_header *c = cache.entry[i].h, *lo, *hi;
        if ((uint8_t *)h + span_of(h) == (uint8_t *)c && piece_of(c))
            lo = h, hi = c;
        else if ((uint8_t *)c + span_of(c) == (uint8_t *)h && piece_of(h))
            lo = c, hi = h;
        else {
            i++;
            continue;
        }
        if (take_above(lo, hi) != 0) {
            i++;
            continue;
        }
        remove_entries(i, 1);
        h = lo;
        i = 0;
    }
    return h;
}

/* Put a freed block (mark FREED) into the cache, or give it back to the OS. */
static void cache_put(large_header *h)
{
    spares_expire();
    size_t committed = h->committed, limit = cache_limit();
    if (committed > limit) {
        release_block(h);
        return;
    }
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    if (!spin_lock_unless_fork(&cache.lock)) {
        release_block(h); /* a fork holds the cache: the block goes back to the OS */
        return;
    }
    if (os_can_release_part()) {
        h = join(h);
        committed = h->committed;
        if (committed > limit) {
            publish_oldest();
            spin_unlock(&cache.lock);
            release_block(h);
            return;
        }
    }
    uint64_t now = os_clock_ms();
    /* Room for one more entry and its bytes: the expired and then the oldest go. */
    unsigned n = take_oldest(leaving_for(expired_count(now), SHARD_LARGE_CACHE_BLOCKS - 1, limit - committed), victims);
    cache.entry[cache.count++] = (cached){h, committed, span_of(h), now, os_thread_tag()};
    cache.bytes += committed;
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

/* ---- the threads' spares --------------------------------------------------------------------------- */

/* A heap's spare word (heap.h): a near block's header starts a 4 MB granule, so the block's committed
 * pages fit in the bits below its address. */
static uintptr_t spare_word(large_header *h, size_t committed) { return (uintptr_t)h | committed / PORT_PAGE; }
static large_header *spare_block(uintptr_t w) { return (large_header *)(w & ~(uintptr_t)SEGMENT_MASK); }
static size_t spare_committed(uintptr_t w) { return (w & SEGMENT_MASK) * PORT_PAGE; }

/* A block taken out of a spare other than by its thread's allocation: its committed memory, counted
 * live while it waited there, leaves the count, and the block goes to the cache, or (release) to the OS. */
static void spare_leave(uintptr_t w, int release)
{
    count_live(0, 0, -spare_committed(w));
    if (release)
        release_block(spare_block(w));
    else
        cache_put(spare_block(w));
}

/* Freed block h (marked FREED, still counted live) becomes the spare of `me`, the calling thread's heap,
 * and the spare it had goes to the cache; -1 when h may not be one (the caller caches it). */
static int spare_put(heap *me, large_header *h)
{
    size_t committed = h->committed;
    if (!options_values.large_spares || options_values.large_cache_delay_ms == 0 ||
        (h->layout & (LAYOUT_PIECE | LAYOUT_SPLIT)) != 0 ||
        committed > SHARD_LARGE_SPARE_MAX || committed > options_values.large_cache_bytes ||
        committed / PORT_PAGE > SEGMENT_MASK)
        return -1; /* no spares, no wait for freed blocks, a part that may join, or no cache for it */
    store_relaxed(&me->spare_blocks, me->spare_blocks + 1);
    store_relaxed(&me->spare_bytes, me->spare_bytes + h->size);
    /* Other threads only take a spare (to 0): one found empty stays so for a plain store. */
    uintptr_t old = load_relaxed(&me->large_spare);
    if (old == 0)
        store_release(&me->large_spare, spare_word(h, committed));
    else if ((old = exchange_acq_rel(&me->large_spare, spare_word(h, committed))) != 0)
        spare_leave(old, 0);
    return 0;
}

/* Whether a thread empties its own spare word with plain stores (spare_own): the port fenced every
 * thread at start-up (large_start). Not under ThreadSanitizer, which cannot see that fence. */
static uint32_t spares_fenced;

void large_start(void)
{
    if (!SHARD_TSAN && os_fence_all_threads() == 0)
        store_release(&spares_fenced, 1u);
}

/* The spare word of `me`, the calling thread's heap, emptied for that thread: what it held, 0 when
 * another thread took it first. Only this thread puts a spare, so the word holds what the caller loaded
 * or 0. The exchange this was is a locked instruction, which waits for every store before it: in
 * bench/shapes.c's requests, the program's writes into the block just served (bench/results/
 * 2026-12-06-plain-spares.md). With spares_fenced, a handshake instead: this thread says it is busy,
 * then looks for a claim; another thread (spare_seize) claims, fences every thread, then looks whether
 * this one is busy. The fence orders this thread's store before its load, so at least one of the two
 * sees the other's word: this one then exchanges after all, that one leaves the spare for now; and
 * when this one sees no claim, the other has either not begun or finished its exchange, which is why
 * the word is loaded again in between. */
static uintptr_t spare_own(heap *me)
{
    if (load_relaxed(&spares_fenced)) {
        store_relaxed(&me->spare_busy, 1u);
        compiler_fence();
        uintptr_t w = 0;
        int claimed = load_relaxed(&me->spare_claims) != 0;
        if (!claimed) {
            w = load_relaxed(&me->large_spare);
            store_relaxed(&me->large_spare, (uintptr_t)0);
        }
        compiler_fence();
        store_release(&me->spare_busy, 0u);
        if (!claimed)
            return w;
    }
    return exchange_acq_rel(&me->large_spare, (uintptr_t)0);
}

/* h's spare word, emptied for a thread that may not be h's: what it held; 0 when none, when h's thread
 * is emptying it itself at this moment (spare_own: the spare stays, and leaves by the next look), or
 * when the fence that worked at start-up fails now (a filter installed since: the spare stays until its
 * thread frees, allocates or exits). */
static uintptr_t spare_seize(heap *h)
{
    if (load_relaxed(&h->large_spare) == 0)
        return 0;
    if (!load_relaxed(&spares_fenced) || h == heap_mine())
        return exchange_acq_rel(&h->large_spare, (uintptr_t)0);
    uintptr_t w = 0;
    fetch_add_relaxed(&h->spare_claims, 1u);
    if (os_fence_all_threads() == 0 && load_acquire(&h->spare_busy) == 0)
        w = exchange_acq_rel(&h->large_spare, (uintptr_t)0);
    fetch_sub_release(&h->spare_claims, 1u);
    return w;
}

/* The spare of `me`, the calling thread's heap, for `need` bytes (header included), if it holds them.
 * A thread's block takes it whatever it commits beyond the need: at most SHARD_LARGE_SPARE_MAX in all,
 * so less than 3 MB more than a need of over 1 MB (with large pages, at most one 2 MB page more than a
 * fresh block's commit_end), memory the process holds either way (why not only when the cache would
 * choose it: docs/design.md, Large blocks). A created heap's block (`exact`: its limit counts committed
 * bytes) takes it only when it commits just the need or no cached block is there. *committed: what it
 * holds. A spare that does not fit goes to the cache, which weighs it with the rest: NULL. */
static large_header *spare_take(heap *me, size_t need, int exact, size_t *committed)
{
    uintptr_t w = load_relaxed(&me->large_spare);
    if (w == 0)
        return NULL;
    size_t c = spare_committed(w);
    int fits = c >= need && (!exact || c == need || load_relaxed(&cache.oldest_at) == UINT64_MAX);
    if ((w = spare_own(me)) == 0)
        return NULL;
    if (!fits) {
        spare_leave(w, 0);
        return NULL;
    }
    *committed = c;
    return spare_block(w);
}

/* h's spare (another thread's, or a retiring heap's), if it has one, to the cache, or (release) to the
 * OS: the word spare_seize takes, whatever was loaded before. */
static void spare_drain(heap *h, int release)
{
    uintptr_t w = spare_seize(h);
    if (w != 0)
        spare_leave(w, release);
}

static uint64_t spares_due; /* os_clock_ms() from which the next look at the spares may come */

/* A spare that every heap held at the last look and holds still goes back to the OS: it has waited at
 * least the delay (and at most twice that). No clock is read where a spare is put; the looks come at
 * most once per delay, from the cache's passes and from the expiry checks of a thread with a spare
 * (large_cache_expire), and take in every heap's: a thread that no longer allocates looks at none. */
static void spares_expire(void)
{
    uint64_t now = os_clock_ms(), due = load_relaxed(&spares_due);
    if ((int64_t)(now - due) < 0 || !cas_acq_rel(&spares_due, &due, now + options_values.large_cache_delay_ms))
        return;
    for (heap *h = heap_all(); h != NULL; h = h->next_all) {
        uintptr_t w = load_relaxed(&h->large_spare), seen = load_relaxed(&h->spare_seen);
        store_relaxed(&h->spare_seen, w);
        /* The same block freed again since the last look goes too: a lost reuse, no more; and so does one
         * its thread put after the load (the exchange's, not w: its thread sent w to the cache). */
        if (w != 0 && w == seen)
            spare_drain(h, 1);
    }
}

/* Every heap's spare back to the OS (large_cache_release_all). */
static void spares_release(void)
{
    for (heap *h = heap_all(); h != NULL; h = h->next_all)
        spare_drain(h, 1);
}

void large_spare_drain(heap *h) { spare_drain(h, 0); }

void large_lock_for_fork(int take)
{
    if (take) {
        spin_lock_for_fork(&cache.lock);
        spin_lock_for_fork(&walk_lock);
    } else {
        spin_unlock_for_fork(&walk_lock);
        spin_unlock_for_fork(&cache.lock);
    }
}

void large_release_owned(heap *owner)
{
    if (load_relaxed(&owner->large_count) == 0)
        return; /* the common case: no scan of the map, no lock */
    enum { BATCH = 64 };
    large_header *batch[BATCH];
    unsigned n;
    do {
        /* Claimed (LIVE to FREED, as a free would) under the walk's lock, released after it: a release
         * takes that lock to clear the map entry. Each round scans again: the map changed. */
        n = 0;
        if (!spin_lock_unless_fork(&walk_lock))
            return; /* a fork: the blocks stay until the heap's next reset or destroy */
        for (size_t hi = 0; hi < ((size_t)1 << SEGMAP_TOP_BITS) && n < BATCH; hi++) {
            uintptr_t top = load_relaxed(&segmap_top[hi]);
            if (top == 0)
                continue;
            const uint8_t *leaf = (const uint8_t *)((uintptr_t)segmap_zero_leaf + top);
            for (size_t i = 0; i < SEGMAP_LEAF_BYTES && n < BATCH; i++) {
                unsigned kind = load_relaxed(&leaf[i]);
                if (kind != SEG_LARGE && kind != SEG_LARGE_FAR)
                    continue;
                uintptr_t granule = (uintptr_t)hi << 32 | (uintptr_t)i << SEGMENT_SHIFT;
                large_header *h = (large_header *)(kind == SEG_LARGE ? granule : granule - PORT_PAGE);
                uint64_t live = mark_live(h);
                if (load_acquire(&h->mark) == mark_live(h) && owner_of(h) == owner &&
                    cas_acq_rel(&h->mark, &live, mark_freed(h)))
                    batch[n++] = h;
            }
        }
        spin_unlock(&walk_lock);
        for (unsigned k = 0; k < n; k++) {
            count_live((size_t)-1, -batch[k]->size, -batch[k]->committed);
            fetch_add_relaxed(&owner->large_count, (size_t)-1);
            fetch_add_relaxed(&owner->large_bytes, -batch[k]->size);
            heap_uncharge(owner, batch[k]->committed);
            if (is_far(batch[k]))
                release_block(batch[k]);
            else
                cache_put(batch[k]); /* as a free: the next engine's large blocks may come from it */
        }
    } while (n == BATCH);
}

void large_visit(visitor *v, heap *only)
{
    if (!spin_lock_unless_fork(&walk_lock))
        return; /* a fork is going on: no walk now */
    for (size_t hi = 0; hi < ((size_t)1 << SEGMAP_TOP_BITS) && !v->stop; hi++) {
        uintptr_t top = load_relaxed(&segmap_top[hi]);
        if (top == 0)
            continue;
        const uint8_t *leaf = (const uint8_t *)((uintptr_t)segmap_zero_leaf + top);
        for (size_t i = 0; i < SEGMAP_LEAF_BYTES && !v->stop; i++) {
            unsigned kind = load_relaxed(&leaf[i]);
            if (kind != SEG_LARGE && kind != SEG_LARGE_FAR)
                continue;
            uintptr_t granule = (uintptr_t)hi << 32 | (uintptr_t)i << SEGMENT_SHIFT;
            /* live_header's test, from the granule: a block starts at its header's offset, or a far one
             * at the granule itself. A block being made or moved is LIVE only once it is whole. */
            large_header *h = (large_header *)(kind == SEG_LARGE ? granule : granule - PORT_PAGE);
            if (load_acquire(&h->mark) != mark_live(h))
                continue;
            size_t offset = offset_of(h); /* read once, for the owner and the start */
            if (only == NULL || owner_at(h, offset) == only)
                visit_block(v, (uint8_t *)h + offset, load_relaxed(&h->size), VISIT_LARGE);
        }
    }
    spin_unlock(&walk_lock);
}

void large_cache_counts(size_t *blocks, size_t *bytes)
{
    if (!spin_lock_unless_fork(&cache.lock)) {
        *blocks = *bytes = 0; /* not known while a fork holds the cache */
        return;
    }
    *blocks = cache.count;
    *bytes = cache.bytes;
    spin_unlock(&cache.lock);
    for (heap *h = heap_all(); h != NULL; h = h->next_all) {
        uintptr_t w = load_relaxed(&h->large_spare);
        *blocks += w != 0;
        *bytes += spare_committed(w);
    }
}

/* ---- blocks ---------------------------------------------------------------------------------------- */

/* Whether a block that commits `committed` bytes, at least `need`, holds so much beyond the need that
 * fit_commit gives the rest back: more than 4 x need and more than 16 MB. */
static int commits_too_much(size_t committed, size_t need)
{
    return committed - need > 4 * need && committed - need > SHARD_LARGE_EXCESS_MIN;
}

/* Whether split_off may cut a block that commits `committed` bytes: only one that keeps a granule beyond
 * the granules its need rounds up to, so at least two. */
static int may_split(size_t committed) { return committed >= 2 * SEGMENT_SIZE; }

/* Commit or decommit so that h, committed `committed` bytes, holds `need` the way the cache rule says:
 * at least need (up to commit_end), and beyond it no more than 4 x need or 16 MB, whichever is more
 * (the seed's "up to 16 MB, or four times the request"). 0, or -1 out of memory. */
static int fit_commit(large_header *h, size_t committed, size_t need, int exact)
{
    uint8_t *base = (uint8_t *)h;
    size_t end = commit_end(need, span_of(h), exact, 0);
    if (committed < need) {
        if (os_commit(base + committed, end - committed) != 0)
            return -1;
        committed = end;
    } else if (commits_too_much(committed, need)) {
        if (os_decommit(base + end, committed - end) == 0)
            committed = end;
    }
    h->committed = committed;
    return 0;
}

/* A cached block taken for `need` bytes (not in the cache any more) that holds committed at least twice
 * the granules its need takes, and a granule more, keeps those granules only, committed whole (exact: a
 * created heap's block, whose limit counts bytes, to commit_end as in fit_commit); the rest of its span
 * becomes a block of its own in the cache, with the committed memory it holds (the file comment). Its
 * header is written and marked FREED before the map marks its granule, as a fresh block's is; when the
 * map's table cannot be made the block stays whole. */
static void split_off(large_header *h, size_t need, size_t *committed, int exact)
{
    if (!may_split(*committed) || !os_can_release_part() || (h->layout & LAYOUT_GROWN) != 0)
        return;
    size_t keep = round_up(need, SEGMENT_SIZE), span = span_of(h);
    if (*committed < keep + SEGMENT_SIZE || *committed < 2 * keep || keep >= span)
        return;
    large_header *r = (large_header *)((uint8_t *)h + keep);
    if (segmap_set((uintptr_t)r, SEGMENT_SIZE, SEG_NONE, SEG_NONE) != 0)
        return; /* the map's table could not be made: the block stays whole */
    r->size = SEGMENT_SIZE - LARGE_HEADER;
    r->committed = *committed - keep;
    r->layout = layout_of(span - keep, LARGE_HEADER) | LAYOUT_PIECE;
    store_relaxed(&r->mark, mark_freed(r));
    segmap_set((uintptr_t)r, SEGMENT_SIZE, SEG_LARGE, SEG_LARGE);
    store_relaxed(&h->layout, layout_of(keep, offset_of(h)) | flags_of(h) | LAYOUT_SPLIT);
    h->committed = keep;
    *committed = keep;
    if (exact) { /* a created heap's limit counts bytes: the part above commit_end goes back */
        size_t end = commit_end(need, keep, 1, 0);
        if (end < keep && os_decommit((uint8_t *)h + end, keep - end) == 0)
            *committed = h->committed = end;
    }
    cache_put(r);
}

void *large_alloc(size_t size, int zero) { return large_alloc_aligned(size, LARGE_HEADER, zero); }

/* The end of every allocation: the block's heap (if it has room for the field), the counts, LIVE. A
 * block from the spare of heap `spare` was counted live there with `counted` bytes committed: that
 * heap's own counts take it back, and what it commits now differs by a split or a commit at most. */
static void *go_live(large_header *h, heap *owner, heap *spare, size_t counted)
{
    if (offset_of(h) >= LARGE_HEAP_OFFSET)
        store_relaxed(&((large_ext *)(h + 1))->owner, owner); /* a walk may read it (owner_of) */
    if (owner != NULL) {
        fetch_add_relaxed(&owner->large_count, 1);
        fetch_add_relaxed(&owner->large_bytes, h->size);
    }
    if (spare != NULL) {
        store_relaxed(&spare->spare_blocks, spare->spare_blocks - 1);
        store_relaxed(&spare->spare_bytes, spare->spare_bytes - h->size);
        if (h->committed != counted)
            count_live(0, 0, h->committed - counted);
    } else {
        count_live(1, h->size, h->committed);
    }
    store_release(&h->mark, mark_live(h));
    return block_of(h);
}

/* A block aligned to 4 MB or more (see the file comment); fresh memory, so zero. */
static void *far_alloc(size_t size, size_t align, heap *owner)
{
    if (size > LARGE_SIZE_MAX || align > LARGE_SIZE_MAX)
        return NULL;
    if (size < 16)
        size = 16; /* a block of its own past the header, as shard_malloc(0) gives */
    size_t body = round_up(size, PORT_RESERVE_ALIGN), lead = align - PORT_PAGE, need = PORT_PAGE + round_up(size, PORT_PAGE);
    if (owner != NULL && heap_charge(owner, need) != 0)
        return NULL;
    shed(need, 1);
    uint8_t *r = os_reserve_block(align + body, align);
    if (r == NULL) {
        if (owner != NULL)
            heap_uncharge(owner, need);
        return NULL;
    }
    large_header *h = (large_header *)(r + lead);
    if (SHARD_LARGE_PAGES)
        os_hint_large_pages(r + align, body);
    int committed = os_commit(h, need) == 0;
    if (!committed || segmap_set((uintptr_t)(r + align), SEGMENT_SIZE, SEG_LARGE_FAR, SEG_LARGE_FAR) != 0) {
        os_release(r, align + body, committed ? need : 0);
        if (owner != NULL)
            heap_uncharge(owner, need);
        return NULL;
    }
    h->size = need - PORT_PAGE;
    h->committed = need;
    h->layout = layout_of(PORT_PAGE + body, PORT_PAGE) | LAYOUT_FAR | (size_t)__builtin_ctzll(align) << LAYOUT_ALIGN_SHIFT;
    return go_live(h, owner, NULL, 0);
}

/* A block taken from a spare or the cache that cannot serve after all goes to the cache; one from a
 * spare (counted: its committed bytes then) leaves the live count first. */
static void untake(large_header *h, size_t counted)
{
    if (counted != 0)
        count_live(0, 0, -counted);
    cache_put(h);
}

/* A block taken again (from the cache or a spare), `committed` bytes of it committed, for `need` bytes
 * with its block at `offset`: its size and layout, and with `zero` the block zeroed where it may be
 * dirty (memory committed in place reads zero; what was committed when cached is not). */
static inline void reuse_as(large_header *h, size_t need, size_t offset, size_t committed, int zero)
{
    store_relaxed(&h->size, need - offset); /* a walk may still read the block's last life */
    store_relaxed(&h->layout, layout_of(span_of(h), offset) | flags_of(h));
    if (zero && committed > offset)
        mem_zero(block_of(h), (committed < need ? committed : need) - offset);
}

/* A block whose header is at its reservation's start: the calling thread's spare or the cache, else a
 * fresh reservation. */
static void *near_alloc(size_t size, size_t offset, int zero, enum headroom headroom, heap *owner)
{
    if (owner != NULL && offset < LARGE_HEAP_OFFSET)
        offset = LARGE_HEAP_OFFSET;
    size_t need = need_of(size, offset), committed = 0;
    note_asked(need);
    if (owner != NULL && heap_charge(owner, need) != 0)
        return NULL;
    heap *me = heap_mine(), *spare = NULL;
    large_header *h = me != NULL ? spare_take(me, need, owner != NULL, &committed) : NULL;
    size_t counted = 0;
    if (h != NULL)
        spare = me, counted = committed;
    else
        h = cache_take(need, &committed);
    if (h != NULL) {
        split_off(h, need, &committed, owner != NULL);
        if (fit_commit(h, committed, need, owner != NULL) != 0) {
            untake(h, counted); /* out of memory: the block waits for a smaller request */
            if (owner != NULL)
                heap_uncharge(owner, need);
            return NULL;
        }
        /* A created heap's limit counts what the block keeps committed beyond its need (growth into it
         * is free); when the limit has no room for that, the block gives it back. */
        if (owner != NULL && h->committed > need && heap_charge(owner, h->committed - need) != 0) {
            store_relaxed(&owner->limit_hit, 0u); /* not this allocation's failure */
            if (os_decommit((uint8_t *)h + need, h->committed - need) == 0) {
                h->committed = need;
            } else {
                untake(h, counted);
                heap_uncharge(owner, need);
                return NULL;
            }
        }
        reuse_as(h, need, offset, committed, zero);
    } else {
        size_t span;
        h = reserve_block(need, offset, 0, SEG_LARGE, headroom, owner != NULL, &span);
        if (h == NULL) {
            if (owner != NULL)
                heap_uncharge(owner, need);
            return NULL;
        }
    }
    return go_live(h, owner, spare, counted);
}

/* A thread's allocation that its spare serves as it stands, which is most of them where a thread frees
 * and allocates large blocks in turn: near_alloc's result in fewer steps (86 instructions of some 360
 * a pair of calls, bench/results/2026-12-06-plain-spares.md). The spare is one near_alloc would take
 * (spare_take: a thread's block takes any spare that holds the need), and the steps skipped would do
 * nothing for it: it commits the need already and not too much more (commits_too_much: fit_commit
 * would give that back), and too little to be cut (may_split). NULL: near_alloc decides. */
static void *spare_alloc(size_t size, int zero)
{
    heap *me = heap_mine();
    if (me == NULL || size > LARGE_SIZE_MAX)
        return NULL;
    uintptr_t w = load_relaxed(&me->large_spare);
    if (w == 0)
        return NULL;
    size_t offset = coloured(me, LARGE_HEADER), need = need_of(size, offset), c = spare_committed(w);
    if (c < need || commits_too_much(c, need) || may_split(c))
        return NULL;
    note_asked(need);
    if (spare_own(me) == 0)
        return NULL; /* another thread took it meanwhile */
    large_header *h = spare_block(w);
    reuse_as(h, need, offset, c, zero);
    return go_live(h, NULL, me, c);
}

void *large_alloc_aligned(size_t size, size_t align, int zero)
{
    void *p = align <= LARGE_HEADER ? spare_alloc(size, zero) : NULL;
    return p != NULL ? p : large_alloc_in(NULL, size, align, zero);
}

void *large_alloc_grown(size_t size)
{
    void *p = spare_alloc(size, 0);
    if (p != NULL || size > LARGE_SIZE_MAX)
        return p;
    return near_alloc(size, coloured(heap_mine(), LARGE_HEADER), 0, HEADROOM_MOVED, NULL);
}

void *large_alloc_in(heap *owner, size_t size, size_t align, int zero)
{
    if (size > LARGE_SIZE_MAX)
        return NULL;
    if (align > LARGE_ALIGN_NEAR)
        return far_alloc(size, align, owner);
    heap *me = heap_mine();
    size_t offset = align > LARGE_HEADER ? coloured_aligned(me, align)
                                         : coloured(me, owner != NULL ? LARGE_HEAP_OFFSET : LARGE_HEADER);
    return near_alloc(size, offset, zero, HEADROOM_FRESH, owner);
}

static large_header *live_header(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if ((a & 15) != 0)
        return NULL;
    unsigned kind = segmap_kind(a);
    large_header *h;
    if (kind == SEG_LARGE) /* the header starts the granule: committed, the map says a block starts here */
        h = (large_header *)(a & ~(uintptr_t)SEGMENT_MASK);
    else if (kind == SEG_LARGE_FAR && (a & SEGMENT_MASK) == 0) /* a far block: its header page is just below */
        h = (large_header *)(a - PORT_PAGE);
    else
        return NULL;
    if (load_acquire(&h->mark) != mark_live(h) || (uintptr_t)block_of(h) != a)
        return NULL;
    return h;
}

int large_owner_is(const void *p, heap *owner)
{
    large_header *h = live_header(p);
    return h != NULL && owner_of(h) == owner;
}

/* LIVE (live_header read it) to FREED, for a free of h: 0; -1 when another free or a reset of its
 * heap changed it first (the file comment: where a plain store does). */
static int large_claim_for_free(large_header *h, heap *owner)
{
    uint64_t live = mark_live(h);
    if (SHARD_HARDENED || owner != NULL)
        return cas_acq_rel(&h->mark, &live, mark_freed(h)) ? 0 : -1;
    store_release(&h->mark, mark_freed(h));
    return 0;
}

int large_free(void *p)
{
    large_header *h = live_header(p);
    if (h == NULL)
        return -1;
    heap *owner = owner_of(h);
    if (large_claim_for_free(h, owner) != 0)
        return -1;
    if (owner != NULL) {
        fetch_add_relaxed(&owner->large_count, (size_t)-1);
        fetch_add_relaxed(&owner->large_bytes, -h->size);
        heap_uncharge(owner, h->committed);
    }
    /* Never cached: a far block (see the file comment), a dense probe that is mostly tail (earned tails). */
    int away = is_far(h) || (probe_of(h) && tail_read(h) && 2 * tail_of(h) >= h->committed);
    heap *me = away ? NULL : heap_mine();
    if (me != NULL && spare_put(me, h) == 0)
        return 0; /* still counted live: the spare's */
    count_live((size_t)-1, -h->size, -h->committed);
    if (away)
        release_block(h);
    else
        cache_put(h);
    return 0;
}

size_t large_usable(const void *p)
{
    large_header *h = live_header(p);
    return h ? h->size : 0;
}

/* A live block that must grow past its span takes the cached part of its own reservation just above it
 * (the rest split_off cached), when the two reach `need` together: in place (take_above), the growth the
 * block had before it was split, with the part's committed memory. 1 when it did. Only a thread's block
 * (a created heap's moves, as before: its limit would count the part's memory). */
static int absorb_above(large_header *h, size_t need)
{
    if (!os_can_release_part() || load_relaxed(&cache.oldest_at) == UINT64_MAX)
        return 0; /* an empty cache costs one load */
    size_t span = span_of(h);
    large_header *part = NULL;
    if (!spin_lock_unless_fork(&cache.lock))
        return 0;
    for (unsigned i = 0; i < cache.count; i++) {
        const cached *c = &cache.entry[i];
        if ((uint8_t *)c->h == (uint8_t *)h + span && piece_of(c->h) && span + c->span >= need) {
            part = c->h;
            remove_entries(i, 1);
            break;
        }
    }
    publish_oldest();
    spin_unlock(&cache.lock);
    if (part == NULL)
        return 0;
    if (take_above(h, part) != 0) {
        cache_put(part); /* back where it was */
        return 0;
    }
    return 1;
}

void *large_resize_in_place(void *p, size_t size)
{
    large_header *h = live_header(p);
    if (h == NULL || size <= SHARD_MEDIUM_MAX || size > LARGE_SIZE_MAX)
        return NULL;
    large_cache_expire(); /* a cache access, as the seed counts them: the age is checked */
    if (probe_of(h))
        store_relaxed(&h->layout, h->layout & ~LAYOUT_PROBE); /* earned tails: no probe now */
    size_t offset = offset_of(h), need = need_of(size, offset), committed = h->committed, was = h->size;
    heap *owner = owner_of(h);
    int absorbed = need > span_of(h) && owner == NULL && absorb_above(h, need);
    size_t end = commit_end(need, span_of(h), owner != NULL, 0), now = h->committed;
    if (need <= now) {
        /* Shrunk to less than half: the tail goes back at once (not a part just absorbed to grow). */
        if (!absorbed && need < now / 2 && os_decommit((uint8_t *)h + end, now - end) == 0) {
            h->committed = end;
            if (owner != NULL)
                heap_uncharge(owner, now - end);
        }
    } else if (need <= span_of(h)) {
        if (owner != NULL && heap_charge(owner, end - now) != 0)
            return NULL;
        if (os_commit((uint8_t *)h + now, end - now) != 0) {
            if (owner != NULL)
                heap_uncharge(owner, end - now);
            count_live(0, 0, h->committed - committed); /* what an absorbed part brought */
            return NULL;
        }
        h->committed = end;
    } else {
        return NULL;
    }
    if (owner != NULL)
        fetch_add_relaxed(&owner->large_bytes, (need - offset) - was);
    if (need - offset > was && !is_far(h))
        store_relaxed(&h->layout, h->layout | LAYOUT_GROWN);
    store_relaxed(&h->size, need - offset); /* a walk may read it meanwhile (large_visit) */
    count_live(0, need - offset - was, h->committed - committed);
    return p;
}

void *large_move(void *p, size_t size)
{
    large_header *old = live_header(p);
    if (old == NULL || size > LARGE_SIZE_MAX)
        return NULL; /* not a block: the caller reports it */
    size_t offset = offset_of(old), need = need_of(size, offset), span;
    if (need <= old->committed)
        return NULL; /* only growth moves pages over */
    if (!os_can_move()) {
        /* A platform that cannot move pages: a copy, to a block with a grown one's headroom. */
        void *q = near_alloc(size, offset, 0, HEADROOM_GROWN, owner_of(old));
        if (q != NULL) {
            mem_copy(q, p, old->size);
            large_free(p);
        }
        return q;
    }
    heap *owner = owner_of(old);
    size_t old_committed = old->committed, old_size = old->size;
    if (owner != NULL && heap_charge(owner, need - old_committed) != 0)
        return NULL;
    size_t was = old_size, was_committed = old_committed; /* the header moves with the pages */
    size_t end;
    large_header *h = move_block(old, need, HEADROOM_GROWN, owner != NULL, &span, &end);
    if (h == NULL) {
        if (owner != NULL)
            heap_uncharge(owner, need - old_committed);
        return NULL; /* nothing moved: the caller copies */
    }
    if (owner != NULL)
        fetch_add_relaxed(&owner->large_bytes, (need - offset) - old_size);
    /* The header came along with the pages, mark LIVE, and the heap's field; only where the block lives
     * now changes (a far block becomes an ordinary one whose block starts a page in). */
    store_relaxed(&h->size, need - offset); /* as in large_resize_in_place */
    h->committed = end;
    store_relaxed(&h->layout, layout_of(span, offset) | LAYOUT_GROWN);
    if (SHARD_HARDENED)
        store_release(&h->mark, mark_live(h)); /* sealed with its new address */
    count_live(0, need - offset - was, h->committed - was_committed);
    return block_of(h);
}

void large_live_counts(size_t *blocks, size_t *bytes, size_t *committed)
{
    size_t n = load_relaxed(&live_blocks), b = load_relaxed(&live_bytes), c = load_relaxed(&live_committed);
    for (heap *h = heap_all(); h != NULL; h = h->next_all) { /* the spares' part (the file comment) */
        n -= load_relaxed(&h->spare_blocks);
        b -= load_relaxed(&h->spare_bytes);
        c -= spare_committed(load_relaxed(&h->large_spare));
    }
    *blocks = n;
    *bytes = b;
    *committed = c;
}

int large_check(void)
{
    int problems = 0;
    if (!spin_lock_unless_fork(&cache.lock))
        return 0; /* a fork holds the cache: nothing to check now */
    size_t bytes = 0;
    for (unsigned i = 0; i < cache.count; i++) {
        const cached *c = &cache.entry[i];
        bytes += c->committed;
        problems += insist(c->h->mark == mark_freed(c->h) && c->h->committed == c->committed && span_of(c->h) == c->span &&
                               segmap_kind((uintptr_t)c->h) == SEG_LARGE,
                           "large: a cache entry does not match its block (mark, committed, span, map):", c->h);
        for (size_t at = SEGMENT_SIZE; at < c->span; at += SEGMENT_SIZE) /* no other block inside (join) */
            problems += insist(segmap_kind((uintptr_t)c->h + at) == SEG_NONE,
                               "large: a cached block's reservation has a block's map entry inside, at",
                               (uintptr_t)c->h + at);
        problems += insist(i == 0 || c->freed_at >= cache.entry[i - 1].freed_at,
                           "large: the cache is not in the order of its blocks' free times at", c->h);
    }
    problems += insist(bytes == cache.bytes && cache.count <= SHARD_LARGE_CACHE_BLOCKS &&
                           (bytes <= options_values.large_cache_bytes || bytes <= ceiling()),
                       "large: the cache's counts differ from its entries or its limits, bytes", bytes);
    problems += insist(cache.oldest_at == (cache.count ? cache.entry[0].freed_at : UINT64_MAX),
                       "large: the cache's published oldest time differs from its first entry's:", cache.oldest_at);
    spin_unlock(&cache.lock);
    /* The caller's own spare, taken for the look and put back after it: another thread's trim or collect
     * takes a spare its thread has not taken (spare_seize) and may give the memory back, and another
     * reservation write a header there, while the look reads this one. */
    heap *me = heap_mine();
    uintptr_t w = me != NULL && load_relaxed(&me->large_spare) != 0 ? spare_own(me) : 0;
    if (w != 0) {
        large_header *h = spare_block(w);
        problems += insist(h->mark == mark_freed(h) && h->committed == spare_committed(w) && !is_far(h) &&
                               segmap_kind((uintptr_t)h) == SEG_LARGE,
                           "large: the thread's spare does not match its block (mark, committed, map):", h);
        store_release(&me->large_spare, w); /* 0 since spare_own: only this thread puts a spare */
    }
    return problems;
}
