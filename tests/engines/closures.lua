-- closures.lua - N counters, each a closure over its own variable, called in rounds; closures composed
-- 100 deep and called; a memoising closure over a table.
-- The host sets N and print (tests/engine.h); closures.js and closures.rb do the same in their languages.
local function counter(start)
  local c = start
  return function(step) c = c + step; return c end
end
local counters = {}
for i = 1, N do counters[i] = counter(i) end
local sum = 0
for round = 1, 3 do
  for i = 1, N do sum = sum + counters[i](round) end
end
local function compose(f, g) return function(x) return f(g(x)) end end
local function inc(x) return x + 1 end
local composed = 0
for i = 1, N // 100 do
  local f = inc
  for _ = 1, 100 do f = compose(f, inc) end
  composed = composed + f(i)
end
local function memo(fn)
  local cache = {}
  return function(k)
    local v = cache[k]
    if v == nil then v = fn(k); cache[k] = v end
    return v
  end
end
local square = memo(function(k) return {k * k, "sq" .. k} end)
local squares = 0
for i = 1, N do squares = squares + square(i % 1000)[1] + #square(i % 1000)[2] end
print("closures", N, sum, composed, squares)
