/* heap.c - thread heaps: start-up, lazy creation through the port's heap slot, the stack of free
 * heaps, the reserve an exited thread leaves, the heaps of threads that exited without a hook, fork,
 * and the list of all heaps (see heap.h).
 *
 * Start-up and its re-entrancy. Three things are done once per process: the fork hooks are registered
 * (port_caps.fork_hooks) - at load time by a constructor, and again, if that did not run, by the first
 * allocation of any kind, large ones included (fork safety from the first lock the allocator takes) - and
 * the first allocation reads the options (options_read: the port's SHARDMM_ variables, and the
 * process-exit hook when one of them asks for output at exit) and asks for the thread-exit hook
 * (port_caps.thread_exit_hook), in that order, before any heap or large block exists. Reading the options
 * allocates nothing; the hooks may call malloc again from inside: glibc's pthread_atfork mallocs to grow
 * its list (under its own lock, hence the constructor: a first malloc inside another library's
 * pthread_atfork must not register ours), and pthread_setspecific callocs a thread's key array for a key
 * of index 32 or more. So nothing waits for the fork hooks (an allocation made while they are being
 * registered goes on without them), the exit hook is asked for with a call that does not allocate
 * (glibc's pthread_key_create), and a new thread's heap is complete and in the slot before the port arms
 * the exit hook for it: an allocation made from inside the arming finds the heap and uses it. Other
 * threads' first allocations wait for the thread that reads the options and asks for the hook; a fork's
 * child, which does not have that thread, does the start-up again instead (fork_child). That thread
 * itself does not wait: a pthread_key_create that another library wraps may allocate, and the options
 * are read by then (its heap then has no exit hook: found as an exited thread's, below). Without an
 * exit hook (every pthread key of the process taken) the slot still works; the heaps of exited threads
 * are then found as those below. A platform with no hook at all (port_caps) leaves the end of a
 * thread's use of its heap to shard_thread_done.
 *
 * Thread exit (the port's hook, or shard_thread_done) retires the heap: the blocks other threads freed
 * into it are taken in, the only page a class keeps while its thread runs is retired if empty, its
 * segments and arenas left without a live block become spare ones for any thread (segment.h), committed,
 * and the heap keeps a reserve of the free pages of its other segments (SHARD_RESERVE_PAGES: all) and
 * SHARD_RESERVE_ARENAS empty arenas for the next thread that takes it; the rest of its free memory goes
 * back to the OS at once. Only SHARD_RESERVE_HEAPS heaps
 * hold a reserve at a time, and a heap with nothing to keep takes no place: when 500 threads end at once,
 * the reserves of 8 wait for new threads, not of 500 (test_hostile.c's idle-heaps-500 shows the memory a
 * reserve each would hold: bench/results/2026-11-30-quoted-in-code.md). A heap that finds no place
 * gives its small segments with live blocks, and their free pages, to the orphans (small.h), where any
 * thread heap that needs a page takes them. Then the heap goes, whole, onto one of two stacks of free
 * heaps - the warm one if it holds a reserve, else the cold one - and a new thread takes one, warm first,
 * before it makes a new heap: of the warm ones the one that entered first (pop_oldest_warm), of the cold
 * ones the top. Threads that start in rounds so hand each heap on from the first thread to end to the
 * first to start: mimalloc's test-stress ends its threads in the order it starts them, each with more
 * work than the one before, and the top heap, the last one's, went to the smallest thread of the next
 * round, so that every heap grew to the biggest thread's memory (peak 248.5 MB against 221.7,
 * bench/results/2026-12-04-oldest-heap.md). The oldest reserve is also the next to expire. A stack's top
 * is a pointer and a change counter swapped together by cmpxchg16b: a pop that read top A and
 * A->next_free could otherwise succeed after A was popped and pushed again with another next. Heaps are
 * never freed, so reading next_free of a stale top is safe.
 *
 * A thread without a heap whose free lands in a heap that waits in a stack takes that heap, not the top
 * one (heap_claim, from api_free_slow): a thread that carries on an ended thread's work frees that
 * thread's blocks before it allocates (a worker that hands its data to a successor; bench/shapes.c's
 * larson), and so gets the heap they live in: its frees are its own and its allocations fill the pages
 * they empty. Popping the top instead gave each heap the blocks of two threads' work, pages a third
 * full, and larson@8 peaked at 76 MB against 57 (bench/results/2026-12-02-claim.md). The search takes
 * the stacks whole under trim_lock, as a trim does, and costs a thread that only frees nothing while
 * the heaps it frees into have threads; its free of a small block of such a heap takes a heap of its own
 * to gather its frees in (heap_for_frees; small.c, gathered frees). A heap given back by
 * shard_thread_done is not taken so: its thread gave it up on purpose, and its own frees must not take
 * it back.
 *
 * What a waiting heap holds over time. Frees into a heap in a stack gather in its queues of foreign
 * frees, and the first page or arena queued at a heap in a stack sets `heap_reserve_due` a delay ahead
 * (unless an earlier one is set). The stacks are trimmed (trim_stack: taken whole, every heap's queues
 * taken in, then trimmed and put back) at `heap_reserve_due`, which the next slow path of any thread or
 * thread exit after it acts on. Not sooner: the next thread to take the heap takes the frees warm, and a
 * trim before that would decommit what it is about to fault in again (bench/churn.py showed it for a
 * batch trim every 64 queued pages). A heap that entered the stack less than the reserve's delay ago
 * (SHARDMM_DELAY_MS, options.h; SHARD_RESERVE_DELAY_MS by default) keeps its reserve; after that, and at
 * once on shard_collect or under memory pressure, it keeps nothing but its live blocks: segments without
 * a page in use and empty arenas released, the other free pages decommitted, and its small segments that
 * hold live blocks given to the orphans. A thread that finds the
 * stacks empty while they are being trimmed waits for the heaps to come back rather than make a new heap:
 * `trimming` is odd while the stacks are taken, and a pop believes empty tops only when `trimming` was
 * even and unchanged around reading them.
 *
 * Heaps of threads that exited without the hook: a thread whose first allocation runs in the last round
 * of key destructors (its hook was armed too late for glibc to call it), or any thread of a process
 * without a hook. Each heap carries its owner's thread number (`owner`, with a generation against a
 * number seen twice). When a thread would make a new heap and there are already `reclaim_at` heaps,
 * every owned heap's thread is looked up (port_caps.thread_alive); the heap of a thread that no longer
 * lives is taken (a CAS on the owner word), retired as at exit and reused. reclaim_at becomes twice the heaps
 * whose threads live, plus SHARD_RECLAIM_MIN: heaps stay bounded by twice the threads alive at once,
 * and the look-ups, a system call each, cost about one per heap made.
 *
 * Code that runs in a thread after its exit hook (a destructor of thread-local data) may still allocate:
 * the port refuses to arm the hook again (PORT_SLOT_EXITED), so such a thread borrows a heap for each
 * allocation and gives it straight back; its frees are those of a thread without a heap.
 *
 * Fork. The child keeps only the thread that forked, so a lock another thread held at that moment would
 * stay taken in the child forever. The prepare hook takes every lock of the allocator in a fixed order:
 * `trim_lock` (so no trim of the stacks or search for dead threads' heaps is under way), the metadata
 * allocator's, the large-block cache's and the error hook's; the parent and child hooks give them back.
 * Handlers of other libraries registered before ours run between our prepare and our parent/child hooks,
 * on the forking thread, and may allocate and free: the locks are held as SPIN_FORK (sync.h), which the
 * forking thread passes through while `fork_tag` names it. Other threads never wait for a fork's lock
 * (a prepare handler of another library may wait for them): they do without it (sync.h). The stacks of
 * free heaps are lock-free and consistent at any instant, so they are not held. No heap is reclaimed
 * from a dead thread while `fork_tag` is set: in the child, the parent's other threads look dead before
 * fork_child has marked their heaps. In the child the heaps of the parent's other threads stay with
 * their blocks and may be in the middle of a change: they are marked as no thread's (PORT_THREAD_NONE)
 * and never reused; the child can use and free their blocks (its frees go to those heaps' queues, which
 * no thread drains: that memory stays with the child until it exits). The forking thread's heap gets the
 * child's thread number.
 */
