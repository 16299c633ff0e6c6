/* error.c - the error hook (see error.h); with SHARDMM_VERBOSE every call of a hook the program set is
 * told on the error channel first. */
#include "error.h"

#include "../include/shardmm.h"
#include "../port/port.h"
#include "libc.h"
#include "options.h"
#include "sync.h"

/* The hook and its argument change together under a lock (setting and reporting are both rare), so a
 * report never pairs one hook with another's argument. */
static struct {
    spinlock lock;
    shard_error_fn fn;
    void *arg;
} error_hook;

static const char *describe(int error)
{
    static const char *const what[] = {"invalid pointer", "invalid pointer passed to shard_free:",
                                       "invalid pointer passed to shard_realloc:",
                                       "invalid pointer passed to shard_usable_size:",
                                       "double free of the block at", "damaged free-list link in the item at",
                                       "write past the end of the block at", "write after free to the block at",
                                       "damaged header of the block at"};
    return what[error >= 1 && error <= SHARD_ERROR_HEADER ? error : 0];
}

static _Noreturn void default_error(int error, void *p)
{
    report_error(describe(error), (uintptr_t)p);
    port_abort();
}

void error_invalid_pointer(int error, void *p)
{
    /* While a fork holds the lock nobody can change the pair: read it as it is. */
    int locked = spin_lock_unless_fork(&error_hook.lock);
    shard_error_fn fn = load_relaxed(&error_hook.fn);
    void *arg = load_relaxed(&error_hook.arg);
    if (locked)
        spin_unlock(&error_hook.lock);
    if (fn == NULL)
        default_error(error, p);
    if (options_values.verbose) /* the default says it anyway; a hook of the program's may say nothing */
        options_say_error_hook(describe(error), p);
    fn(arg, error, p);
}

void error_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&error_hook.lock);
    else
        spin_unlock_for_fork(&error_hook.lock);
}

shard_error_fn shard_set_error_hook(shard_error_fn hook, void *arg)
{
    spin_lock(&error_hook.lock); /* waits, also for a fork: setting a hook is rare */
    shard_error_fn previous = error_hook.fn;
    store_relaxed(&error_hook.fn, hook);
    store_relaxed(&error_hook.arg, arg);
    spin_unlock(&error_hook.lock);
    return previous;
}
