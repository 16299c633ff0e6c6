# closures.rb - N counters, each a closure over its own variable, called in rounds; closures composed
# 100 deep and called; a memoising closure over a table.
# The host sets N and print (tests/engine.h); closures.lua and closures.js do the same in their languages.
def counter(start)
  c = start
  ->(step) { c += step }
end
counters = []
i = 1
while i <= N
  counters << counter(i)
  i += 1
end
sum = 0
round = 1
while round <= 3
  counters.each { |f| sum += f.call(round) }
  round += 1
end
def compose(f, g)
  ->(x) { f.call(g.call(x)) }
end
inc = ->(x) { x + 1 }
composed = 0
i = 1
while i <= N / 100
  f = inc
  100.times { f = compose(f, inc) }
  composed += f.call(i)
  i += 1
end
def memo(&fn)
  cache = {}
  ->(k) { cache[k] ||= fn.call(k) }
end
square = memo { |k| [k * k, "sq#{k}"] }
squares = 0
i = 1
while i <= N
  squares += square.call(i % 1000)[0] + square.call(i % 1000)[1].length
  i += 1
end
puts ["closures", N, sum, composed, squares].join("\t")