#include "heap.h"
#include "debugmode.h"

#include "../port/port.h"
#include "error.h"
#include "large.h"
#include "libc.h"
#include "options.h"

/* The stacks of free heaps (ptr: heap *, count: changes): those that hold a reserve, which a new thread
 * takes first, and the others. */
static pair128 stacks[2];
enum { STACK_WARM, STACK_COLD };
static heap *all_heaps;          /* pushed with a CAS, never popped */
static uint32_t heaps_made;      /* the length of all_heaps */
static uint32_t reclaim_at = SHARD_RECLAIM_MIN; /* heaps_made from which a new heap looks for dead threads' */
uint32_t heap_start_done;        /* heap_start has run (heap.h) */
static uint32_t fork_hooks_state; /* 0 not registered, 1 being registered, 2 done (or refused) */
static uint32_t exit_hook_state;  /* 0 not asked for, 1 being asked for, 2 done (with or without a hook) */
static uintptr_t start_maker;     /* os_thread_tag() of the thread that set exit_hook_state to 1, or 0 */
uint64_t heap_reserve_due;       /* os_clock_ms() when the stack is due for a trim; 0: not due */
static uint32_t trimming;        /* odd while the stacks are taken whole (trim, check): +1 at take, at put back */
static spinlock trim_lock;       /* one trim or check of the stacks, or search for dead threads' heaps, at a time */
static uint32_t reserves_held;   /* heaps in the warm stack (at most SHARD_RESERVE_HEAPS) */
static uintptr_t fork_tag;       /* os_thread_tag() of the thread in the middle of fork(), or 0 */

/* ---- owners ----------------------------------------------------------------------------------------- */

static uint64_t owner_word(uint64_t old, uint32_t thread) { return ((old >> 32) + 1) << 32 | thread; }

static void set_owner(heap *h, uint32_t thread)
{
    store_release(&h->owner, owner_word(load_relaxed(&h->owner), thread));
}

/* ---- the stacks of free heaps ------------------------------------------------------------------- */

/* The top as two plain loads: a torn pair only makes the following cmpxchg16b fail and retry. */
static pair128 read_top(pair128 *stack)
{
    pair128 top;
    top.count = load_relaxed(&stack->count);
    top.ptr = load_relaxed(&stack->ptr);
    return top;
}

/* Push the chain first .. last (linked by next_free) onto a stack. The link is stored as an atomic: a
 * pop may read it from a stale top at any time (pop_free_heap). */
static void push_chain(pair128 *stack, heap *first, heap *last)
{
    pair128 old = read_top(stack), desired;
    do {
        store_relaxed(&last->next_free, (heap *)old.ptr);
        desired.ptr = first;
        desired.count = old.count + 1;
    } while (!cas128(stack, &old, desired));
}

