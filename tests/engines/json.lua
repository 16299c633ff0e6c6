-- json.lua - N records (numbers, strings with characters to escape, arrays, nested objects) encoded as
-- JSON by a recursive encoder (keys sorted, so the text does not depend on the hash order), then the text
-- scanned back into a count of its values.
-- The host sets N and print (tests/engine.h); json.js and json.rb do the same in their languages.
local escapes = {['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\t'] = '\\t'}
local function quote(s) return '"' .. string.gsub(s, '[%c"\\]', escapes) .. '"' end

local encode
local function encode_into(v, out)
  local ty = type(v)
  if ty == "table" then
    if v[1] ~= nil or next(v) == nil then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode_into(v[i], out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = quote(k)
        out[#out + 1] = ":"
        encode_into(v[k], out)
      end
      out[#out + 1] = "}"
    end
  elseif ty == "string" then
    out[#out + 1] = quote(v)
  elseif ty == "nil" then
    out[#out + 1] = "null"
  else
    out[#out + 1] = tostring(v)
  end
end
encode = function(v) local out = {}; encode_into(v, out); return table.concat(out) end

local records = {}
for i = 1, N do
  records[i] = {
    id = i,
    name = "user" .. i,
    note = (i % 10 == 0) and 'says "hi"\tand\\leaves\n' or "plain",
    tags = {"t" .. (i % 7), "t" .. (i % 11), "t" .. (i % 13)},
    score = i * 0.25,
    active = i % 3 == 0,
    nested = {a = i, b = {i, i + 1, {deep = "x" .. i}}},
  }
end
local text = encode({count = N, records = records})
local values = 0
for _ in string.gmatch(text, '[:%[,]') do values = values + 1 end
local hash = 0
for i = 1, #text, 61 do hash = (hash * 31 + string.byte(text, i)) % 1000000007 end
print("json", N, #text, values, hash, string.sub(text, 1, 72))
