-- trees.lua - recursion: binary trees built and walked recursively (a long-lived one of depth 7 + log2 N, then N
-- short-lived ones of depth 4 to 10), and a recursive descent over a nested list of lists.
-- The host sets N and print (tests/engine.h); trees.js and trees.rb do the same in their languages.
local function make(depth)
  if depth == 0 then return {} end
  return {make(depth - 1), make(depth - 1)}
end
local function count(tree)
  if tree[1] == nil then return 1 end
  return 1 + count(tree[1]) + count(tree[2])
end
local function nest(depth, width)
  local list = {depth}
  if depth > 0 then for i = 1, width do list[#list + 1] = nest(depth - 1, width) end end
  return list
end
local function total(list)
  local sum = list[1]
  for i = 2, #list do sum = sum + total(list[i]) end
  return sum
end
local deep = 7 + math.floor(math.log(N, 2))
local long = make(deep)
local nodes = 0
for i = 1, N do nodes = nodes + count(make(4 + i % 7)) end
print("trees", N, count(long), nodes, total(nest(deep - 8, 5)))