static pair128 *stack_of(const heap *h) { return &stacks[h->reserve_held ? STACK_WARM : STACK_COLD]; }

/* h goes onto its stack as it is, no thread's. From the push on h is any thread's to take: the caller
 * reads nothing of it afterwards. Returns whether frees of other threads wait in its queues, taken in
 * by no one until a trim (see retire). */
static int give_back(heap *h)
{
    h->retired_at = os_clock_ms();
    set_owner(h, 0);
    /* The owner word, then the queues; a foreign free pushes onto a queue, then reads the owner word:
     * one of the two sees the other (heap_foreign_queued). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int queued = load_relaxed(&h->delayed) != NULL || load_relaxed(&h->delayed_arenas) != NULL;
    push_chain(stack_of(h), h, h);
    return queued;
}

/* Take a stack whole, its last heap and the one before that (NULL: fewer than two). */
static heap *take_one(pair128 *stack, heap **last, heap **before)
{
    pair128 old = read_top(stack);
    while (!cas128(stack, &old, (pair128){NULL, old.count + 1})) {
    }
    *last = old.ptr;
    *before = NULL;
    while (*last != NULL && load_relaxed(&(*last)->next_free) != NULL) {
        *before = *last;
        *last = load_relaxed(&(*last)->next_free);
    }
    return old.ptr;
}

/* Take both stacks whole, as one list, the warm heaps first (NULL when both are empty); `trimming` makes
 * new threads wait for them meanwhile, not make heaps. Under trim_lock. */
static heap *take_stack(void)
{
    (void)counted(__atomic_fetch_add(&trimming, 1u, __ATOMIC_ACQ_REL));
    heap *warm_last, *cold_last, *unused;
    heap *warm = take_one(&stacks[STACK_WARM], &warm_last, &unused);
    heap *cold = take_one(&stacks[STACK_COLD], &cold_last, &unused);
    if (warm == NULL)
        return cold;
    store_relaxed(&warm_last->next_free, cold); /* links are atomics: a stale pop may read them (try_pop) */
    return warm;
}

/* Put the heaps of take_stack back, each onto the stack its reserve says, in their order. */
static void put_back_stack(heap *first)
{
    heap *head[2] = {NULL, NULL}, *tail[2] = {NULL, NULL};
    for (heap *h = first, *next; h != NULL; h = next) {
        next = load_relaxed(&h->next_free);
        int s = h->reserve_held ? STACK_WARM : STACK_COLD;
        store_relaxed(&h->next_free, (heap *)NULL); /* atomics: a stale pop may read them (try_pop) */
        if (tail[s] != NULL)
            store_relaxed(&tail[s]->next_free, h);
        else
            head[s] = h;
        tail[s] = h;
    }
    for (int s = 0; s < 2; s++)
        if (head[s] != NULL)
            push_chain(&stacks[s], head[s], tail[s]);
    (void)counted(__atomic_fetch_add(&trimming, 1u, __ATOMIC_RELEASE));
}

/* The top heap of a stack, or NULL when it is empty. */
static heap *try_pop(pair128 *stack)
{
    pair128 old = read_top(stack);
    while (old.ptr != NULL) {
        /* A stale top's next_free may be changing under a push (heaps are never freed, so the read is
         * safe); the CAS then fails on the change counter. */
        pair128 desired = {load_relaxed(&((heap *)old.ptr)->next_free), old.count + 1};
        if (cas128(stack, &old, desired))
            return old.ptr;
    }
    return NULL;
}

/* The warm heap that entered the stack first, taken out of it; NULL when the stack is empty. The stack is
 * taken whole under trim_lock (at most SHARD_RESERVE_HEAPS heaps to walk) and the rest pushed back in
 * their order; while trim_lock is busy (a trim, a claim, a fork), the top, as a plain pop. */
static heap *pop_oldest_warm(void)
{
    if (!spin_try_lock(&trim_lock))
        return try_pop(&stacks[STACK_WARM]);
    (void)counted(__atomic_fetch_add(&trimming, 1u, __ATOMIC_ACQ_REL)); /* pops wait meanwhile */
    heap *last, *before, *first = take_one(&stacks[STACK_WARM], &last, &before);
    if (before != NULL) {
        store_relaxed(&before->next_free, (heap *)NULL); /* atomics: a stale pop may read them (try_pop) */
        push_chain(&stacks[STACK_WARM], first, before);
    }
    (void)counted(__atomic_fetch_add(&trimming, 1u, __ATOMIC_RELEASE));
    spin_unlock(&trim_lock);
    return last;
}

/* A free heap: the one that has held a reserve longest, else any; NULL when there is none. */
static heap *pop_free_heap(void)
{
    for (unsigned i = 0;; i++) {
        uint32_t seq = load_acquire(&trimming);
        heap *h = read_top(&stacks[STACK_WARM]).ptr != NULL ? pop_oldest_warm() : NULL;
        if (h == NULL)
            h = try_pop(&stacks[STACK_COLD]);
        if (h != NULL)
            return h;
        __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the tops are read before `trimming` again */
        if ((seq & 1) == 0 && load_relaxed(&trimming) == seq)
            return NULL; /* empty, and not because a trim or check had taken them */
        pause_or_yield(i); /* the heaps are being trimmed and come back soon */
    }
}

/* ---- trimming ------------------------------------------------------------------------------------ */

/* Take the blocks other threads freed into h (pages and arenas they emptied are seen empty then). */
static void drain(heap *h)
{
    small_flush_gathered(h);
    small_settle(h);
    if (load_relaxed(&h->delayed) != NULL)
        small_drain_delayed(h, 0);
    if (load_relaxed(&h->delayed_arenas) != NULL)
        medium_drain_delayed(h);
}

/* Take in what other threads freed into h, then keep `pages` free pages and `arenas` empty arenas and
 * give back the rest now. With `idle` (no thread runs on h) the empty page a class keeps while its
 * thread runs is retired too. */
static void trim_to(heap *h, unsigned pages, unsigned arenas, int idle)
{
    drain(h);
    small_keep(h, pages, idle);
    medium_keep(h, arenas);
}

/* Everything h holds but its live blocks goes back: segments and arenas left empty first (released
 * whole, without a decommit of each of their pages first), then the other free pages and empty arenas. */
static void trim_all(heap *h, int idle)
{
    trim_to(h, UINT32_MAX, UINT32_MAX, idle); /* the queues taken in, the class pages kept retired */
    small_release_empty(h, 0);
    medium_release_empty(h, 0);
    small_keep(h, 0, 0);
    medium_keep(h, 0);
    if (idle)
        small_orphan_give(h); /* its segments with live blocks serve any thread (small.h) */
}

static int has_reserve(const heap *h) { return h->free_count > 0 || h->empty_arena_count > 0; }

/* Set the due time unless an earlier one is set. */
static void arm_due(uint64_t due)
{
    uint64_t old = load_relaxed(&heap_reserve_due);
    while ((old == 0 || (int64_t)(due - old) < 0) && !cas_acq_rel(&heap_reserve_due, &old, due)) {
    }
}

/* h no longer holds a reserve (it expired, or a thread takes h): its place among the reserves is free. */
static void drop_reserve(heap *h)
{
    if (h->reserve_held) {
        h->reserve_held = 0;
        (void)counted(__atomic_fetch_sub(&reserves_held, 1u, __ATOMIC_RELAXED));
    }
}

/* Trim every heap in the stacks: its queues taken in, then its reserve kept while it is younger than the
 * delay, nothing but live blocks after it, without a reserve, or with `all`. Under trim_lock. */
static void trim_stack(int all)
{
    heap *first = take_stack();
    uint64_t now = os_clock_ms(), due = 0;
    for (heap *h = first; h != NULL; h = h->next_free) {
        if (all || !h->reserve_held || (int64_t)(now - h->retired_at) >= options_values.reserve_delay_ms) {
            drop_reserve(h);
            trim_all(h, 1);
        } else {
            trim_to(h, SHARD_RESERVE_PAGES, SHARD_RESERVE_ARENAS, 1);
            if (!has_reserve(h))
                drop_reserve(h);
            else if (due == 0 || (int64_t)(h->retired_at - (due - options_values.reserve_delay_ms)) < 0)
                due = h->retired_at + options_values.reserve_delay_ms;
        }
        debug_check_heap(h, "heap in the free stack inconsistent after trimming it");
    }
    put_back_stack(first);
    if (due != 0)
        arm_due(due);
}

void heap_reserve_expire(uint64_t due)
{
    if ((int64_t)(os_clock_ms() - due) < 0)
        return;
    if (!cas_acq_rel(&heap_reserve_due, &due, 0)) /* one thread trims */
        return;
    uint64_t spare_due = segment_spare_expire(os_clock_ms(), options_values.reserve_delay_ms);
    if (spare_due != 0)
        arm_due(spare_due);
    if (!spin_try_lock(&trim_lock)) {
        arm_due(due); /* another trim or search is under way; this one is left for the next tick */
        return;
    }
    trim_stack(0);
    spin_unlock(&trim_lock);
    uint64_t orphan_due = small_orphan_expire(os_clock_ms());
    if (orphan_due != 0)
        arm_due(orphan_due);
    uint64_t pool_due = small_pool_expire(os_clock_ms());
    if (pool_due != 0)
        arm_due(pool_due);
    uint64_t created_due = created_reserve_expire(os_clock_ms());
    if (created_due != 0)
        arm_due(created_due);
}

void heap_arm_reserve_due(uint64_t due) { arm_due(due); }

void heap_foreign_queued(heap *h)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the push onto h's queue, then its owner (give_back) */
    if (OWNER_THREAD(load_relaxed(&h->owner)) != 0)
        return; /* a thread has it and takes its queues in on its own slow paths */
    arm_due(os_clock_ms() + options_values.reserve_delay_ms);
}

