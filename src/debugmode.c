/* debugmode.c - the full-debug layer (SHARD_FULL_DEBUG=1, build/debug/full/): FastMM FullDebugMode's
 * purpose, finding the program's bug. It owns the public allocation entry points of include/shardmm.h
 * and calls the core under its core_ names (debugmode.h); the ABI is the release library's, so a program
 * swaps the library (or the preloaded drop-in) to find a crash. Every other build compiles this file to
 * nothing.
 *
 * Each block the program gets is a core block laid out so:
 *
 *   base (the core's block)                        p (the program's)
 *   | padding: pad - 64 bytes, aligned blocks only | header, 64 bytes | size bytes | trailer, 16 bytes |
 *     base[0] = pad (the header's first word
 *     when there is no padding)
 *
 *   header: pad | next (in the quarantine) | size (as asked) | allocation site | free site |
 *           state (live, freed) and created (a created heap's block) | seal | canary
 *
 * pad is 64, or the alignment asked for above 64, so p keeps it. The canary (a constant mixed with the
 * header's address) touches the program's first byte: a write before the block changes it (reported as
 * an overflow). The seal is a hash of the size, the allocation site, `created`, pad, the quarantine's
 * link and the address (resealed when the link changes, under the quarantine's lock): a header changed
 * anywhere else is a damaged header, and the quarantine neither follows the link nor counts the size of
 * a header whose seal fails (an overflow out of the block before it, say). The trailer is 16 bytes of TRAILER_BYTE right after the
 * size asked for: a write past the end changes it. Sites are return addresses, taken in the public entry
 * points (__builtin_return_address(0)), so they name the program's call.
 *
 * A new block is filled with ALLOC_BYTE (not calloc's), a freed one with FREE_BYTE, and freed blocks
 * wait in a FIFO quarantine bounded in bytes (SHARDMM_QUARANTINE_MB, 16 MB by default) before the core
 * gets them: a block leaving it must still hold the pattern, its trailer and header (else it is reported
 * as a write after free and kept out of use). A free or realloc of a block whose state is `freed` is a
 * double free; the state changes with a compare-and-swap, so two threads freeing one block find it too.
 * shard_check checks the quarantine and every live block it can visit. Blocks of created heaps
 * (shard_heap_*) are checked and filled on free but not quarantined: their heap may be reset or destroyed
 * at any moment, taking them with it.
 *
 * What does not look like a block of ours (p + 8, p - 16, garbage) reaches the error hook as in every
 * build and changes nothing: a pointer is looked up in the core (api_usable, which reads nothing through
 * it) before anything is read through it. Each finding is written on the port's error channel first
 * (kind, block, size, allocation and free sites, symbolized where the port can: port_caps.symbolize),
 * then given to the error hook; a damaged block is left alone, never handed out again.
 *
 * shard_usable_size gives the size asked for; shard_visit (and the leak report) gives the program's
 * blocks with that size, quarantined blocks left out; realloc always moves the block (a stale pointer to
 * the old one then reads the free pattern). shard_get_stats counts the core's blocks less the quarantined
 * ones (debugmode_stats): those the program freed are not live (their memory stays in `committed` and
 * `live_large_committed`); blocks kept out of use after a report are.
 *
 * Depends on: debugmode.h (the core's names), error.h, fast.h (api_usable), options.h, segment.h (errno),
 * sync.h, libc.h, port.h (symbolize), include/shardmm.h.
 */
#include "debugmode.h"

#if SHARD_FULL_DEBUG
#include "../port/port.h"
#include "error.h"
#include "fast.h"
#include "libc.h"
#include "options.h"
#include "segment.h"
#include "sync.h"

#define HEADER ((size_t)64)
#define TRAILER ((size_t)16)
#define ALLOC_BYTE 0xA5
#define FREE_BYTE 0xDD
#define TRAILER_BYTE 0xFD
#define CANARY 0x5ca1ab1e0ddba11ull
#define STATE_LIVE 0x4c495645u  /* "LIVE" */
#define STATE_FREED 0x46524545u /* "FREE" */

