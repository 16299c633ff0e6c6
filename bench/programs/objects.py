"""bench/programs/objects.py - Python objects, dicts and strings, run by bench/programs.py.

Usage: python3 objects.py SCALE. The shape of a web back end's request handling: records made as
instances (with __dict__ and with __slots__), indexed in dicts, rendered to strings with f-strings
and join, parsed back with split, grouped, sorted, and half of them dropped and made again round
after round, so freed blocks of every size are reused. Deterministic: prints the record and
group counts and a SHA-256 of everything rendered, the same under every allocator.
"""
import hashlib
import sys


class User:
    def __init__(self, uid, name, email, tags):
        self.uid = uid
        self.name = name
        self.email = email
        self.tags = tags
        self.visits = {}


class Point:
    __slots__ = ("x", "y", "label")

    def __init__(self, x, y, label):
        self.x, self.y, self.label = x, y, label


def make_user(i):
    name = f"user{i:07d}-" + "abcdefghij"[: i % 11]
    return User(i, name, f"{name}@example{i % 97}.org", [f"tag{(i * j) % 53}" for j in range(i % 6)])


def render(user):
    visits = ",".join(f"{k}={v}" for k, v in user.visits.items())
    return f"{user.uid}|{user.name}|{user.email}|{' '.join(user.tags)}|{visits}"


def parse(line):
    uid, name, email, tags, visits = line.split("|")
    user = User(int(uid), name, email, tags.split() if tags else [])
    for pair in visits.split(",") if visits else []:
        key, value = pair.split("=")
        user.visits[key] = int(value)
    return user


def main():
    scale = float(sys.argv[1])
    count = max(1, round(25000 * scale))
    digest = hashlib.sha256()
    users = {i: make_user(i) for i in range(count)}
    next_id = count
    groups = 0
    for rnd in range(6):
        for i, user in users.items():
            for k in range((i + rnd) % 4):
                page = f"/page/{(i * 31 + k * 7 + rnd) % 211}"
                user.visits[page] = user.visits.get(page, 0) + 1
        lines = [render(u) for u in users.values()]
        digest.update("\n".join(lines).encode())
        users = {u.uid: u for u in map(parse, lines)}
        by_domain = {}
        for user in users.values():
            by_domain.setdefault(user.email.rsplit("@", 1)[1], []).append(user)
        groups += len(by_domain)
        ranked = sorted(users.values(), key=lambda u: (-sum(u.visits.values()), u.name))
        digest.update(" ".join(u.name for u in ranked[:100]).encode())
        points = [Point(u.uid % 1000, len(u.name), u.name[:6]) for u in ranked]
        digest.update(repr(sum(p.x * p.y for p in points)).encode())
        for uid in [uid for uid in users if (uid + rnd) % 2 == 0]:
            del users[uid]
        for _ in range(count - len(users)):
            users[next_id] = make_user(next_id)
            next_id += 1
    print(len(users), next_id, groups, digest.hexdigest())


main()