/* ---- heaps of exited threads -------------------------------------------------------------------- */

/* h's segments and arenas without a live block become spare ones, committed, for whichever heap needs
 * one next (segment.h), and their expiry is armed (heap_reserve_expire). */
static void spare_empty(heap *h)
{
    if (small_release_empty(h, 1) + medium_release_empty(h, 1) != 0)
        arm_due(os_clock_ms() + options_values.reserve_delay_ms);
}

/* h keeps nothing but its live blocks: its small segments that hold some go to the orphans with their
 * free pages, committed, for any thread (small.h), and everything else goes back. */
static void keep_only_live(heap *h)
{
    small_orphan_give(h);
    trim_all(h, 1);
}

/* The end of a thread's use of h, without the look at the due time (heap_retire adds it): a reserve
 * while fewer than SHARD_RESERVE_HEAPS heaps in the stacks hold one, else nothing but its live blocks.
 * A trim is armed when h keeps memory or frees of other threads wait in its queues. */
static void retire(heap *h)
{
    large_spare_drain(h); /* into the cache, where any thread finds it */
    /* First its empty segments and arenas become spare ones, committed, for whichever heap needs one
     * next (segment.h); what stays is in segments that still hold live blocks. */
    trim_to(h, UINT32_MAX, UINT32_MAX, 1); /* the queues taken in, the class pages kept retired */
    small_pool_leave(h); /* its pages in the pool: its own free pages again, so that its segments may go */
    spare_empty(h);
    if (counted(__atomic_fetch_add(&reserves_held, 1u, __ATOMIC_RELAXED)) < SHARD_RESERVE_HEAPS) {
        h->reserve_held = 1;
        small_keep(h, SHARD_RESERVE_PAGES, 0);
        medium_keep(h, SHARD_RESERVE_ARENAS);
    } else {
        (void)counted(__atomic_fetch_sub(&reserves_held, 1u, __ATOMIC_RELAXED));
        keep_only_live(h);
    }
    int reserve = has_reserve(h);
    if (!reserve)
        drop_reserve(h); /* nothing was left to keep: the place is another heap's */
    debug_check_heap(h, "heap inconsistent as its thread ends");
    uint64_t now = os_clock_ms();
    /* After the push: a trim that takes the due from now on takes the stack after the push, so h is
     * trimmed either by the trim that consumes an earlier due or by the one this sets. */
    if (give_back(h) || reserve)
        arm_due(now + options_values.reserve_delay_ms);
}