typedef struct dbg_header {
    uint64_t pad;            /* p - base */
    struct dbg_header *next; /* the next younger block in the quarantine */
    size_t size;             /* as the program asked */
    void *alloc_site, *free_site;
    uint32_t state;          /* STATE_LIVE or STATE_FREED */
    uint32_t created;        /* 1: a created heap's block */
    uint64_t seal;           /* seal_of(header) */
    uint64_t canary;         /* CANARY ^ the header's address */
} dbg_header;
_Static_assert(sizeof(dbg_header) == HEADER, "the header is 64 bytes, so that p stays 16-byte aligned");

static inline dbg_header *header_of(const void *p) { return (dbg_header *)((uintptr_t)p - HEADER); }
static inline unsigned char *user_of(dbg_header *h) { return (unsigned char *)h + HEADER; }
static inline void *base_of(dbg_header *h) { return (char *)user_of(h) - h->pad; }
static inline size_t cost_of(const dbg_header *h) { return h->pad + h->size + TRAILER; }

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

static uint64_t seal_of(const dbg_header *h)
{
    uint64_t x = mix(mix(mix((uint64_t)h->size ^ (uint64_t)(uintptr_t)h) ^ (uint64_t)(uintptr_t)h->alloc_site) ^ h->created);
    return mix(mix(x ^ h->pad) ^ (uint64_t)(uintptr_t)h->next);
}

/* Whether h's seal holds: its size, pad and quarantine link are the ones it was given. */
static inline int sealed(const dbg_header *h) { return h->seal == seal_of(h); }

/* h's quarantine link changed to next (under the quarantine's lock); a header whose seal had already
 * failed keeps failing. */
static void set_next(dbg_header *h, dbg_header *next)
{
    int whole = sealed(h);
    h->next = next;
    if (whole)
        h->seal = seal_of(h);
}

static inline uint64_t canary_of(const dbg_header *h) { return CANARY ^ (uint64_t)(uintptr_t)h; }

/* ---- findings and their reports ---------------------------------------------------------------------- */

/* What a check found, copied out of the block so that it can be reported after the lock is given back
 * (a block may leave the quarantine meanwhile). */
typedef struct finding {
    int error;                /* enum shard_error */
    void *ptr;                /* the program's pointer */
    size_t size;              /* 0 when the header cannot be trusted */
    void *alloc_site, *free_site, *now_site;
    size_t offset;            /* the first changed byte (from p), SIZE_MAX: none to show */
    unsigned value;           /* what it holds */
} finding;

void debugmode_out_site(text_out *o, void *site)
{
    char text[200];
    out_hex(o, (uintptr_t)site, 0);
    if (site != NULL && port_caps.symbolize != NULL && port_caps.symbolize(site, text, sizeof text) > 0) {
        out_str(o, " ");
        out_str(o, text);
    }
}

static const char *what(int error)
{
    switch (error) {
    case SHARD_ERROR_DOUBLE_FREE: return "double free of the block at";
    case SHARD_ERROR_OVERFLOW: return "write outside the block at";
    case SHARD_ERROR_WRITE_AFTER_FREE: return "write after free to the block at";
    case SHARD_ERROR_HEADER: return "damaged header of the block at";
    case SHARD_ERROR_INVALID_REALLOC: return "not a block of ours, given to realloc:";
    case SHARD_ERROR_INVALID_SIZE_QUERY: return "not a block of ours, given to usable_size:";
    default: return "not a block of ours, given to free:";
    }
}

/* The report, a line at a time on the port's error channel:
 *   shardmm debug: write after free to the block at 0x... (40 bytes): byte 8 is 0x41
 *     allocated at 0x... /path/program(function+0x1c)
 *     freed at 0x... ...
 *     found at 0x... ...  (the call that found it, when it is the program's) */
static void say(const finding *f)
{
    text_out o;
    out_init(&o, NULL, NULL);
    out_str(&o, "shardmm debug: ");
    out_str(&o, what(f->error));
    out_str(&o, " ");
    out_hex(&o, (uintptr_t)f->ptr, 0);
    if (f->size != 0 || f->alloc_site != NULL) {
        out_str(&o, " (");
        out_dec(&o, f->size, 0);
        out_str(&o, f->size == 1 ? " byte)" : " bytes)");
    }
    if (f->offset != SIZE_MAX) {
        out_str(&o, f->offset >= f->size ? ": trailer byte " : ": byte ");
        out_dec(&o, f->offset >= f->size ? f->offset - f->size : f->offset, 0);
        out_str(&o, " is ");
        out_hex(&o, f->value, 2);
    }
    out_str(&o, "\n");
    if (f->alloc_site != NULL) {
        out_str(&o, "  allocated at ");
        debugmode_out_site(&o, f->alloc_site);
        out_str(&o, "\n");
    }
    if (f->free_site != NULL) {
        out_str(&o, "  freed at ");
        debugmode_out_site(&o, f->free_site);
        out_str(&o, "\n");
    }
    if (f->now_site != NULL) {
        out_str(&o, "  found at ");
        debugmode_out_site(&o, f->now_site);
        out_str(&o, "\n");
    }
    out_flush(&o);
}

