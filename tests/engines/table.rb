# table.rb - a table of N entries from integers to strings, one from N strings to integers and N records
# that point at their neighbour; lookups of every key, every other string key removed, checksums.
# The host sets N and print (tests/engine.h); table.lua and table.js do the same in their languages.
t = []
h = {}
recs = []
i = 1
while i <= N
  t[i] = "v#{i}"
  h["k#{i}"] = i * 3
  recs[i] = {id: i, name: t[i], prev: recs[i - 1]}
  i += 1
end
sum = 0
i = 1
while i <= N
  sum += t[i].length + h["k#{i}"] + recs[i][:id]
  i += 1
end
i = 1
while i <= N
  h.delete("k#{i}")
  i += 2
end
left = 0
chain = 0
i = 1
while i <= N
  left += 1 if h.key?("k#{i}")
  i += 1
end
r = recs[N]
while r
  chain += 1
  r = r[:prev]
end
puts ["table", N, sum, left, chain, t[N], h["k#{N}"].inspect, recs[N / 2][:name]].join("\t")
