# objects.py - a Python workload for tests/preload: builds and drops many objects of every size, hands
# objects between threads through queues, forks while threads run, and prints digests that depend only
# on what was computed (never on addresses, timing or the order threads ran in).
import gc
import hashlib
import json
import os
import queue
import random
import re
import threading
import zlib

MB = 1 << 20


def blob(rng, n):
    """n bytes that depend on rng: a random 64-byte unit repeated (fast even for megabytes)."""
    unit = rng.randbytes(64)
    return (unit * (n // 64 + 1))[:n]


def size_of_kind(rng):
    """Mostly small sizes, some medium ones, a few above 1 MB (shardmm's three kinds of block)."""
    r = rng.random()
    if r < 0.80:
        return rng.randrange(0, 512)
    if r < 0.97:
        return rng.randrange(512, 300_000)
    return rng.randrange(MB, 6 * MB)


def make_object(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return {"k%d" % i: rng.randrange(1000) for i in range(rng.randrange(40))}
    if kind == 1:
        return [rng.randrange(1 << 30) for _ in range(rng.randrange(200))]
    if kind == 2:
        return "s" * rng.randrange(3000) + str(rng.random())
    if kind == 3:
        return blob(rng, size_of_kind(rng))
    if kind == 4:
        b = bytearray()
        for _ in range(rng.randrange(1, 12)):  # appends: realloc growing the buffer
            b += blob(rng, rng.randrange(1, 200_000))
        return b
    if kind == 5:
        return tuple(str(rng.randrange(100)) for _ in range(rng.randrange(30)))
    return {rng.randrange(500) for _ in range(rng.randrange(60))}


def summary(obj):
    """A digest of an object's value (sets sorted: their order is not part of the value)."""
    if isinstance(obj, (bytes, bytearray)):
        data = bytes(obj)
    elif isinstance(obj, set):
        data = repr(sorted(obj)).encode()
    elif isinstance(obj, str):
        data = obj.encode()
    else:
        data = json.dumps(obj, sort_keys=True).encode()
    return hashlib.sha256(type(obj).__name__.encode() + data).digest()


def churn(seed, rounds, per_round):
    """Objects with mixed lifetimes: each round makes new ones and drops a random part of the pool."""
    rng = random.Random(seed)
    h = hashlib.sha256()
    pool = []
    for _ in range(rounds):
        for _ in range(per_round):
            pool.append(make_object(rng))
        rng.shuffle(pool)
        keep = len(pool) // 3
        for obj in pool[keep:]:
            h.update(summary(obj))
        del pool[keep:]
    for obj in pool:
        h.update(summary(obj))
    return h.hexdigest()[:16]


def threads_and_queues():
    """Two producers make objects, two consumers digest and drop them: most objects are freed by a
    thread other than the one that allocated them. Each consumer also hands a reply back."""
    work = queue.Queue(maxsize=64)
    replies = queue.Queue()
    results = {}
    lock = threading.Lock()

    def producer(p):
        rng = random.Random(100 + p)
        for i in range(600):
            work.put((p, i, make_object(rng)))

    def consumer(c):
        mine = {}
        while True:
            item = work.get()
            if item is None:
                break
            p, i, obj = item
            d = summary(obj)
            mine[(p, i)] = d
            replies.put(bytearray(d) * 100)  # made here, dropped by the main thread
            del obj, item
        with lock:
            results.update(mine)

    producers = [threading.Thread(target=producer, args=(p,)) for p in range(2)]
    consumers = [threading.Thread(target=consumer, args=(c,)) for c in range(2)]
    for t in producers + consumers:
        t.start()
    total = 0
    while any(t.is_alive() for t in producers) or not work.empty():
        try:
            total += len(replies.get(timeout=0.01))
        except queue.Empty:
            pass
    for t in producers:
        t.join()
    for _ in consumers:
        work.put(None)
    for t in consumers:
        t.join()
    while not replies.empty():
        total += len(replies.get())
    h = hashlib.sha256()
    for key in sorted(results):
        h.update(repr(key).encode() + results[key])
    return "%d items, %d reply bytes, %s" % (len(results), total, h.hexdigest()[:16])


def fork_while_threads_run(shared):
    """Fork several times while two threads allocate; each child digests the parent's objects (made by
    the main thread and by a worker), allocates a little, and sends the digest back through a pipe."""
    stop = threading.Event()

    def worker(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            objs = [make_object(rng) for _ in range(20)]
            del objs

    workers = [threading.Thread(target=worker, args=(s,)) for s in (7, 8)]
    for t in workers:
        t.start()
    answers = []
    for n in range(6):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            h = hashlib.sha256()
            for obj in shared:
                h.update(summary(obj))
            extra = churn(1000 + n, 3, 40)
            os.write(w, (h.hexdigest()[:16] + " " + extra).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            answer = f.read().decode()
        _, status = os.waitpid(pid, 0)
        answers.append("%s exit %d" % (answer, os.waitstatus_to_exitcode(status)))
    stop.set()
    for t in workers:
        t.join()
    return answers


def big_buffers():
    rng = random.Random(5)
    text = " ".join("word%d" % rng.randrange(5000) for _ in range(400_000))
    words = re.findall(r"word(\d+)", text)
    packed = zlib.compress(text.encode(), 6)
    back = zlib.decompress(packed).decode()
    doc = {"rows": [{"id": i, "name": "n%d" % i, "tags": ["t%d" % (i % 7)] * (i % 5)} for i in range(40_000)]}
    encoded = json.dumps(doc)
    decoded = json.loads(encoded)
    grown = b""
    for i in range(40):  # a bytes object copied into ever larger ones, up to several MB
        grown = grown + blob(rng, 150_000)
    ordered = sorted(text.split(), key=lambda s: (len(s), s))
    return "%d words, zlib %d, same %s, json %d rows %d chars, grown %d %s, sorted %s..%s" % (
        len(words), len(packed), back == text, len(decoded["rows"]), len(encoded),
        len(grown), hashlib.sha256(grown).hexdigest()[:12], ordered[0], ordered[-1])


def cycles():
    """Cyclic garbage that only the collector frees."""
    rng = random.Random(9)
    kept = []
    for i in range(20_000):
        a = {"i": i}
        b = [a, "x" * rng.randrange(100)]
        a["b"] = b
        if i % 100 == 0:
            kept.append(a)
    gc.collect()
    return "%d kept, sum %d" % (len(kept), sum(len(k["b"][1]) for k in kept))


def main():
    print("churn", churn(1, 40, 150))
    print("threads", threads_and_queues())
    rng = random.Random(3)
    shared = [make_object(rng) for _ in range(300)]
    holder = []
    t = threading.Thread(target=lambda: holder.extend(make_object(random.Random(4)) for _ in range(300)))
    t.start()
    t.join()
    shared += holder
    for answer in fork_while_threads_run(shared):
        print("fork", answer)
    print("buffers", big_buffers())
    print("cycles", cycles())


main()
