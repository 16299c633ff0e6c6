-- abandon.lua - N strings of about 110 bytes and N small tables kept in a global, then an error that
-- ends the script there: the host drops the engine without closing it (tests/test_engines.c).
kept = {}
local s = string.rep("y", 100)
for i = 1, N do kept[i] = {s .. i, i} end
error("abandoned after " .. N .. " entries")