/* Every heap whose thread no longer lives is retired onto the stack (see the file comment). Under
 * trim_lock. */
static void reclaim_dead(void)
{
    /* Inside fork(), the child's handlers run before ours can mark the parent's other threads' heaps as
     * no one's (fork_child), and those threads are gone from the child: their heaps would look dead, and
     * may be in the middle of a change. None is reclaimed until the fork's handlers are done. */
    if (load_acquire(&fork_tag) != 0)
        return;
    uint32_t live = 0;
    for (heap *h = load_acquire(&all_heaps); h != NULL; h = h->next_all) {
        uint64_t w = load_acquire(&h->owner);
        uint32_t thread = OWNER_THREAD(w);
        if (thread == 0)
            continue;
        if (thread == PORT_THREAD_NONE || os_thread_alive(thread)) {
            live++;
            continue;
        }
        if (cas_acq_rel(&h->owner, &w, owner_word(w, 0))) /* the heap is ours alone now */
            retire(h);
    }
    store_relaxed(&reclaim_at, 2 * live + SHARD_RECLAIM_MIN);
}

void heap_retire(heap *h)
{
    retire(h);
    heap_reserve_tick();
    large_cache_expire();
}

/* ---- the slot ------------------------------------------------------------------------------------- */

#if SHARD_SLOT == PORT_SLOT_TLS && !SHARD_ASM
__thread heap *heap_slot __attribute__((tls_model("initial-exec"))) = &heap_none;
#elif SHARD_SLOT == PORT_SLOT_GLOBAL
heap *heap_slot = &heap_none;
#endif

/* Store h (NULL: none) in the calling thread's slot (heap.h). 0, or -1 when the platform has no slot. */
static int slot_store(heap *h)
{
#if SLOT_HOLDS_HEAP_NONE
    heap_slot = h != NULL ? h : &heap_none;
    return 0;
#elif SHARD_SLOT == PORT_SLOT_TEB
    return port_heap_slot_store(h);
#else
    *(heap **)port_heap_slot_address() = h;
    return 0;
#endif
}

/* Ask for the exit hook at this thread's exit, for h (NULL: no longer). 0, -1 or PORT_SLOT_EXITED. */
static int slot_arm(heap *h) { return port_caps.thread_exit_arm != NULL ? port_caps.thread_exit_arm(h) : 0; }

static void heap_exit_hook(void *arg)
{
    slot_store(NULL);
    heap_retire(arg);
}

void heap_thread_done(void)
{
    heap *h = heap_mine();
    if (h == NULL)
        return;
    slot_store(NULL);
    slot_arm(NULL); /* disarms the exit hook: the heap goes back here, once */
    store_relaxed(&h->thread_done, 1u); /* given back on purpose: the thread's frees leave it waiting */
    heap_retire(h);
}

/* The heaps of dead threads reclaimed, then the stack trimmed to nothing but live blocks; skipped while
 * another thread's fork holds the stacks. */
static void empty_stack(void)
{
    if (!spin_lock_unless_fork(&trim_lock))
        return;
    reclaim_dead();
    trim_stack(1);
    spin_unlock(&trim_lock);
}

void heap_collect(void)
{
    heap *h = heap_mine();
    if (h != NULL) {
        small_pool_reclaim(h);
        trim_to(h, SHARD_KEEP_FREE_PAGES, 1, 0);
    }
    empty_stack();
    /* Every lent page home, and the waiting heaps trimmed again: their guests' pages, which the first
     * trim sent home, and those of the pool, let their segments go (small.h, lent pages). */
    small_pool_expire(UINT64_MAX);
    empty_stack();
    small_orphan_expire(UINT64_MAX);
    created_reserve_expire(UINT64_MAX);
    segment_spare_expire(UINT64_MAX, 0);
}

