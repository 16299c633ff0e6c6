-- tables.lua - a Lua workload for tests/preload: tables of every size (Lua grows them with realloc),
-- strings built piece by piece, closures, coroutines, and full and incremental collections. Lua's
-- pairs() order depends on string hashes (seeded per process) and on addresses, so what is printed
-- never follows it: sums, sorted keys and counts only.
local state = 42
local function random(n) -- a deterministic generator, 0 .. n - 1
  state = (state * 1103515245 + 12345) % 2147483648
  return state % n
end

local function digest(s) -- a 32-bit FNV-1a of a string
  local h = 2166136261
  for i = 1, #s, 7 do -- every 7th byte: strings here run to megabytes
    h = ((h ~ s:byte(i)) * 16777619) & 0xffffffff
  end
  return string.format("%08x", h)
end

-- Tables: arrays and hashes grown and emptied, nested tables, many short-lived ones.
local sum, keys_total = 0, 0
for round = 1, 30 do
  local t = {}
  for i = 1, 5000 + round * 200 do
    t[i] = { id = i, name = "n" .. i, vals = { i, i * 2, i * 3 } }
  end
  local h = {}
  for i = 1, #t, 3 do
    h["k" .. (i * round)] = t[i]
  end
  for k, v in pairs(h) do
    sum = sum + v.vals[3] + #k
    keys_total = keys_total + 1
  end
  for i = #t, 1, -2 do
    table.remove(t, i)
  end
  sum = sum + #t
end
print("tables", sum, keys_total)

-- Strings: concatenation in a buffer table, gsub, rep above 1 MB, formatting.
local parts = {}
for i = 1, 120000 do
  parts[#parts + 1] = string.format("%d:%x;", i, random(1 << 20))
end
local s = table.concat(parts)
local replaced, n = s:gsub("(%d+):", "<%1>")
local big = string.rep("abc", 1000000) .. s
local upper = big:upper()
local words = {}
for w in s:gmatch("%x+;") do
  words[#words + 1] = w
end
table.sort(words)
print("strings", #s, #replaced, n, #big, digest(upper), #words, words[1], words[#words])

-- Closures: counters that capture their own upvalues, kept in tables, called many times.
local function counter(start, step)
  local value = start
  return function()
    value = value + step
    return value
  end
end
local counters = {}
for i = 1, 20000 do
  counters[i] = counter(i, i % 7 + 1)
end
local total = 0
for _ = 1, 10 do
  for i = 1, #counters do
    total = total + counters[i]()
  end
end
counters = nil
print("closures", total)

-- Coroutines: producers that yield tables and strings to a consumer.
local function producer(seed)
  return coroutine.wrap(function()
    for i = 1, 3000 do
      coroutine.yield({ seed = seed, i = i, text = string.rep("z", (seed * i) % 500) })
    end
    return nil
  end)
end
local gens, got = {}, 0
for k = 1, 8 do
  gens[k] = producer(k)
end
local alive = #gens
while alive > 0 do
  alive = 0
  for k = 1, #gens do
    local item = gens[k] and gens[k]()
    if item then
      got = got + #item.text + item.i
      alive = alive + 1
    else
      gens[k] = nil
    end
  end
end
print("coroutines", got)

-- Collections: cyclic garbage, weak tables, full and step-wise collection.
local weak = setmetatable({}, { __mode = "k" })
local kept = {}
for i = 1, 50000 do
  local a, b = {}, {}
  a.other, b.other = b, a
  a.payload = string.rep("p", i % 300)
  weak[a] = i
  if i % 1000 == 0 then
    kept[#kept + 1] = a
  end
end
collectgarbage("collect")
local weak_left = 0
for _ in pairs(weak) do
  weak_left = weak_left + 1
end
collectgarbage("incremental")
for i = 1, 200 do
  local tmp = {}
  for j = 1, 500 do
    tmp[j] = tostring(i * j)
  end
  collectgarbage("step", 10)
end
collectgarbage("generational")
for i = 1, 100000 do
  local tmp = { i, tostring(i) }
  if i % 10000 == 0 then
    kept[#kept + 1] = tmp
  end
end
collectgarbage("collect")
print("gc", weak_left, #kept)
