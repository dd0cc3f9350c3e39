-- One stream's survey, sent by unilog/engine/survey.py (Survey.survey; loaded there as package data): what
-- `unilog status`, the exporter and the dashboard read of a stream, in one call instead of some ten round trips.
-- KEYS[1]: the stream; KEYS[2]: its retention registry; KEYS[3]: its settings hash; KEYS[4]: its dead letters.
-- ARGV[1]: how many entries a count reads at most (a longer range is counted on by the caller); ARGV[2..]: ids
-- after which to count the entries to the stream's end.
-- Reply: {length, first id, last id, dead letters, partitions, {registered name, id, ...},
--         {{group, consumers, pending, last delivered id, oldest pending id, entries after it, first of them}, ...},
--         {entries after ARGV[2], first of them, entries after ARGV[3], ...}} (a missing id: false, a nil reply).
local page = tonumber(ARGV[1])
local function after(id)
  local found = redis.call('XRANGE', KEYS[1], '(' .. id, '+', 'COUNT', page)
  return #found, found[1] and found[1][1] or false
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local counts = {}
  for i = 2, #ARGV do
    counts[#counts + 1] = 0
    counts[#counts + 1] = false
  end
  return {0, false, false, redis.call('XLEN', KEYS[4]), redis.call('HGET', KEYS[3], 'partitions'),
          redis.call('HGETALL', KEYS[2]), {}, counts}
end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local groups = {}
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local g = {}
  for i = 1, #raw, 2 do g[raw[i]] = raw[i + 1] end
  local oldest = false
  if g['pending'] > 0 then
    oldest = redis.call('XPENDING', KEYS[1], g['name'])[2]
  end
  local n, id = after(g['last-delivered-id'])
  groups[#groups + 1] = {g['name'], g['consumers'], g['pending'], g['last-delivered-id'], oldest, n, id}
end
local counts = {}
for i = 2, #ARGV do
  local n, id = after(ARGV[i])
  counts[#counts + 1] = n
  counts[#counts + 1] = id
end
return {redis.call('XLEN', KEYS[1]), first[1] and first[1][1] or false, last[1] and last[1][1] or false,
        redis.call('XLEN', KEYS[4]), redis.call('HGET', KEYS[3], 'partitions'), redis.call('HGETALL', KEYS[2]),
        groups, counts}
