-- table.lua - a table of N entries from integers to strings, one from N strings to integers and N records
-- that point at their neighbour; lookups of every key, every other string key removed, checksums.
-- The host sets N and print (tests/engine.h); table.js and table.rb do the same in their languages.
local t, h, recs = {}, {}, {}
for i = 1, N do
  t[i] = "v" .. i
  h["k" .. i] = i * 3
  recs[i] = {id = i, name = t[i], prev = recs[i - 1]}
end
local sum = 0
for i = 1, N do sum = sum + #t[i] + h["k" .. i] + recs[i].id end
for i = 1, N, 2 do h["k" .. i] = nil end
local left, chain = 0, 0
for i = 1, N do
  if h["k" .. i] ~= nil then left = left + 1 end
end
local r = recs[N]
while r ~= nil do chain = chain + 1; r = r.prev end
print("table", N, sum, left, chain, t[N], h["k" .. N], recs[N // 2].name)
