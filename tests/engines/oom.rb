# oom.rb - allocates without bound: strings of about 110 bytes kept in an array, until the engine's
# memory is refused (NoMemoryError). The host runs it under a heap's limit (tests/test_engines.c).
a = []
s = "x" * 100
i = 0
while true
  a << s + i.to_s
  i += 1
end
