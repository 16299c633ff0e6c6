/* error.c - the error hook (see error.h). */
#include "error.h"

#include "../include/shardmm.h"
#include "../port/port.h"
#include "libc.h"
#include "sync.h"

static struct {
    shard_error_fn fn;
    void *arg;
} error_hook;

static _Noreturn void default_error(int error, void *p)
{
    static const char *const what[] = {"invalid pointer", "invalid pointer passed to shard_free:",
                                       "invalid pointer passed to shard_realloc:",
                                       "invalid pointer passed to shard_usable_size:"};
    report_error(what[error >= 1 && error <= 3 ? error : 0], (uintptr_t)p);
    port_abort();
}

void error_invalid_pointer(int error, void *p)
{
    shard_error_fn fn = load_acquire(&error_hook.fn);
    if (fn == NULL)
        default_error(error, p);
    fn(load_relaxed(&error_hook.arg), error, p);
}

shard_error_fn shard_set_error_hook(shard_error_fn hook, void *arg)
{
    store_relaxed(&error_hook.arg, arg);
    return __atomic_exchange_n(&error_hook.fn, hook, __ATOMIC_ACQ_REL);
}