int heap_relieve(void)
{
    os_totals before, after;
    os_get_totals(&before);
    large_cache_release_all();
    heap *h = heap_mine();
    if (h != NULL) {
        small_pool_reclaim(h);
        trim_all(h, 0);
    }
    empty_stack();
    /* Every lent page home, and the waiting heaps trimmed again: their guests' pages, which the first
     * trim sent home, and those of the pool, let their segments go (small.h, lent pages). */
    small_pool_expire(UINT64_MAX);
    empty_stack();
    small_orphan_expire(UINT64_MAX);
    created_reserve_expire(UINT64_MAX);
    segment_spare_expire(UINT64_MAX, 0);
    os_get_totals(&after);
    return after.reserved < before.reserved || after.committed < before.committed;
}

int heap_check_stack(void)
{
    int problems = 0;
    if (!spin_lock_unless_fork(&trim_lock))
        return 0; /* a fork holds the stacks: nothing to check now */
    heap *first = take_stack();
    for (heap *h = first; h != NULL; h = h->next_free)
        problems += heap_check(h);
    put_back_stack(first);
    spin_unlock(&trim_lock);
    return problems + small_orphan_check();
}

void heap_visit_stack(visitor *v)
{
    if (!spin_lock_unless_fork(&trim_lock))
        return; /* a fork holds the stacks: nothing to walk now */
    heap *first = take_stack();
    for (heap *h = first; h != NULL && !v->stop; h = h->next_free) {
        small_visit(h, v);
        if (!v->stop)
            medium_visit(h, v);
    }
    put_back_stack(first);
    spin_unlock(&trim_lock);
    if (!v->stop)
        small_orphan_visit(v);
}

/* ---- fork ---------------------------------------------------------------------------------------- */

int spin_fork_passes(void)
{
    uintptr_t tag = load_acquire(&fork_tag);
    return tag != 0 && tag == os_thread_tag();
}

/* 1 when the calling thread is the one in the middle of the start-up (exit_hook_state 1). Without a
 * thread tag (os_thread_tag's 1 for every thread) no thread is told apart: 0. */
static int starting_here(void)
{
    uintptr_t me = os_thread_tag();
    return me != 1 && load_relaxed(&start_maker) == me;
}

static void fork_prepare(void)
{
#if SHARD_FULL_DEBUG
    debugmode_lock_for_fork(1); /* never held around a call of the core's */
#endif
    created_lock_for_fork(1); /* first: it is held around calls that take the others (engine.c) */
    spin_lock_for_fork(&trim_lock);
    small_orphan_lock_for_fork(1); /* after trim_lock: a retire under it gives segments to the orphans */
    small_pool_lock_for_fork(1);   /* after both: a heap that takes an orphan segment may lend its pages */
    meta_lock_for_fork(1);
    large_lock_for_fork(1);
    error_lock_for_fork(1);
    segment_spare_lock_for_fork(1); /* after trim_lock: a retire under it puts spare segments */
    store_release(&fork_tag, os_thread_tag());
}

static void fork_unlock(void)
{
    store_release(&fork_tag, 0);
    segment_spare_lock_for_fork(0);
    error_lock_for_fork(0);
    large_lock_for_fork(0);
    meta_lock_for_fork(0);
    small_pool_lock_for_fork(0);
    small_orphan_lock_for_fork(0);
    spin_unlock_for_fork(&trim_lock);
    created_lock_for_fork(0);
#if SHARD_FULL_DEBUG
    debugmode_lock_for_fork(0);
#endif
}

static void fork_parent(void) { fork_unlock(); }

/* In the child: the forking thread's heap is this thread's; every other heap a thread had is no one's. */
static void fork_child(void)
{
    heap *mine = heap_mine();
    uint32_t me = os_thread_id();
    for (heap *h = load_acquire(&all_heaps); h != NULL; h = h->next_all) {
        uint32_t thread = OWNER_THREAD(load_relaxed(&h->owner));
        if (h == mine)
            set_owner(h, me);
        else if (thread != 0)
            set_owner(h, PORT_THREAD_NONE);
    }
    segment_after_fork();
    /* A start-up another thread had under way (heap_start; it takes no lock, so a fork may come at any
     * point of it) would be waited for for ever: the child does it again (reading the options and asking
     * for the exit hook twice is harmless: a second pthread key at most). */
    if (load_acquire(&exit_hook_state) == 1 && !starting_here()) {
        store_relaxed(&start_maker, (uintptr_t)0);
        store_release(&exit_hook_state, 0u);
    }
#if SHARD_FULL_DEBUG
    debugmode_fork_child();
#endif
    fork_unlock();
}

/* ---- start-up ------------------------------------------------------------------------------------ */

static void register_fork_hooks(void)
{
    uint32_t expected = 0;
    if (load_acquire(&fork_hooks_state) != 0 || !cas_acq_rel(&fork_hooks_state, &expected, 1u))
        return; /* done, or being done: nobody waits for it (see the file comment) */
    if (port_caps.fork_hooks != NULL) /* refused: nothing else can be done */
        port_caps.fork_hooks(fork_prepare, fork_parent, fork_child);
    store_release(&fork_hooks_state, 2u);
}

/* At load time, where constructors run: before any other library's pthread_atfork can hold glibc's lock
 * around a first malloc. */
__attribute__((constructor)) static void heap_at_load(void) { register_fork_hooks(); }

