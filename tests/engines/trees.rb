# trees.rb - recursion: binary trees built and walked recursively (a long-lived one of depth 7 + log2 N, then N
# short-lived ones of depth 4 to 10), and a recursive descent over a nested list of lists.
# The host sets N and print (tests/engine.h); trees.lua and trees.js do the same in their languages.
def make(depth)
  return [] if depth == 0
  [make(depth - 1), make(depth - 1)]
end

def count(tree)
  return 1 if tree.empty?
  1 + count(tree[0]) + count(tree[1])
end

def nest(depth, width)
  list = [depth]
  width.times { list << nest(depth - 1, width) } if depth > 0
  list
end

def total(list)
  sum = list[0]
  i = 1
  while i < list.length
    sum += total(list[i])
    i += 1
  end
  sum
end

deep = 7 + Math.log2(N).floor
long = make(deep)
nodes = 0
i = 1
while i <= N
  nodes += count(make(4 + i % 7))
  i += 1
end
puts ["trees", N, count(long), nodes, total(nest(deep - 8, 5))].join("\t")