/* Report, then hand to the error hook (which may return: the operation then does nothing). */
static __attribute__((cold, noinline)) void report(const finding *f)
{
    say(f);
    error_invalid_pointer(f->error, f->ptr);
}

static finding finding_of(int error, dbg_header *h, void *now_site)
{
    finding f = {error, user_of(h), h->size, h->alloc_site, NULL, now_site, SIZE_MAX, 0};
    if (h->state == STATE_FREED)
        f.free_site = h->free_site;
    return f;
}

static __attribute__((cold, noinline)) void report_invalid(int error, const void *p, void *now_site)
{
    finding f = {error, (void *)p, 0, NULL, NULL, now_site, SIZE_MAX, 0};
    report(&f);
}

/* ---- finding and checking a block -------------------------------------------------------------------- */

/* The header of the block the program knows as p, or NULL when p is not one of ours: p is a block of
 * the core's at p - pad, with pad 64 or a power of two above it that divides p (an aligned block). */
static dbg_header *find(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    if ((u & 15) != 0 || u < 4096)
        return NULL;
    for (uintptr_t pad = HEADER; pad < u && (pad == HEADER || (u & (pad - 1)) == 0); pad <<= 1) {
        const void *base = (const void *)(u - pad);
        size_t n = api_usable(base);
        if (n >= pad + TRAILER && (pad == HEADER || *(const uint64_t *)base == pad))
            return header_of(p);
    }
    return NULL;
}

/* The first byte of the n at b that is not `byte`, or n. */
static size_t differs(const unsigned char *b, size_t n, unsigned char byte)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        __builtin_memcpy(&w, b + i, 8);
        if (w != 0x0101010101010101ull * byte)
            break;
    }
    for (; i < n; i++)
        if (b[i] != byte)
            return i;
    return n;
}

/* Whether the header is whole (canary, seal, a known state): 0, or the error kind, filling f. */
static int header_damage(dbg_header *h, void *now_site, finding *f)
{
    if (h->canary != canary_of(h)) {
        *f = finding_of(SHARD_ERROR_OVERFLOW, h, now_site); /* the header's last word: a write before p */
        f->size = 0;
        f->alloc_site = f->free_site = NULL; /* nothing in it can be trusted */
        return f->error;
    }
    if (h->seal != seal_of(h) || (h->state != STATE_LIVE && h->state != STATE_FREED)) {
        *f = finding_of(SHARD_ERROR_HEADER, h, now_site);
        f->size = 0;
        f->alloc_site = f->free_site = NULL;
        return f->error;
    }
    return 0;
}

static int trailer_damage(dbg_header *h, void *now_site, finding *f)
{
    size_t at = differs(user_of(h) + h->size, TRAILER, TRAILER_BYTE);
    if (at == TRAILER)
        return 0;
    *f = finding_of(SHARD_ERROR_OVERFLOW, h, now_site);
    f->offset = h->size + at;
    f->value = user_of(h)[h->size + at];
    return f->error;
}

/* A quarantined block: header, pattern, trailer. */
static int freed_damage(dbg_header *h, void *now_site, finding *f)
{
    if (header_damage(h, now_site, f) || trailer_damage(h, now_site, f))
        return 1;
    size_t at = differs(user_of(h), h->size, FREE_BYTE);
    if (at == h->size)
        return 0;
    *f = finding_of(SHARD_ERROR_WRITE_AFTER_FREE, h, now_site);
    f->offset = at;
    f->value = user_of(h)[at];
    return 1;
}

/* The live block p for a free, realloc or size query (`invalid`: the kind for a pointer that is not one
 * of ours): its header, or NULL after the report. */