void heap_start(void)
{
    register_fork_hooks();
    uint32_t state = load_acquire(&exit_hook_state);
    while (state != 2) {
        uint32_t expected = 0;
        if (state == 0 && cas_acq_rel(&exit_hook_state, &expected, 1u)) {
            store_relaxed(&start_maker, os_thread_tag());
            options_read(); /* before the first heap or large block; it allocates nothing */
            large_start();
            if (port_caps.thread_exit_hook != NULL) /* -1: no hook; reclaim_dead finds exited threads' heaps */
                port_caps.thread_exit_hook(heap_exit_hook);
            store_relaxed(&start_maker, (uintptr_t)0);
            store_release(&exit_hook_state, 2u);
            break;
        }
        if (starting_here())
            return; /* an allocation from inside the hook's call: the options are read, the outer call ends */
        cpu_pause(); /* another thread asks for it: a call that does not allocate, so it ends soon */
        state = load_acquire(&exit_hook_state);
    }
    store_release(&heap_start_done, 1u);
}

/* ---- heaps --------------------------------------------------------------------------------------- */

heap heap_none = {
    .direct = {[0 ... SHARD_DIRECT_COUNT - 1] = &small_empty_page},
    .own = {[0] = 1},
};

heap *heap_new(uint32_t thread)
{
    heap *h = meta_alloc(sizeof(heap));
    if (h == NULL)
        return NULL;
    set_owner(h, thread);
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        h->direct[i] = &small_empty_page;
    h->own[0] = 1; /* no segment lies at 1: a pointer below 4 MB finds no own segment */
    heap *head = load_relaxed(&all_heaps);
    do {
        h->next_all = head;
    } while (!cas_release(&all_heaps, &head, h));
    h->colour = fetch_add_relaxed(&heaps_made, 1u) % SHARD_SEGMENT_COLOURS;
    return h;
}

/* The calling thread takes h, a heap it took out of a stack. */
static void take_over(heap *h)
{
    set_owner(h, os_thread_id()); /* before its queues are taken in: frees from now on leave them to us */
    h->segments_made = h->arenas_made = 0; /* its growth is the new thread's */
    h->loose_skip = 0;
    store_relaxed(&h->thread_done, 0u);
    drop_reserve(h);                /* the reserve is this thread's now */
    trim_to(h, UINT32_MAX, UINT32_MAX, 1); /* what was freed into it while it waited; nothing goes back */
}

/* A heap for the calling thread, owned by it: one from the stack, one of a thread that no longer lives,
 * or a new one. */
static heap *acquire(void)
{
    heap *h = pop_free_heap();
    if (h == NULL && load_relaxed(&heaps_made) >= load_relaxed(&reclaim_at) && spin_try_lock(&trim_lock)) {
        reclaim_dead();
        spin_unlock(&trim_lock);
        h = pop_free_heap();
    }
    if (h == NULL)
        return heap_new(os_thread_id());
    take_over(h);
    return h;
}

heap *heap_get_or_create(int *lent)
{
    heap *h = heap_mine();
    if (h != NULL)
        return h;
    heap_started();
    h = acquire();
    if (h == NULL)
        return NULL;
    /* h is complete and in the slot before the hook is armed: an allocation from inside the arming
     * (port.h) uses it. */
    int armed = slot_store(h) != 0 ? -1 : slot_arm(h);
    if (armed != 0) {
        slot_store(NULL);
        if (armed == PORT_SLOT_EXITED) {
            *lent = 1;
            return h;
        }
        give_back(h); /* the thread could not own it */
        return NULL;
    }
    return h;
}

heap *heap_for_frees(void)
{
    /* A heap without a reserve first; then as any new thread takes one, so that no more heaps are made
     * than threads run at once. */
    heap *h = try_pop(&stacks[STACK_COLD]);
    if (h != NULL)
        take_over(h);
    else if ((h = acquire()) == NULL)
        return NULL;
    /* It keeps nothing but the gathering: a thread that only frees would neither allocate from its free
     * memory nor take in what others free into its segments. So, as a heap that finds no reserve place
     * at its retirement, its empty segments and arenas become spare ones, its other small segments the
     * orphans', and its free pages go back. */
    if (h->segments != NULL || h->arenas != NULL) {
        spare_empty(h);
        keep_only_live(h);
    }
    if (slot_store(h) != 0 || slot_arm(h) != 0) { /* past its exit hook it would hold the heap for good */
        slot_store(NULL);
        give_back(h);
        return NULL;
    }
    return h;
}

heap *heap_claim_unowned(heap *want)
{
    /* Not an embedder's or the orphans (in no stack), nor one given back on purpose. */
    if (want->created || small_is_orphans(want) || load_relaxed(&want->thread_done))
        return NULL;
    if (slot_arm(NULL) == PORT_SLOT_EXITED || !spin_try_lock(&trim_lock))
        return NULL; /* past its exit hook it would hold the heap for good; a trim or fork holds the stacks */
    heap *list = take_stack(), *prev = NULL, *h = list;
    while (h != NULL && h != want) {
        prev = h;
        h = load_relaxed(&h->next_free);
    }
    if (h != NULL && load_relaxed(&h->thread_done))
        h = NULL; /* read again now that the push that put it here is seen */
    if (h != NULL) { /* out of the list; the rest goes back in its order */
        heap *next = load_relaxed(&h->next_free);
        if (prev != NULL)
            store_relaxed(&prev->next_free, next);
        else
            list = next;
        store_relaxed(&h->next_free, (heap *)NULL);
    }
    put_back_stack(list);
    spin_unlock(&trim_lock);
    if (h == NULL)
        return NULL; /* another thread took it first, or it was on its way into a stack */
    take_over(h);
    if (slot_store(h) != 0 || slot_arm(h) != 0) { /* as in heap_get_or_create */
        slot_store(NULL);
        give_back(h);
        return NULL;
    }
    return h;
}

