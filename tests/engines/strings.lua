-- strings.lua - N pieces "i:hex;" concatenated one at a time into 4 KB chunks, the chunks joined, the
-- result split into its N words, upper-cased and reversed in slices, hashed.
-- The host sets N and print (tests/engine.h); strings.js and strings.rb do the same in their languages.
local chunks, s = {}, ""
for i = 1, N do
  s = s .. i .. ":" .. string.format("%x", i * 7919) .. ";"
  if #s >= 4096 then chunks[#chunks + 1] = s; s = "" end
end
chunks[#chunks + 1] = s
local all = table.concat(chunks)
local words, letters = 0, 0
for w in string.gmatch(all, "[^;]+") do
  words = words + 1
  letters = letters + #string.upper(w)
end
local slices = {}
for i = 1, #all, 1000 do slices[#slices + 1] = string.reverse(string.sub(all, i, i + 999)) end
local back = table.concat(slices, "|")
local hash = 0
for i = 1, #all, 97 do hash = (hash * 31 + string.byte(all, i)) % 1000000007 end
print("strings", #chunks, #all, words, letters, #back, hash, string.sub(all, 1, 24), string.sub(back, -24))