static dbg_header *live_block(const void *p, int invalid, void *now_site)
{
    dbg_header *h = find(p);
    if (h == NULL) {
        report_invalid(invalid, p, now_site);
        return NULL;
    }
    finding f;
    if (header_damage(h, now_site, &f)) {
        report(&f);
        return NULL;
    }
    if (h->state == STATE_FREED) {
        f = finding_of(SHARD_ERROR_DOUBLE_FREE, h, now_site);
        report(&f);
        return NULL;
    }
    return h;
}

/* ---- the quarantine ---------------------------------------------------------------------------------- */

static struct {
    spinlock lock;
    dbg_header *oldest, *youngest;
    size_t bytes;
    size_t blocks_of[3], usable_of[3]; /* the blocks waiting by kind (small, medium, large) and the core's
                                        * usable bytes of them: shard_get_stats leaves them out */
} quarantine;

/* The kind of a core block, as the statistics count it: by the memory it lies in. */
static unsigned kind_of(void *base)
{
    unsigned k = segmap_kind((uintptr_t)base);
    return k == SEG_SMALL ? 0 : k == SEG_MEDIUM ? 1 : 2;
}

/* h comes into the quarantine (+1) or leaves it (-1): its kind's tally follows (the caller holds the lock). */
static void tally(dbg_header *h, int sign)
{
    void *base = base_of(h);
    unsigned k = kind_of(base);
    size_t usable = core_usable_size(base);
    quarantine.blocks_of[k] += (size_t)sign;
    quarantine.usable_of[k] += sign > 0 ? usable : -usable;
}

/* The quarantine given up (a damaged block in it): what it held is out of use for good, and counted live. */
static void quarantine_forget(void)
{
    quarantine.oldest = quarantine.youngest = NULL;
    quarantine.bytes = 0;
    mem_zero(quarantine.blocks_of, sizeof quarantine.blocks_of);
    mem_zero(quarantine.usable_of, sizeof quarantine.usable_of);
}

void debugmode_stats(shard_stats *s)
{
    spin_lock(&quarantine.lock);
    size_t *blocks[3] = {&s->live_small, &s->live_medium, &s->live_large};
    size_t *bytes[3] = {&s->live_small_bytes, &s->live_medium_bytes, &s->live_large_bytes};
    for (unsigned k = 0; k < 3; k++) {
        *blocks[k] -= *blocks[k] < quarantine.blocks_of[k] ? *blocks[k] : quarantine.blocks_of[k];
        *bytes[k] -= *bytes[k] < quarantine.usable_of[k] ? *bytes[k] : quarantine.usable_of[k];
    }
    spin_unlock(&quarantine.lock);
}

/* One shard_check at a time: its findings are static (1.5 KB). It is held while the findings are
 * written out, which may block (a full pipe), so a fork does not wait for it: a child's is free. */
static spinlock check_busy;

void debugmode_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&quarantine.lock);
    else
        spin_unlock_for_fork(&quarantine.lock);
}

void debugmode_fork_child(void) { store_release(&check_busy.locked, 0u); }

/* A freed block to the core, after its last check; a damaged one is reported and kept out of use. */
static void release(dbg_header *h, void *now_site)
{
    finding f;
    if (freed_damage(h, now_site, &f)) {
        report(&f);
        return;
    }
    core_free(base_of(h));
}

/* h (freed, filled) waits; the oldest blocks beyond the quarantine's bytes leave it. Without the lock (a
 * fork holds it) or too large to wait, h goes at once. */
static void quarantine_put(dbg_header *h, void *now_site)
{
    size_t limit = options_values.quarantine_bytes;
    if (cost_of(h) > limit || !spin_lock_unless_fork(&quarantine.lock)) {
        release(h, now_site);
        return;
    }
    if (quarantine.youngest != NULL)
        set_next(quarantine.youngest, h); /* h's own link is NULL: a live block's */
    else
        quarantine.oldest = h;
    quarantine.youngest = h;
    quarantine.bytes += cost_of(h);
    tally(h, 1);
    /* The oldest blocks leave, from `leaving` to `last` along their links. A block whose seal fails
     * (its header written to while it waited) leaves last: its link and size cannot be trusted, so the
     * blocks after it stay out of use, unchecked, and the quarantine starts anew. */
    dbg_header *leaving = quarantine.oldest, *last = NULL;
    while (quarantine.bytes > limit && quarantine.oldest != NULL) {
        dbg_header *o = quarantine.oldest;
        last = o;
        if (!sealed(o)) {
            quarantine_forget();
            break;
        }
        quarantine.oldest = o->next;
        if (quarantine.oldest == NULL)
            quarantine.youngest = NULL;
        quarantine.bytes -= cost_of(o);
        tally(o, -1);
    }
    spin_unlock(&quarantine.lock);
    for (dbg_header *o = last != NULL ? leaving : NULL; o != NULL;) { /* checked and freed outside the lock: a
                                                                        * report calls the hook */
        dbg_header *next = o == last ? NULL : o->next; /* sealed: read before the core has the block */
        release(o, NULL);
        o = next;
    }
}

