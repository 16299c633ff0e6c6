"""bench/programs/roundtrip.py - a Python JSON round trip, run by bench/programs.py.

Usage: python3 roundtrip.py SCALE. The shape of a service that takes JSON in and gives JSON out: a
document of orders (nested dicts, lists, strings, floats) is made, dumped, loaded, changed (items
added and dropped, totals computed, strings rebuilt), dumped again with indentation and sorted
keys, and loaded again, round after round; each round's document replaces the last. Deterministic:
prints the order count, the total and a SHA-256 of the last text, the same under every allocator.
"""
import hashlib
import json
import sys

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def make_order(i):
    return {
        "id": i,
        "customer": {"name": f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]}", "city": WORDS[(i * 3) % 10].upper(),
                     "tier": i % 4},
        "items": [{"sku": f"SKU-{(i * 13 + k) % 9973:05d}", "qty": 1 + (i + k) % 5,
                   "price": round(1.25 + ((i * 37 + k * 11) % 400) / 4, 2)} for k in range(1 + i % 7)],
        "note": " ".join(WORDS[(i + k) % 10] for k in range(i % 13)),
        "paid": i % 3 != 0,
    }


def main():
    scale = float(sys.argv[1])
    count = max(1, round(8000 * scale))
    text = json.dumps({"orders": [make_order(i) for i in range(count)]})
    total = 0.0
    for rnd in range(4):
        doc = json.loads(text)
        orders = [o for o in doc["orders"] if (o["id"] + rnd) % 5 != 0]
        for o in orders:
            o["total"] = round(sum(it["qty"] * it["price"] for it in o["items"]), 2)
            o["items"].append({"sku": f"ADD-{rnd}-{o['id']}", "qty": 1, "price": 0.5})
            o["note"] = o["note"].replace("a", "A") + f" round {rnd}"
            total += o["total"]
        orders += [make_order(count * (rnd + 1) + i) for i in range(count - len(orders))]
        text = json.dumps({"round": rnd, "orders": orders}, indent=1 if rnd % 2 else None, sort_keys=rnd % 2 == 1)
    doc = json.loads(text)
    print(len(doc["orders"]), f"{total:.2f}", hashlib.sha256(text.encode()).hexdigest())


main()
