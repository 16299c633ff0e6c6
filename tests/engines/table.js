// table.js - a table of N entries from integers to strings, one from N strings to integers and N records
// that point at their neighbour; lookups of every key, every other string key removed, checksums.
// The host sets N and print (tests/engine.h); table.lua and table.rb do the same in their languages.
var t = [], h = {}, recs = [];
for (var i = 1; i <= N; i++) {
  t[i] = "v" + i;
  h["k" + i] = i * 3;
  recs[i] = {id: i, name: t[i], prev: recs[i - 1]};
}
var sum = 0;
for (var i = 1; i <= N; i++) sum += t[i].length + h["k" + i] + recs[i].id;
for (var i = 1; i <= N; i += 2) delete h["k" + i];
var left = 0, chain = 0;
for (var i = 1; i <= N; i++) if (h["k" + i] !== undefined) left++;
for (var r = recs[N]; r !== undefined; r = r.prev) chain++;
print("table", N, sum, left, chain, t[N], h["k" + N], recs[Math.floor(N / 2)].name);