/* ---- allocation and free ----------------------------------------------------------------------------- */

/* A block of size bytes at a multiple of align (a power of two), zeroed if asked, from the thread heaps
 * or from the created heap `in`. */
static void *debug_alloc(size_t size, size_t align, int zero, void *site, shard_heap *in)
{
    size_t pad = align > HEADER ? align : HEADER;
    if (size > SIZE_MAX - pad - TRAILER) {
        os_out_of_memory();
        return NULL;
    }
    size_t total = pad + size + TRAILER;
    void *base;
    if (in != NULL)
        base = align > 16 ? core_heap_malloc_aligned(in, total, align)
                          : zero ? core_heap_calloc(in, 1, total) : core_heap_malloc(in, total);
    else
        base = align > 16 ? core_malloc_aligned(total, align) : zero ? core_calloc(1, total) : core_malloc(total);
    if (base == NULL)
        return NULL;
    dbg_header *h = (dbg_header *)((char *)base + pad - HEADER);
    *(uint64_t *)base = pad;
    h->pad = pad;
    h->next = NULL;
    h->size = size;
    h->alloc_site = site;
    h->free_site = NULL;
    h->state = STATE_LIVE;
    h->created = in != NULL;
    h->seal = seal_of(h);
    h->canary = canary_of(h);
    unsigned char *p = user_of(h);
    if (!zero) /* calloc's come zeroed from the core */
        mem_fill(p, ALLOC_BYTE, size);
    mem_fill(p + size, TRAILER_BYTE, TRAILER);
    return p;
}

/* Free the live block h: its trailer checked, its state made `freed` (once: a second free, from any
 * thread, finds it so), the pattern written, then the quarantine (a created heap's block: the core at
 * once; `in` is the heap shard_heap_free named). */
static void debug_release(dbg_header *h, void *site, shard_heap *in)
{
    finding f;
    if (trailer_damage(h, site, &f)) {
        report(&f);
        return;
    }
    uint32_t live = STATE_LIVE;
    if (!__atomic_compare_exchange_n(&h->state, &live, STATE_FREED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        f = finding_of(SHARD_ERROR_DOUBLE_FREE, h, site);
        report(&f);
        return;
    }
    h->free_site = site;
    mem_fill(user_of(h), FREE_BYTE, h->size);
    if (!h->created)
        quarantine_put(h, site);
    else if (in != NULL)
        core_heap_free(in, base_of(h));
    else
        core_free(base_of(h));
}

static void debug_free(void *p, void *site, shard_heap *in)
{
    if (p == NULL)
        return;
    dbg_header *h = live_block(p, SHARD_ERROR_INVALID_FREE, site);
    if (h != NULL)
        debug_release(h, site, in);
}

/* realloc always moves: a stale pointer to the old block then reads the free pattern. */
static void *debug_realloc(void *p, size_t size, size_t align, void *site, shard_heap *in)
{
    if (p == NULL)
        return debug_alloc(size, align, 0, site, in);
    dbg_header *h = live_block(p, SHARD_ERROR_INVALID_REALLOC, site);
    if (h == NULL)
        return NULL;
    if (size == 0) {
        debug_release(h, site, in);
        return NULL;
    }
    finding f;
    if (trailer_damage(h, site, &f)) {
        report(&f);
        return NULL;
    }
    void *q = debug_alloc(size, align, 0, site, in);
    if (q == NULL)
        return NULL;
    mem_copy(q, p, h->size < size ? h->size : size);
    debug_release(h, site, in);
    return q;
}

static inline int power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

#define CALLER __builtin_return_address(0)

void *shard_malloc(size_t size) { return debug_alloc(size, 16, 0, CALLER, NULL); }

void *shard_calloc(size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        os_out_of_memory();
        return NULL;
    }
    return debug_alloc(total, 16, 1, CALLER, NULL);
}

