-- oom.lua - allocates without bound: strings of about 110 bytes kept in a table, until the engine's
-- memory is refused ("not enough memory"). The host runs it under a heap's limit (tests/test_engines.c).
local t, i = {}, 0
local s = string.rep("x", 100)
while true do
  i = i + 1
  t[i] = s .. i
end
