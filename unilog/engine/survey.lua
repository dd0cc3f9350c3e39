-- Streams' survey, sent by unilog/engine/survey.py (Survey.survey; loaded there as package data): what `unilog
-- status`, the exporter and the dashboard read of each stream, for many streams in one call instead of some ten round
-- trips per stream. On a cluster the caller sends one call per hash slot (a stream's keys share its slot).
-- KEYS, four per stream: the stream, its retention registry, its settings hash, its dead letters.
-- ARGV[1]: how many entries a count reads at most (a longer range is counted on by the caller); then per stream, in
-- KEYS' order: how many ids follow, and those ids, after each of which the entries to the stream's end are counted.
-- Reply, per stream: {length, first id, last id, dead letters, partitions, {registered name, id, ...},
--   {{group, consumers, pending, last delivered id, oldest pending id, entries after it, first of them}, ...},
--   {entries after the first id, first of them, entries after the second, ...}} (a missing id: false, a nil reply).
local page = tonumber(ARGV[1])
local function after(stream, id)
  local found = redis.call('XRANGE', stream, '(' .. id, '+', 'COUNT', page)
  return #found, found[1] and found[1][1] or false
end
local function survey(stream, registry, meta, letters, ids)
  local counts, groups, first, last, length = {}, {}, false, false, 0
  local exists = redis.call('EXISTS', stream) == 1
  if exists then
    length = redis.call('XLEN', stream)
    local head, tail = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1), redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
    first, last = head[1] and head[1][1] or false, tail[1] and tail[1][1] or false
    for _, raw in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local g = {}
      for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
      local oldest = false
      if g['pending'] > 0 then oldest = redis.call('XPENDING', stream, g['name'])[2] end
      local n, id = after(stream, g['last-delivered-id'])
      groups[#groups + 1] = {g['name'], g['consumers'], g['pending'], g['last-delivered-id'], oldest, n, id}
    end
  end
  for _, id in ipairs(ids) do
    local n, next_id = 0, false
    if exists then n, next_id = after(stream, id) end
    counts[#counts + 1] = n
    counts[#counts + 1] = next_id
  end
  return {length, first, last, redis.call('XLEN', letters), redis.call('HGET', meta, 'partitions'),
          redis.call('HGETALL', registry), groups, counts}
end
local replies, at = {}, 2
for j = 1, #KEYS / 4 do
  local n, ids = tonumber(ARGV[at]), {}
  for i = 1, n do ids[i] = ARGV[at + i] end
  at = at + n + 1
  local k = 4 * (j - 1)
  replies[j] = survey(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ids)
end
return replies