void shard_free(void *p) { debug_free(p, CALLER, NULL); }

void *shard_realloc(void *p, size_t size) { return debug_realloc(p, size, 16, CALLER, NULL); }

size_t shard_usable_size(const void *p)
{
    if (p == NULL)
        return 0;
    dbg_header *h = find(p);
    finding f;
    if (h == NULL || header_damage(h, CALLER, &f) || h->state != STATE_LIVE) {
        report_invalid(SHARD_ERROR_INVALID_SIZE_QUERY, p, CALLER);
        return 0;
    }
    return h->size;
}

void *shard_malloc_aligned(size_t size, size_t align)
{
    return power_of_two(align) ? debug_alloc(size, align, 0, CALLER, NULL) : NULL;
}

void *shard_realloc_aligned(void *p, size_t size, size_t align)
{
    if (p != NULL && !power_of_two(align))
        return NULL;
    return power_of_two(align) || p == NULL ? debug_realloc(p, size, align, CALLER, NULL) : NULL;
}

void *shard_reallocarray(void *p, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        os_out_of_memory();
        return NULL;
    }
    return debug_realloc(p, total, 16, CALLER, NULL);
}

/* The rest of the family with api.c's semantics (glibc's), each taking its caller as the site. */
enum { EINVAL_ = 22, ENOMEM_ = 12, PAGE_BYTES = 4096 };

int shard_posix_memalign(void **out, size_t align, size_t size)
{
    if (!power_of_two(align) || align % sizeof(void *) != 0)
        return EINVAL_;
    void *p = debug_alloc(size, align, 0, CALLER, NULL);
    if (p == NULL)
        return ENOMEM_;
    *out = p;
    return 0;
}

/* memalign's alignment: below 16 is 16, another is rounded up to a power of two; 0 when none holds it. */
static size_t memalign_align(size_t align)
{
    if (align > SIZE_MAX / 2 + 1) {
        os_invalid_argument();
        return 0;
    }
    size_t a = 16;
    while (a < align)
        a <<= 1;
    return a;
}

void *shard_memalign(size_t align, size_t size)
{
    size_t a = memalign_align(align);
    return a ? debug_alloc(size, a, 0, CALLER, NULL) : NULL;
}

void *shard_aligned_alloc(size_t align, size_t size)
{
    size_t a = memalign_align(align);
    return a ? debug_alloc(size, a, 0, CALLER, NULL) : NULL;
}

void *shard_valloc(size_t size) { return debug_alloc(size, PAGE_BYTES, 0, CALLER, NULL); }

void *shard_pvalloc(size_t size)
{
    if (size > SIZE_MAX - PAGE_BYTES) {
        os_out_of_memory();
        return NULL;
    }
    size_t rounded = (size + PAGE_BYTES - 1) & ~(size_t)(PAGE_BYTES - 1);
    return debug_alloc(rounded ? rounded : PAGE_BYTES, PAGE_BYTES, 0, CALLER, NULL);
}

/* ---- created heaps ----------------------------------------------------------------------------------- */

void *shard_heap_malloc(shard_heap *heap, size_t size) { return debug_alloc(size, 16, 0, CALLER, heap); }

void *shard_heap_calloc(shard_heap *heap, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        os_out_of_memory();
        return NULL;
    }
    return debug_alloc(total, 16, 1, CALLER, heap);
}

void *shard_heap_malloc_aligned(shard_heap *heap, size_t size, size_t align)
{
    return power_of_two(align) ? debug_alloc(size, align, 0, CALLER, heap) : NULL;
}

void *shard_heap_realloc(shard_heap *heap, void *p, size_t size) { return debug_realloc(p, size, 16, CALLER, heap); }

void shard_heap_free(shard_heap *heap, void *p) { debug_free(p, CALLER, heap); }

/* No quarantined block belongs to a created heap, so destroy and reset need nothing of this layer. */
void shard_heap_destroy(shard_heap *heap) { core_heap_destroy(heap); }
void shard_heap_reset(shard_heap *heap) { core_heap_reset(heap); }

/* ---- visits, the checker, the leak report ------------------------------------------------------------ */

