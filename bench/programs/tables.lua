-- bench/programs/tables.lua - Lua tables and string building, run by bench/programs.py.
--
-- Usage: lua5.4 tables.lua SCALE. The shape of a game or configuration script: entities as tables
-- with fields, arrays and nested tables, indexed by name, updated, sorted by keys made as strings,
-- serialised to text with string.format, .. and table.concat, parsed back with string.gmatch, and
-- half of them dropped and made again round after round, leaving the collector garbage of every
-- size. Deterministic (no
-- output depends on the order of pairs): prints the entity count and a checksum of the texts, the
-- same under every allocator.

local scale = tonumber(arg[1]) or 1
local count = math.max(1, math.floor(13000 * scale + 0.5))
local kinds = {"orc", "elf", "dwarf", "troll", "human", "goblin"}

local function make(i)
  local e = {id = i, name = kinds[i % 6 + 1] .. "-" .. i, hp = 50 + i % 70, pos = {x = i % 997, y = i % 463},
             inventory = {}, flags = {}}
  for k = 1, i % 8 do
    e.inventory[k] = {item = "item" .. (i * k) % 101, weight = (i + k) % 13}
  end
  if i % 3 == 0 then e.flags.poisoned = true end
  if i % 5 == 0 then e.flags["quest" .. i % 17] = i % 4 end
  return e
end

local function serialise(e)
  local parts = {}
  for k, it in ipairs(e.inventory) do
    parts[k] = string.format("%s:%d", it.item, it.weight)
  end
  local text = e.id .. ";" .. e.name .. ";" .. e.hp .. ";" .. e.pos.x .. "," .. e.pos.y .. ";"
  return text .. table.concat(parts, " ")
end

local function checksum(sum, s)
  for i = 1, #s, 61 do
    sum = (sum * 31 + s:byte(i)) % 2147483647
  end
  return (sum * 131 + #s) % 2147483647
end

local entities, byname, nextid, sum = {}, {}, count, 0
for i = 1, count do
  entities[i] = make(i)
  byname[entities[i].name] = entities[i]
end

for round = 1, 6 do
  for _, e in ipairs(entities) do
    e.hp = e.hp - (e.id + round) % 9
    e.pos.x, e.pos.y = (e.pos.x + round * 3) % 997, (e.pos.y + e.hp) % 463
    if e.flags.poisoned then e.hp = e.hp - 1 end
  end
  local keys, bykey = {}, {}
  for i, e in ipairs(entities) do
    keys[i] = string.format("%06d:%08d", e.hp + 100000, e.id)
    bykey[keys[i]] = e
  end
  table.sort(keys)
  for i, key in ipairs(keys) do
    entities[i] = bykey[key]
  end
  local lines = {}
  for i, e in ipairs(entities) do
    lines[i] = serialise(e)
  end
  local text = table.concat(lines, "\n")
  sum = checksum(sum, text)
  local parsed, weight = 0, 0
  for id, name, rest in text:gmatch("(%d+);([%w%-]+);[^;]*;[^;]*;([^\n]*)") do
    parsed = parsed + 1
    for w in rest:gmatch(":(%d+)") do
      weight = weight + tonumber(w)
    end
  end
  sum = (sum + parsed * 7 + weight) % 2147483647
  local kept = {}
  for _, e in ipairs(entities) do
    if (e.id + round) % 2 == 0 then
      kept[#kept + 1] = e
    else
      byname[e.name] = nil
    end
  end
  while #kept < count do
    nextid = nextid + 1
    local e = make(nextid)
    kept[#kept + 1] = e
    byname[e.name] = e
  end
  entities = kept
end

local named = 0
for _ in pairs(byname) do named = named + 1 end
print(#entities, named, nextid, sum)
