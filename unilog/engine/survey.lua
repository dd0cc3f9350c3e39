-- Streams' survey, sent by unilog/engine/survey.py (Survey.survey; loaded there as package data): what `unilog
-- status`, the exporter and the dashboard read of each stream, for many streams in one call instead of some ten round
-- trips per stream. On a cluster the caller sends one call per hash slot (a stream's keys share its slot).
-- KEYS, four per stream: the stream, its retention registry, its settings hash, its dead letters.
-- ARGV[1]: how many entries a count reads at most (a longer range is counted on by the caller); then per stream, in
-- KEYS' order: how many ids follow, and those ids, after each of which the entries to the stream's end are counted.
-- Reply: one flat array for every stream, in KEYS' order (a nested reply costs the caller an object per level per
-- stream): per stream, length, first id, last id, dead letters, partitions, then how many registrations and
-- name, id for each, then how many groups and for each name, consumers, pending, last delivered id, oldest pending
-- id, entries after it, first of them; then for each id asked for, the entries after it and the first of them (a
-- missing id: false, a nil reply).
-- Calls are what Redis spends its time on here (a few microseconds each, per stream): XINFO STREAM reads the length
-- and both ends at once, XINFO GROUPS is asked only of a stream that has groups, and a count whose answer the ends
-- give already (an id at or past the last one, or before the first) reads nothing.
local page = tonumber(ARGV[1])
local out = {}
local function push(...)
  for i = 1, select('#', ...) do out[#out + 1] = (select(i, ...)) end
end
local function after(stream, id)
  local found = redis.call('XRANGE', stream, '(' .. id, '+', 'COUNT', page)
  return #found, found[1] and found[1][1] or false
end
-- -1, 0 or 1 as id a sorts before, with or after id b, both 'ms-seq' of decimal digits (compared as digit strings:
-- a sequence number can pass what a Lua number holds exactly); nil if either is not of that form.
local function digits(x, y)
  if #x ~= #y then return #x < #y and -1 or 1 end
  if x ~= y then return x < y and -1 or 1 end
  return 0
end
local function compare(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if not am or not bm then return nil end
  local by_ms = digits(am, bm)
  if by_ms ~= 0 then return by_ms end
  return digits(as, bs)
end
-- The entries after id and the first of them. Where the ends answer the count (the id at or past the last entry,
-- at or before the first), only the first of them is read: a range's entries cost a few microseconds each.
local function count(stream, length, first, last, id)
  if length == 0 then return 0, false end
  local to_last = compare(id, last)
  if to_last == nil then return after(stream, id) end
  if to_last >= 0 then return 0, false end
  local to_first = compare(id, first)
  if to_first < 0 then return length, first end
  if to_first == 0 then
    local next = redis.call('XRANGE', stream, '(' .. id, '+', 'COUNT', 1)
    return length - 1, next[1][1]
  end
  return after(stream, id)
end
local function groups(stream)
  for _, raw in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local g = {}
    for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
    local oldest = false
    if g['pending'] > 0 then oldest = redis.call('XPENDING', stream, g['name'])[2] end
    local n, id = after(stream, g['last-delivered-id'])
    push(g['name'], g['consumers'], g['pending'], g['last-delivered-id'], oldest, n, id)
  end
end
local function survey(stream, registry, meta, letters, ids)
  local length, first, last, ngroups = 0, false, false, 0
  if redis.call('EXISTS', stream) == 1 then
    local info = redis.call('XINFO', 'STREAM', stream)
    for i = 1, #info, 2 do
      local key, value = info[i], info[i + 1]
      if key == 'length' then length = value
      elseif key == 'groups' then ngroups = value
      elseif key == 'first-entry' and value then first = value[1]
      elseif key == 'last-entry' and value then last = value[1] end
    end
  end
  local registered = redis.call('HGETALL', registry)
  push(length, first, last, redis.call('XLEN', letters), redis.call('HGET', meta, 'partitions'), #registered / 2)
  for i = 1, #registered do out[#out + 1] = registered[i] end
  push(ngroups)
  if ngroups > 0 then groups(stream) end
  for _, id in ipairs(ids) do push(count(stream, length, first, last, id)) end
end
local at = 2
for j = 1, #KEYS / 4 do
  local n, ids = tonumber(ARGV[at]), {}
  for i = 1, n do ids[i] = ARGV[at + i] end
  at = at + n + 1
  local k = 4 * (j - 1)
  survey(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ids)
end
return out