/* The live block a core block holds (its header whole and `live`), or NULL. */
static dbg_header *live_in(void *base, size_t usable)
{
    uint64_t pad = *(uint64_t *)base;
    if (pad < HEADER || pad + TRAILER > usable || (pad != HEADER && !power_of_two(pad)))
        return NULL;
    dbg_header *h = (dbg_header *)((char *)base + pad - HEADER);
    if (h->canary != canary_of(h) || h->seal != seal_of(h) || h->state != STATE_LIVE || h->pad != pad ||
        h->size > usable - pad - TRAILER)
        return NULL;
    return h;
}

typedef struct user_visit {
    shard_visit_fn fn;
    void *arg;
    size_t count; /* the program's blocks given to fn */
} user_visit;

static int visit_user(void *arg, void *block, size_t usable, int kind)
{
    user_visit *v = arg;
    dbg_header *h = live_in(block, usable);
    if (h == NULL)
        return 0;
    v->count++;
    return v->fn(v->arg, user_of(h), h->size, kind);
}

size_t shard_visit(unsigned scope, shard_visit_fn fn, void *arg)
{
    user_visit v = {fn, arg, 0};
    core_visit(scope, visit_user, &v);
    return v.count;
}

size_t shard_heap_visit(shard_heap *heap, shard_visit_fn fn, void *arg)
{
    user_visit v = {fn, arg, 0};
    core_heap_visit(heap, visit_user, &v);
    return v.count;
}

void *debugmode_alloc_site(const void *block)
{
    dbg_header *h = header_of(block);
    return h->canary == canary_of(h) ? h->alloc_site : NULL;
}

/* The checker's findings, written after the walk (a visit's callback must not call out). */
#define FINDINGS_SHOWN 16
typedef struct findings {
    size_t count;
    finding f[FINDINGS_SHOWN];
} findings;

static void add(findings *all, const finding *f)
{
    if (all->count < FINDINGS_SHOWN)
        all->f[all->count] = *f;
    all->count++;
}

/* A live core block: its header (if it has the shape of one of ours) and trailer. */
static int check_live(void *arg, void *base, size_t usable, int kind)
{
    (void)kind;
    uint64_t pad = *(uint64_t *)base;
    if (pad < HEADER || pad + TRAILER > usable || (pad != HEADER && !power_of_two(pad)))
        return 0; /* a quarantined block's first word may be anything: its check is the quarantine's */
    dbg_header *h = (dbg_header *)((char *)base + pad - HEADER);
    finding f;
    if (h->state == STATE_FREED)
        return 0;
    if (header_damage(h, NULL, &f) || (h->size <= usable - pad - TRAILER && trailer_damage(h, NULL, &f)))
        add(arg, &f);
    return 0;
}

/* The quarantine's damaged blocks into *all, following only links that a seal vouches for (the caller
 * holds the quarantine's lock). */
static void quarantine_check(findings *all)
{
    for (dbg_header *h = quarantine.oldest; h != NULL; h = sealed(h) ? h->next : NULL) {
        finding f;
        if (freed_damage(h, NULL, &f))
            add(all, &f);
    }
}

void debugmode_at_exit(void)
{
    /* The blocks still waiting in the quarantine are checked once more: a write after free that no later
     * free pushed out is reported at exit rather than never. If any is damaged the quarantine is given up
     * (the process ends; its blocks stay out of use), so that a hook that returns, and frees, finds each
     * damaged block reported once. Reported outside the lock (a hook may free). */
    static findings found;
    found.count = 0;
    spin_lock(&quarantine.lock);
    quarantine_check(&found);
    if (found.count != 0)
        quarantine_forget();
    spin_unlock(&quarantine.lock);
    for (size_t i = 0; i < found.count && i < FINDINGS_SHOWN; i++)
        report(&found.f[i]);
}

int shard_check(void)
{
    static findings all; /* one check at a time (check_busy) */
    spin_lock(&check_busy);
    all.count = 0;
    int problems = core_check();
    core_visit(SHARD_VISIT_ALL, check_live, &all);
    spin_lock(&quarantine.lock);
    quarantine_check(&all);
    spin_unlock(&quarantine.lock);
    for (size_t i = 0; i < all.count && i < FINDINGS_SHOWN; i++)
        say(&all.f[i]);
    problems += (int)all.count;
    spin_unlock(&check_busy);
    return problems;
}

#endif