int heap_check(heap *h)
{
    int problems = 0;
    size_t segments = 0, entered = 0, all_cold = 0;
    for (segment *s = h->segments; s != NULL; s = s->next, segments++) {
        problems += insist(s->owner == h && segmap_kind((uintptr_t)s) == SEG_SMALL,
                           "heap: a segment with a wrong owner or map entry:", s);
        uint32_t slot = (uint32_t)(uintptr_t)s >> SEGMENT_SHIFT;
        entered += h->own[slot] == (uintptr_t)s;
        problems += insist(h->own[slot] != 0 || slot == 0, "heap: a segment missing from its free own-segment entry:", s);
        unsigned full = 0;
        unsigned lent = 0;
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            const page *pg = (const page *)((const uint8_t *)s + i * PAGE_DESC_SIZE);
            if (pg->state == PAGE_LENT) { /* its guest's, or the pool's: checked there (small.h, lent pages) */
                lent++;
                continue;
            }
            problems += small_check_page(pg);
            all_cold += pg->state == PAGE_COLD;
            full += pg->state == PAGE_IN_USE && pg->full ? page_span(pg) : 0;
        }
        problems += insist(s->full_pages == full, "heap: a segment's count of full pages is wrong:", s);
        problems += insist(s->lent == lent, "heap: a segment's count of lent pages is wrong:", s);
    }
    /* Every own-segment entry is one of these segments (entry 0 holds 1), each at most once. */
    size_t entries = 0;
    for (size_t i = 1; i < HEAP_OWN_SLOTS; i++)
        entries += h->own[i] != 0;
    problems += insist(h->own[0] == 1 && entries == entered && entered <= segments,
                       "heap: the own-segment table differs from the heap's segments; entries:", entries);
    int runs = OWNER_THREAD(load_relaxed(&h->owner)) != 0; /* else its frees must queue (small.h) */
    uint32_t guests = 0;
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++)
        for (const page *pg = h->classes[cls].first; pg != NULL; pg = pg->next) {
            int guest = pg->state == PAGE_LENT; /* another segment's page lent to h (small.h) */
            guests += (uint32_t)guest;
            problems += insist((guest ? load_relaxed(&pg->lend) == LEND_GUEST && load_relaxed(&pg->guest_of) == h
                                      : pg->state == PAGE_IN_USE && segment_of(pg)->owner == h) &&
                                   pg->cls == cls && !pg->full && pg->used >= 0 &&
                                   pg->sole == (h->classes[cls].first == h->classes[cls].last),
                               "heap: a page in the wrong class list, or its only-page mark wrong:", pg);
            if (guest)
                problems += small_check_page(pg);
            problems += insist(runs || !(load_relaxed(&pg->thread_free) & THREAD_FREE_LAZY),
                               "heap: a lazy page in a heap no thread runs:", pg);
        }
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++) {
        const page *first = h->classes[class_by_size16[i]].first;
        problems += insist(h->direct[i] == (first ? first : &small_empty_page),
                           "heap: a page-per-size entry differs from its class's first page, size index", i);
    }
    problems += medium_check(h); /* each failure reported by its rule */
    unsigned free_pages = 0, cold_pages = 0;
    for (const page *pg = h->free_pages.first; pg != NULL; pg = pg->next, free_pages++)
        problems += insist(pg->state == PAGE_FREE, "heap: a page in the free pages that is not free:", pg);
    for (const page *pg = h->cold_pages.first; pg != NULL; pg = pg->next, cold_pages++)
        problems += insist(pg->state == PAGE_COLD && segment_of(pg)->owner == h && (pg->next == NULL || pg->next->prev == pg),
                           "heap: a page in the cold pages that is not cold or not linked back:", pg);
    problems += insist(free_pages == h->free_count, "heap: the free page count differs from its list:", h->free_count);
    problems += insist(h->loose_skip <= SHARD_LOOSE_SKIP_MAX, "heap: more pages to keep out of full_ring than the most:",
                       h->loose_skip);
    for (unsigned i = 0; i < SHARD_LOOSE_AFTER; i++) {
        const page *pg = h->full_ring[i];
        int own = pg == NULL;
        for (const segment *s = h->segments; s != NULL && !own; s = s->next)
            own = segment_of(pg) == s;
        problems += insist(own, "heap: a recent full page of a segment that is not the heap's:", pg);
    }
    problems += insist(cold_pages == all_cold, "heap: the cold pages listed differ from the segments' cold pages:", cold_pages);
    for (const page *pg = h->guest_full.first; pg != NULL; pg = pg->next, guests++) {
        problems += insist(pg->state == PAGE_LENT && load_relaxed(&pg->lend) == LEND_GUEST &&
                               load_relaxed(&pg->guest_of) == h && pg->full &&
                               (pg->next == NULL || pg->next->prev == pg),
                           "heap: a page in the full guest pages that is not a full page lent to the heap:", pg);
        problems += small_check_page(pg);
    }
    problems += insist(guests == h->guests, "heap: the count of pages lent to the heap differs from its lists:",
                       guests);
    return problems;
}

heap *heap_all(void) { return load_acquire(&all_heaps); }

size_t heap_free_count(void)
{
    size_t all = 0, n = 0;
    for (heap *h = heap_all(); h != NULL; h = h->next_all)
        all++;
    /* The links change under a concurrent pop and push: never count more than there are heaps. */
    for (int s = 0; s < 2; s++)
        for (heap *h = read_top(&stacks[s]).ptr; h != NULL && n < all; h = load_relaxed(&h->next_free))
            n++;
    return n;
}
